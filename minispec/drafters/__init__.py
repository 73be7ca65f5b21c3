"""Layer 4, who proposes drafts.

* [`base`][minispec.drafters.base] -- the ``Drafter`` base class (every hook the drivers call:
  ``propose(seqs, shapes)`` for chains and trees alike) and a draft model (``ModelDrafter``);
* [`ngram`][minispec.drafters.ngram] -- the drafters without a model (``ContextDrafter``): n-gram
  tables and prompt lookup (one-hot ``q``);
* [`suffix`][minispec.extra_drafters.suffix] -- the longest suffix match in the request's own text and,
  opt-in, in a bounded store of earlier requests (SuffixDecoding);
* [`eagle`][minispec.extra_drafters.eagle] -- drafting from the target's features with an EAGLE head;
* [`hybrid`][minispec.extra_drafters.hybrid] -- per round, a trusted context match or the feature head;
* [`trees`][minispec.drafters.trees] -- what the drafters share to draw draft trees.
"""
