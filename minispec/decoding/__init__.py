"""Layer 5, decoding: the one speculative round and the single-sequence loop.

* [`runner`][minispec.decoding.runner] -- the round: draft, verify in one target forward,
  roll back, emit (both drivers call it);
* [`goodput`][minispec.speed.goodput] -- the draft-length policy: each round's ``k`` per
  request, from measured step costs and running acceptance (both drivers use it);
* [`loop`][minispec.decoding.loop] -- ``generate`` and ``speculative_generate`` (Algorithm 1),
  and the checks every request gets.
"""
