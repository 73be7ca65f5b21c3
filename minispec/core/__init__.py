"""Layer 1, the maths: tensors in, tensors out; no model, no cache.

* [`sampling`][minispec.core.sampling] -- standardized sampling (temperature, top-k, top-p,
  repetition penalty as adjusted distributions);
* [`speculative`][minispec.core.speculative] -- the accept rule, the residual, Algorithm 1's
  ``verify`` for one row and its batched form;
* [`tree`][minispec.core.tree] -- several proposals and draft trees (SpecInfer, Stratos);
* [`theory`][minispec.core.theory] -- closed forms: D_LK, Eq. (1), Theorems 3.8 and 3.11;
* [`stats`][minispec.core.stats] -- what a decoding run counts;
* [`sequence`][minispec.core.sequence] -- one request's bookkeeping: tokens, limits, stop rules,
  its random stream (pure Python and one generator).
"""
