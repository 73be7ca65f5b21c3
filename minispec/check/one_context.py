"""A drafter with a model of its own, as the graders' one-context drafter.

The graders ([`minispec.check.drafter`][minispec.check.drafting.drafter]) call a drafter as
``draft(context, k, sampling, generator) -> Draft``: one context, no decoding loop. A minispec
drafter with a model and a KV cache drafts for requests instead (``propose(seqs, shapes)``);
[`OneContext`][minispec.check.one_context.OneContext] gives it one request of its own, so the same
drafter can be graded, and its cache's rollback watched from outside a loop.
"""

from __future__ import annotations

import torch

from minispec.core.sampling import SamplingParams, one_hot
from minispec.core.sequence import Sequence
from minispec.core.speculative import Draft
from minispec.drafters.model import ModelBackedDrafter
from minispec.models.kv_cache import ContiguousKVCache

__all__ = ["OneContext"]


class OneContext:
    """``drafter`` as ``draft(context, k, sampling, generator) -> Draft``.

    The adapter keeps one request (a probe sequence) in the drafter's cache: each call rolls that
    cache back to the longest prefix of ``context`` it already holds and lets the drafter feed
    the rest, as a decoding loop's rollback would. A greedy draft comes with its one-hot ``q``
    rows.

    Args:
        drafter: a drafter with a model (a ``ModelDrafter``); a cache is attached if it has
            none.
    """

    def __init__(self, drafter: ModelBackedDrafter) -> None:
        self.drafter = drafter
        self.probe: Sequence | None = None

    @torch.inference_mode()
    def draft(self, context: list[int], k: int, sampling: SamplingParams,
              generator: torch.Generator | None) -> Draft:
        """Up to ``k`` drafts after ``context`` and the ``q`` rows they were drawn from."""
        if not context:
            raise ValueError("context must hold at least one token")
        drafter = self.drafter
        if self.probe is None:
            if drafter.cache is None:
                drafter.attach(ContiguousKVCache.for_model(drafter.model, 1, drafter.max_seq_len))
            self.probe = Sequence("draft", [0], sampling, draft_slot=drafter.cache.allocate())
        probe, fed, common = self.probe, self.fed, 0     # the longest prefix held (not its last)
        while common < min(len(fed), len(context) - 1) and fed[common] == context[common]:
            common += 1
        drafter.cache.truncate_to(probe.draft_slot, common)
        probe.prompt, probe.generated, probe.draft_len = list(context), [], common
        probe.sampling, probe.generator = sampling, generator
        proposal, = drafter.propose([probe], [k])
        if probe.is_finished:                               # NaN logits: start afresh next time
            self.probe = None
            raise ValueError(probe.error)
        probe.generated = proposal.tree.tokens[1:]
        ids = torch.tensor(probe.generated, dtype=torch.long, device=drafter.model.device)
        qs = [q for draws in proposal.draws for _, q in draws if q is not None]
        if qs:
            return Draft(ids, torch.stack(qs))
        greedy = sampling.greedy and k > 0                  # a greedy draft: one-hot q rows
        return Draft(ids, one_hot(ids, drafter.model.config.vocab_size) if greedy else None)

    @property
    def fed(self) -> list[int]:
        """Token ids whose keys and values sit in the probe's cache slot."""
        return [] if self.probe is None else self.probe.context[: self.probe.draft_len]

    @property
    def slot(self) -> int | None:
        """The probe's cache slot."""
        return None if self.probe is None else self.probe.draft_slot
