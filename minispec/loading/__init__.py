"""The loading wing: models from files, names and the hub, into the core's ``Llama``.

* [`loader`][minispec.loading.loader] -- ``ms.load``: a shipped name (the registry in
  [`minispec.zoo`][minispec.zoo]), a local Hugging Face directory (config.json + safetensors
  only, never pickle) or a hub id; ``fast=True`` packs the weights with the speed wing.
"""
