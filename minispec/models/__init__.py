"""Core layer 2, the machinery: a model and its caches; nothing here knows about drafting.

* [`llama`][minispec.models.llama] -- a minimal Llama with explicit positions and tree attention,
  and ``eager_forward``, the core's ``forward``;
* [`kv_cache`][minispec.models.kv_cache] -- the contiguous slotted cache with ``truncate_to``;
* [`block_manager`][minispec.models.block_manager] and
  [`paged_cache`][minispec.models.paged_cache] -- block tables, ``slot_mapping``, truncation that
  frees tail blocks.
"""
