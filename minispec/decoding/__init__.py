"""Core layer 4, decoding: the one speculative round and the single-sequence loop.

* [`runner`][minispec.decoding.runner] -- the round: draft, score in one target forward, roll
  back, emit (both drivers call it), with its collaborators' defaults: the fixed-``k`` policy and
  the eager forward;
* [`request`][minispec.decoding.request] -- requests as both drivers build and check them, and
  what a finished one returns;
* [`loop`][minispec.decoding.loop] -- ``generate`` and ``speculative_generate`` (Algorithm 1).
"""
