"""Core layer 3, who proposes drafts.

* [`base`][minispec.drafters.base] -- the ``Drafter`` interface: every call the round makes;
* [`model`][minispec.drafters.model] -- the machinery of a drafter with its own model and KV
  cache, and the draft model (``ModelDrafter``) built on it;
* [`ngram`][minispec.drafters.ngram] -- the drafters without a model (``ContextDrafter``): n-gram
  tables and prompt lookup (one-hot ``q``);
* [`trees`][minispec.drafters.trees] -- what the drafters share to draw draft trees.

More drafters (suffix matches, EAGLE heads, the hybrid, dynamic trees) are a wing:
[`minispec.extra_drafters`][minispec.extra_drafters].
"""
