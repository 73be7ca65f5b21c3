"""Layer 4, who proposes drafts.

* [`base`][minispec.drafters.base] -- the ``Drafter`` base class (every hook the drivers call),
  a draft model (``ModelDrafter``), one drafter per request (``PerRequestDrafter``);
* [`ngram`][minispec.drafters.ngram] -- n-gram tables and prompt lookup (one-hot ``q``);
* [`suffix`][minispec.drafters.suffix] -- the longest suffix match in the request's own text and,
  opt-in, in a bounded store of earlier requests (SuffixDecoding);
* [`eagle`][minispec.drafters.eagle] -- drafting from the target's features with an EAGLE head;
* [`hybrid`][minispec.drafters.hybrid] -- per round, a trusted context match or the feature head;
* [`trees`][minispec.drafters.trees] -- the same sources proposing draft trees.
"""
