"""The drafters wing: drafters beyond the core's draft model, n-gram tables and prompt lookup.

Each is a [`Drafter`][minispec.drafters.base.Drafter] the round is handed like any other:

* [`suffix`][minispec.extra_drafters.suffix] -- the longest suffix match in the request's own
  text and, opt-in, in a bounded store of earlier requests (SuffixDecoding; ``drafter="suffix"``);
* [`eagle_head`][minispec.extra_drafters.eagle_head] and [`eagle`][minispec.extra_drafters.eagle]
  -- an EAGLE-style head on the target's features (EAGLE-1 and EAGLE-3 layouts), drafting through
  the core's [`ModelBackedDrafter`][minispec.drafters.model.ModelBackedDrafter] machinery;
* [`hybrid`][minispec.extra_drafters.hybrid] -- per round, a trusted context match or the head;
* [`dynamic`][minispec.extra_drafters.dynamic] -- EAGLE-2's dynamic tree, a
  [`TreeShape`][minispec.core.tree.TreeShape] grown from the drafter's confidence.
"""
