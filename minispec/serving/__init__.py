"""Layer 6, serving: many requests, one batched round per step.

* [`goodput`][minispec.serving.goodput] -- measured step costs and batch-aware ``k``;
* [`scheduler`][minispec.serving.scheduler] -- admission, block reservation, preemption;
* [`engine`][minispec.serving.engine] -- the continuous-batching ``Engine``.
"""
