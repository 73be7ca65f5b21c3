"""Core layer 5, serving: many requests, one batched round per step.

* [`scheduler`][minispec.serving.scheduler] -- admission, block reservation, preemption;
* [`engine`][minispec.serving.engine] -- the continuous-batching ``Engine``.
"""
