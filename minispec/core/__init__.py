"""Core layer 1, the maths: tensors in, tensors out; no model, no cache.

* [`sampling`][minispec.core.sampling] -- standardized sampling (temperature, top-k, top-p,
  repetition penalty as adjusted distributions);
* [`tree`][minispec.core.tree] -- what a round proposes: a chain or a tree of drafts (SpecInfer);
* [`speculative`][minispec.core.speculative] -- the accept rule, the residual, and ``verify``: the
  one walk down a proposal that both drivers run;
* [`theory`][minispec.core.theory] -- closed forms: D_LK, Eq. (1), Theorems 3.8 and 3.11;
* [`stats`][minispec.core.stats] -- what a decoding run counts;
* [`sequence`][minispec.core.sequence] -- one request's bookkeeping: tokens, limits, stop rules,
  its random stream (pure Python and one generator).
"""
