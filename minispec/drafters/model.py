"""Drafting with a model of one's own: the machinery, and the draft model of Leviathan et al.

[`ModelBackedDrafter`][minispec.drafters.model.ModelBackedDrafter] is what every drafter that owns
a model and a KV cache shares (a draft model here, an EAGLE head in
``minispec.extra_drafters.eagle``): the cache the loop attaches (``seq.draft_slot``,
``seq.draft_len`` positions held), the lazy prefill of what the cache lacks, chains drafted for
every row in one batched forward per step, trees row by row in the positions the round reserved,
and the rollback to what verify accepted. A subclass says how one step scores (``_chain_step``)
and how a tree starts and grows (``_tree_root``, ``_score_level``).

[`ModelDrafter`][minispec.drafters.model.ModelDrafter] is the draft model ``q`` of Leviathan et
al., a small language model with the target's tokenizer.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import Tensor

from minispec.core.constraint import ask
from minispec.core.sampling import check_args, is_int, non_finite, probs_for_rows, sample
from minispec.core.sequence import Sequence
from minispec.core.tree import Proposal, TreeShape
from minispec.drafters.base import Drafter, Shape
from minispec.drafters.trees import grow_levels
from minispec.models.kv_cache import KVCache
from minispec.models.llama import Forward, Llama, TreeAttention, eager_forward

__all__ = ["ModelBackedDrafter", "ModelDrafter", "choose_drafts"]


class ModelBackedDrafter(Drafter):
    """The machinery of a drafter with its own model and KV cache (module docstring).

    Attributes:
        step: the chain steps' forward, ``step(ids, positions, slots)`` (from the ``forward``
            collaborator given to ``attach``; eager by default).
        trees: request -> its tree of this round and where the tree's fed nodes are stored
            (created node -> cache position).
    """

    def __init__(self) -> None:
        self.trees: dict[str, tuple[Proposal, dict[int, int]]] = {}
        self.step: Any = None

    def attach(self, cache: KVCache, forward: Forward | None = None) -> None:
        """Keep keys and values in ``cache``; chain steps run through ``forward``."""
        self.cache = cache
        self.step = (forward or eager_forward)(self.model, cache)

    def rewind(self, seqs: list[Sequence]) -> None:
        """Forget a failed ``propose``: each row's cache back to its context (less the last
        token, fed again by the next step) and its tree dropped."""
        for seq in seqs:
            self._truncate(seq, min(seq.draft_len, seq.num_tokens - 1))
            self.trees.pop(seq.request_id, None)

    @torch.inference_mode()
    def propose(self, seqs: list[Sequence], shapes: list[Shape]) -> list[Proposal]:
        """Row ``b``'s guesses after ``seqs[b].context`` in the shape ``shapes[b]``: a chain of up
        to ``k`` drafts for an ``int``, a tree for a branching (a node may get fewer children).

        The round calls it whenever a row drafts, rows with nothing to draft (``0`` or ``()``)
        included; a round of chains where no row drafts is a plain step and does not call it
        (``observe`` follows every round), so a drafter catches up on the context lazily. A row
        whose drafting fails is failed (``seq.fail``) and proposes the root alone.

        The chains batched (``_draft_chains``), the trees row by row (``_tree``), each kept in
        ``trees`` with where its fed nodes are stored. The ``q`` rows are checked by the round,
        row by row, not here: one row's bad ``q`` fails that row alone."""
        chains = [b for b, shape in enumerate(shapes) if isinstance(shape, int)]
        tokens, probs = self._draft_chains([seqs[b] for b in chains], [shapes[b] for b in chains])
        proposals = {b: Proposal.chain(t, torch.stack(p) if p else None, check=False)
                     if not seqs[b].is_finished else Proposal.chain([])     # failed while drafting
                     for b, t, p in zip(chains, tokens, probs, strict=True)}    # none: one-hot q
        return [proposals[b] if b in proposals else self._tree(seqs[b], shape)   # trees in order
                for b, shape in enumerate(shapes)]

    def _draft_chains(self, seqs: list[Sequence], ks: list[int]
                      ) -> tuple[list[list[int]], list[list[Tensor]]]:
        """Up to ``ks[b]`` drafts per row and the ``q`` rows they were drawn from (none: greedy):
        draft ``j + 1`` of every row still drafting from one batched forward (``_chain_step``)."""
        tokens: list[list[int]] = [[] for _ in seqs]
        probs: list[list[Tensor]] = [[] for _ in seqs]
        for j in range(max(ks, default=0)):
            rows = [b for b, k in enumerate(ks) if k > j]
            batch, drafts = [seqs[b] for b in rows], [tokens[b] for b in rows]
            logits = self._chain_step(batch, drafts)                                    # (R, V)
            for b, (token, q) in zip(rows, self._choose(batch, logits, drafts), strict=True):
                tokens[b].append(token)
                if q is not None:
                    probs[b].append(q)
        return tokens, probs

    def _chain_step(self, seqs: list[Sequence], drafts: list[list[int]]) -> Tensor:
        """One forward: each row's logits ``(R, V)`` for its next draft, after ``drafts[r]``."""
        raise NotImplementedError(f"{type(self).__name__} does not propose")

    def _choose(self, seqs: list[Sequence], logits: Tensor, drafts: list[list[int]]):
        """Each row's next draft and its ``q``
        ([`choose_drafts`][minispec.drafters.model.choose_drafts])."""
        return choose_drafts(seqs, logits, drafts)


    def _feed(self, seqs: list[Sequence], feeds: list[list[int]], *inputs: Tensor) -> Any:
        """One forward of ``model`` over the draft cache: row ``r`` feeds ``feeds[r]`` at the
        positions after the ``seq.draft_len`` its cache holds, left-padded to the longest feed with
        token 0 at position -1 (never written, never attended to); ``inputs`` go between the ids
        and the positions (an EAGLE head's features ``(R, T, D)``). Then each row's cache holds its
        feed, and the row has one draft forward more. Returns the model's outputs."""
        width, device = max(len(f) for f in feeds), self.model.device
        ids = [[0] * (width - len(f)) + f for f in feeds]                                 # (R, T)
        pos = [[-1] * (width - len(f)) + list(range(s.draft_len, s.draft_len + len(f)))
               for s, f in zip(seqs, feeds, strict=True)]                                 # (R, T)
        ids_t, pos_t = torch.tensor(ids, device=device), torch.tensor(pos, device=device)
        slots = [s.draft_slot for s in seqs]
        # a chain step (one or two tokens a row) runs through the ``forward`` collaborator; a
        # longer lazy prefill, and a feature head's step (``inputs``), run the model itself
        if width <= 2 and not inputs:
            out = self.step(ids_t, pos_t, slots)
        else:
            out = self.model(ids_t, *inputs, pos_t, self.cache, slots)
        self.forwards += 1
        for seq, f in zip(seqs, feeds, strict=True):
            seq.draft_len += len(f)
            seq.stats.draft_forwards += 1
        return out

    def _truncate(self, seq: Sequence, keep: int) -> None:
        """Roll ``seq``'s rows of the draft cache back to ``keep`` positions (if it holds more)."""
        if seq.draft_len > keep:
            self.cache.truncate_to(seq.draft_slot, keep)
            seq.draft_len = keep

    def _tree(self, seq: Sequence, branching: tuple[int, ...] | TreeShape) -> Proposal:
        """``seq``'s tree, drawn in the row's own slot of the draft cache: from the root's logits
        (``_tree_root``), one forward per depth (``_score_level``), each depth's nodes stored past
        the context, in the positions the round reserved. Returns the tree, kept in ``trees`` with
        where its fed nodes are stored (created node -> cache position). A row whose drafting
        fails is failed alone and proposes the root alone."""
        proposal, storage = Proposal.chain([]), {}             # the root alone, if nothing grows
        try:
            root = self._tree_root(seq) if branching else None
            if root is not None:
                score = functools.partial(self._score_level, seq)
                proposal = (branching.grow(seq, root, score, storage)   # a shape grows itself
                            if isinstance(branching, TreeShape)
                            else grow_levels(seq, branching, root, score, storage))
        except Exception as error:             # this request's drafting is broken: it alone fails
            seq.fail(error)
            storage = {}
        self.trees[seq.request_id] = proposal, storage
        return proposal


class ModelDrafter(ModelBackedDrafter):
    """Drafts with a small language model that shares the target's tokenizer.

    **Chains**, all rows batched: the draft model has its own KV cache
    ([`attach`][minispec.drafters.model.ModelBackedDrafter.attach]; the decoding loop makes it the
    same kind as the target's). Row ``b`` of a draft step feeds what its cache lacks --
    ``seq.context[draft_len:]``: one token normally, two after a round that accepted all ``k``
    drafts (``d_k`` was sampled but never fed: the draft lags by one), the whole context on first
    use or after a preemption (a lazy prefill, done in its own forward so short rows are not padded
    to the prompt's length). Then ``k - 1`` more steps feed the previous draft. Every row turns its
    logits into ``q`` with its own ``SamplingParams`` and samples with its own generator. After
    verify, [`observe`][minispec.drafters.model.ModelDrafter.observe] rolls the cache back to the
    accepted length.

    **Trees**, row by row, in the same cache: the row feeds what its slot lacks of the context
    (at least the root), then expands the tree one depth per forward with tree attention
    ([`grow_levels`][minispec.drafters.trees.grow_levels]), the nodes stored past the context in
    the positions the round reserved (so a tree's draft memory is the pool's, bounded and
    preempted like the target's); after verify the slot keeps the context plus the fed nodes of
    the accepted path ([`KVCache.compact`][minispec.models.kv_cache.KVCache.compact]).

    Args:
        model: the draft [`Llama`][minispec.models.llama.Llama].
        max_seq_len: longest context its cache may hold (default: the model's).
    """

    dynamic_trees = True

    def __init__(self, model: Llama, max_seq_len: int | None = None) -> None:
        if not isinstance(model, Llama):
            raise TypeError(f"ModelDrafter needs a draft Llama (from ms.load), got "
                            f"{type(model).__name__}")
        check_args("ModelDrafter", [("max_seq_len", max_seq_len, max_seq_len is None or (
            is_int(max_seq_len) and max_seq_len >= 1), "a positive integer or None")])
        super().__init__()
        self.model = model
        self.max_seq_len = min(max_seq_len or model.config.max_position_embeddings,
                               model.config.max_position_embeddings)

    def clone(self) -> ModelDrafter:
        """The same draft model with no cache attached (an engine owns its own)."""
        return ModelDrafter(self.model, self.max_seq_len)

    def check_target(self, target: Llama) -> None:
        """``ValueError`` unless the draft model can share ``target``'s token ids.

        The vocabularies must have the same size and the configs the same EOS ids (a draft that
        stops where the target does not, or the reverse, is a sign of two different tokenizers).
        """
        draft, target = self.model.config, target.config                       # their configs
        if draft.vocab_size != target.vocab_size:
            raise ValueError(f"draft vocab_size {draft.vocab_size} != target vocab_size "
                             f"{target.vocab_size}: the models must share one tokenizer")
        if set(draft.eos_token_ids) != set(target.eos_token_ids):
            raise ValueError(f"draft eos ids {draft.eos_token_ids} != target eos ids "
                             f"{target.eos_token_ids}: the models must share one tokenizer")

    def _chain_step(self, seqs: list[Sequence], drafts: list[list[int]]) -> Tensor:
        """Feed what each row's cache lacks: its last draft, or before its first draft
        ``seq.context[draft_len:]`` (one token normally, two after a round that accepted all its
        drafts); logits for the next draft ``(R, V)``. The last draft of a row is never fed."""
        feeds = [d[-1:] if d else seq.context[seq.draft_len:]
                 for seq, d in zip(seqs, drafts, strict=True)]
        # a lazy prefill (first use, after plain rounds): all a cache lacks but the last token,
        # when it lacks more than the one or two a drafting round leaves
        long = [r for r, feed in enumerate(feeds) if len(feed) > 2]
        if long:
            self._forward([seqs[r] for r in long], [feeds[r][:-1] for r in long])
        return self._forward(seqs, [feed[-1:] if len(feed) > 2 else feed for feed in feeds])

    def _forward(self, seqs: list[Sequence], feeds: list[list[int]]) -> Tensor:
        """Feed each row's tokens (``_feed``); logits after the last ``(R, V)``."""
        return self._feed(seqs, feeds)[:, -1]                                  # (R, T, V) -> (R, V)

    def _tree_root(self, seq: Sequence) -> tuple[Tensor, int]:
        """A tree's start: feed what the row's slot lacks of ``seq.context`` (at least the root,
        its last token); the root's logits ``(1, V)`` and the positions the slot holds."""
        self._truncate(seq, seq.num_tokens - 1)
        return self._feed([seq], [seq.context[seq.draft_len:]])[0, -1:], seq.num_tokens  # (1, V)

    def _score_level(self, seq: Sequence, frontier: list[int], parents: list[int], ids: Tensor,
                     positions: Tensor, tree: TreeAttention) -> Tensor:
        """One forward over a depth of the row's tree: logits ``(F, V)``."""
        self.forwards += 1
        seq.stats.draft_forwards += 1
        return self.model(ids, positions, self.cache, [seq.draft_slot], tree=tree)[0]   # (F, V)

    @torch.inference_mode()
    def observe(self, seqs: list[Sequence], num_accepted: list[int], hidden: list[Tensor] | None,
                paths: list[list[int]]) -> None:
        """Roll each row's draft cache back to ``n + a``: the context plus the accepted drafts (a
        tree's row keeps the context plus the fed nodes of the accepted path)."""
        for seq, a, path in zip(seqs, num_accepted, paths, strict=True):
            if (tree := self.trees.pop(seq.request_id, None)) is None:
                self._truncate(seq, seq.num_tokens + a)
                continue
            proposal, storage = tree
            kept = [proposal.created[i] for i in path if proposal.created[i] in storage]
            self.cache.compact(seq.draft_slot, seq.draft_len, [storage[c] for c in kept])
            seq.draft_len += len(kept)

    def release(self, seq: Sequence) -> None:
        self.trees.pop(seq.request_id, None)


def choose_drafts(seqs: list[Sequence], logits: Tensor, drafts: list[list[int]]):
    """Each row's next draft token and its ``q`` (``None`` for plain greedy: the argmax).

    Args:
        seqs: the rows' sequences (their ``SamplingParams`` and generators).
        logits: (R, V) the draft's logits for the next token of each row.
        drafts: each row's drafts so far (repetition penalties see them).

    Yields:
        ``(token, q)`` per row, in order: greedy rows take the argmax, with ``q = None`` unless a
        penalty or a grammar's mask (``seq.constraint``) reshapes the distribution; sampled rows
        draw from ``q`` with their own generator.
    """
    argmax = logits.argmax(dim=-1).tolist()                                         # (R,)
    for r in non_finite(logits).nonzero().flatten().tolist():
        if not seqs[r].is_finished:                 # this request alone fails; the others go on
            seqs[r].fail(ValueError("draft logits contain NaN or +inf"))
    slow = [r for r, s in enumerate(seqs) if not s.is_finished
            and (not s.sampling.raw_argmax or s.constraint is not None)]
    contexts = [seqs[r].context + drafts[r] for r in slow]
    masks = [ask(seqs[r], "mask", drafts[r]) for r in slow]   # as p is masked, from one state
    q = (probs_for_rows(logits[slow], [seqs[r].sampling for r in slow], contexts, masks)
         if slow else [])
    qs = dict(zip(slow, q, strict=True))                                            # r -> (V,)
    for r, seq in enumerate(seqs):
        if r not in qs:
            yield argmax[r], None
        elif seq.sampling.greedy:          # greedy with a repetition penalty: argmax of q
            yield int(qs[r].argmax()), qs[r]
        else:
            yield int(sample(qs[r], seq.generator)), qs[r]
