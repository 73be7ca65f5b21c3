"""Layer 3, the machinery: models and their caches; nothing here knows about drafting.

* [`llama`][minispec.models.llama] -- a minimal Llama with explicit positions and tree attention;
* [`kv_cache`][minispec.models.kv_cache] -- the contiguous slotted cache with ``truncate_to``;
* [`block_manager`][minispec.models.block_manager] and
  [`paged_cache`][minispec.models.paged_cache] -- block tables, ``slot_mapping``, truncation that
  frees tail blocks;
* [`packed`][minispec.speed.packed] -- the same model with weights packed once for the CPU;
* [`eagle_head`][minispec.extra_drafters.eagle_head] -- an EAGLE-style head on the target's features;
* [`loader`][minispec.loading.loader] -- Hugging Face checkpoints (safetensors only) and names;
* [`chat`][minispec.decoding.prompt] -- chat templates.
"""
