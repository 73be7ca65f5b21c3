"""The loading wing: models from files, names and the hub, into the core's ``Llama``.

* [`loader`][minispec.loading.loader] -- ``ms.load``: a shipped name (the registry in
  [`minispec.zoo`][minispec.zoo]), a local Hugging Face directory (config.json + safetensors
  only, never pickle) or a hub id; ``fast=True`` packs the weights with the speed wing;
* [`prompts`][minispec.loading.prompts] -- text and chat messages into token ids (the drivers'
  ``DEFAULTS.prompts``), and the end-of-turn token of a chat template.
"""
