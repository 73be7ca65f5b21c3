"""The speed wing: collaborators that make the core run fast, handed to it, never reached for.

The core runs eagerly with a fixed ``k``; this wing provides the two collaborators it can be given
instead ([`defaults`][minispec.speed.defaults] names them for ``adaptive=`` and ``graphs=``, and
``minispec``'s ``__init__`` installs it as the core's
[`DEFAULTS`][minispec.decoding.runner.Defaults]):

* ``policy`` -- [`goodput`][minispec.speed.goodput]: the draft-length policy that chooses each
  round's ``k`` per request from measured step costs and running acceptance; it wraps the round
  and owns every clock (the engine's default);
* ``forward`` -- [`static_step`][minispec.speed.static_step]: the target's (and a draft model's)
  step over static shapes, replayed as CUDA graphs on a GPU by [`graphs`][minispec.speed.graphs]
  (on by default on CUDA);

and a faster model: [`packed`][minispec.speed.packed], every projection packed once for oneDNN
on the CPU (``ms.load(..., fast=True)``; the model's own seams ``qkv``, ``gate_up`` and
``logits`` overridden, the same logits up to float rounding). bf16 is a load option
(``ms.load(..., dtype="bfloat16")``).
"""
