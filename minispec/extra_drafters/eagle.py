"""[`EagleDrafter`][minispec.extra_drafters.eagle.EagleDrafter]: draft from the target's features
with an EAGLE-style head, all rows batched.

The head ([`minispec.extra_drafters.eagle_head`][minispec.extra_drafters.eagle_head]) reads pairs
``(f_{t-1}, x_t)``: the target's feature at ``t - 1`` and the token at ``t``. Which features exist
when:

* after the target's **prefill** of ``context[:-1]`` (positions ``0..n-2``), the runner hands the
  drafter ``f_0..f_{n-2}``
  ([`EagleDrafter.observe_prefill`][minispec.extra_drafters.eagle.EagleDrafter.observe_prefill]);
  the pairs ``(f_j, x_{j+1})``, ``j = 0..n-2``, are all known;
* after a **verify** that accepted ``a`` drafts, the runner hands the features at the accepted
  positions only, ``[last, d_1..d_a]``
  ([`EagleDrafter.observe`][minispec.extra_drafters.eagle.EagleDrafter.observe]): ``a + 1`` new
  pairs, whose tokens (``d_1..d_a`` and the target's bonus token) are in the context by the next
  round.

A round of chains ([`Drafter.propose`][minispec.drafters.base.Drafter.propose]) feeds
each row's pending real pairs into the head's cache, then drafts ``k`` tokens: ``d_1`` from the
head's output at the last real pair, and ``d_{i+1}`` from the pair ``(f'_i, d_i)`` -- the head's own
predicted feature, since the target has not scored ``d_i`` yet (EAGLE-1). Those ``k - 1``
speculative pairs are dropped from the head's cache after verify; the next round re-feeds the
positions with the target's real features. So the head never sees the feature of a rejected draft,
and never keeps one of its own guesses.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from minispec.core.sequence import Sequence
from minispec.drafters.model import ModelBackedDrafter, choose_drafts
from minispec.extra_drafters.eagle_head import EagleHead, load_head
from minispec.models.llama import Llama, TreeAttention
from minispec.speed.packed import is_fast

__all__ = ["EagleDrafter", "full_vocab", "load_drafter"]


class EagleDrafter(ModelBackedDrafter):
    """Drafts with an [`EagleHead`][minispec.extra_drafters.eagle_head.EagleHead] bound to the
    target.

    The head's KV cache is the decoding loop's draft cache, exactly as for a draft model: slot
    ``seq.draft_slot``, ``seq.draft_len`` pairs held, created by the loop from ``drafter.model``
    (the head: one layer of the target's shape).

    A tree is drawn row by row in the same cache: after the catch-up, a node ``d`` at depth ``t``
    is the pair ``(f'_parent, d)`` at pair position ``n - 2 + t``, the head's OWN predicted
    feature of its parent (the root's: the head's output at the last real pair), stored past the
    real pairs in the positions the round reserved; siblings share a position and see only their
    ancestors (tree attention in the head's layer). After verify every tree pair is dropped and
    the target's features of the root and the ACCEPTED path only are kept, fed as real pairs next
    round. Draft logits over the head's ``V'`` are spread over the full vocabulary (``-inf``, so
    ``q = 0``, outside).

    An EAGLE-3 head (``aux_layers``) reads, as real features, the target's three layers
    concatenated, ``(T, 3D)``: the drafter names them in ``feature_layers`` and the runner asks the
    target for them; the speculative pairs read the head's own ``(D,)`` features as before.

    Args:
        head: the head, bound to the target the loop verifies with.
        max_seq_len: longest context its cache may hold (default: the target's).
    """

    wants_hidden = True
    dynamic_trees = True

    def __init__(self, head: EagleHead, max_seq_len: int | None = None) -> None:
        super().__init__()
        self.model = head                       # shapes the draft cache, like a draft model
        self.feature_layers = head.aux_layers   # EAGLE-3: the runner hands over these layers
        self.max_seq_len = min(max_seq_len or head.config.max_position_embeddings,
                               head.config.max_position_embeddings)
        self.pending: dict[str, Tensor] = {}    # request -> (m, D or 3D) real features not fed
        self.features: dict[int, Tensor] = {}   # the tree being drawn: node -> its feature (D,)
        self.chain_features: dict[str, Tensor] = {}    # request -> f' of its last chain draft
        self.fed: dict[str, Tensor] = {}        # request -> features this round's propose fed

    def clone(self) -> EagleDrafter:
        """The same head with no cache and no request state (an engine owns its own)."""
        return EagleDrafter(self.model, self.max_seq_len)

    def check_target(self, target: Llama) -> None:
        """``ValueError`` unless the head is bound to ``target`` itself: it reads that model's
        features, embedding and LM head, so another model (even an identical copy) is refused."""
        if self.model.target is not target:
            raise ValueError("this EAGLE head is bound to another target model: load it with "
                             "ms.load_drafter(name, target) for the target you decode with")

    # ------------------------------------------------------------------ the round's hooks

    def observe_prefill(self, seqs: list[Sequence], starts: list[int],
                        hidden: list[Tensor]) -> None:
        """The target prefilled positions ``starts[b]..`` of row b; ``hidden[b]`` is (T_b, D).

        A prefill from position 0 (a new request, or one preempted and recomputed) starts over.
        """
        for seq, start, h in zip(seqs, starts, hidden, strict=True):
            if start == 0:
                self.pending[seq.request_id] = h
                self._truncate(seq, 0)
            else:
                self.pending[seq.request_id] = torch.cat([self.pending[seq.request_id], h])

    def observe(self, seqs: list[Sequence], num_accepted: list[int], hidden: list[Tensor] | None,
                paths: list[list[int]]) -> None:
        """Drop the round's speculative pairs (a tree's too); keep the real features of the
        accepted positions."""
        for seq, a, h in zip(seqs, num_accepted, hidden, strict=True):
            self.trees.pop(seq.request_id, None)             # every tree pair is dropped
            self.fed.pop(seq.request_id, None)
            real = min(seq.draft_len, seq.num_tokens - 1)    # real pairs: j = 0..n-2 at most
            self.cache.truncate_to(seq.draft_slot, real)     # a tree's pairs sit past draft_len
            seq.draft_len = real
            kept = self.pending.get(seq.request_id, h[:0])     # unfed when the row drafted nothing
            self.pending[seq.request_id] = torch.cat([kept, h[: a + 1]])        # (m + a + 1, D)

    def release(self, seq: Sequence) -> None:
        for state in (self.pending, self.trees, self.fed):
            state.pop(seq.request_id, None)

    def attach(self, cache, forward=None) -> None:
        """The head's cache; its steps read features, so they always run the head itself."""
        super().attach(cache)

    def rewind(self, seqs: list[Sequence]) -> None:
        """Forget a failed ``propose``: back to the real pairs, with the features it fed pending
        again."""
        for seq in seqs:
            real = min(seq.draft_len, seq.num_tokens - 1)
            fed = self.fed.pop(seq.request_id, None)
            if fed is not None:                        # catch-up fed them: put them back
                real = seq.num_tokens - 1 - len(fed)
                self.pending[seq.request_id] = torch.cat([fed, self.pending[seq.request_id]])
            self._truncate(seq, real)
            self.trees.pop(seq.request_id, None)

    # ------------------------------------------------------------------ drafting

    def _draft_chains(self, seqs: list[Sequence], ks: list[int]
                      ) -> tuple[list[list[int]], list[list[Tensor]]]:
        """As a draft model's (``Drafter._draft_chains``), but a row with no pair yet drafts
        nothing."""
        ks = [k if seq.num_tokens >= 2 else 0 for seq, k in zip(seqs, ks, strict=True)]
        return super()._draft_chains(seqs, ks)

    def _chain_step(self, seqs: list[Sequence], drafts: list[list[int]]) -> Tensor:
        """Logits ``(R, V')`` for each row's next draft: ``d_1`` from the catch-up forward over
        the pending real pairs, ``d_{i+1}`` from the pair ``(f'_i, d_i)``, the head's own predicted
        feature of the last draft (kept in ``chain_features`` from the step before)."""
        if not drafts[0]:                          # the first draft of every row
            out = self._catch_up(seqs)                                # (R, T, V'), (R, T, D)
        else:
            last = torch.stack([self.chain_features[seq.request_id] for seq in seqs])  # (R, D)
            out = self._feed(seqs, [d[-1:] for d in drafts], last[:, None])
        logits, feature = (o[:, -1] for o in out)                # the last column: (R, V'), (R, D)
        self.chain_features = {seq.request_id: f for seq, f in zip(seqs, feature, strict=True)}
        return logits

    def _tree_root(self, seq: Sequence) -> tuple[Tensor, int] | None:
        """A tree's start: feed the pending real pairs (the catch-up forward); the root's logits
        ``(1, V)`` come from the last one, with the pairs the slot holds (``None``: no pair yet,
        no tree)."""
        if seq.num_tokens < 2:
            return None
        logits, feature = self._catch_up([seq])                        # (1, T, V'), (1, T, D)
        self.features = {0: feature[0, -1]}
        return full_vocab(self.model, logits[:, -1]), seq.num_tokens - 1

    def _score_level(self, seq: Sequence, frontier: list[int], parents: list[int], ids: Tensor,
                     positions: Tensor, tree: TreeAttention) -> Tensor:
        """One forward over a depth of the row's tree, each node fed with its parent's predicted
        feature: logits ``(F, V)``."""
        parent = torch.stack([self.features[parents[node]] for node in frontier])[None]
        # (1, F, V'), (1, F, D)
        logits, feature = self.model(ids, parent, positions, self.cache, [seq.draft_slot],
                                     tree=tree)
        self.forwards += 1
        seq.stats.draft_forwards += 1
        self.features.update(zip(frontier, feature[0], strict=True))
        return full_vocab(self.model, logits[0])                                       # (F, V)

    def _catch_up(self, seqs: list[Sequence]) -> tuple[Tensor, Tensor]:
        """Feed each row's pending real pairs (right-aligned, left-padded); the head's outputs, the
        last column at the last pair: draft logits ``(R, T, V')`` and predicted features
        ``(R, T, D)``."""
        pending = [self.pending.get(seq.request_id) for seq in seqs]
        for seq, f in zip(seqs, pending, strict=True):
            if f is None or seq.draft_len + len(f) != seq.num_tokens - 1:
                raise RuntimeError(f"request {seq.request_id}: the head holds {seq.draft_len} "
                                   f"pairs and {0 if f is None else len(f)} pending features, "
                                   f"but the context has {seq.num_tokens - 1} (was the target "
                                   f"prefilled with the drafter attached, and every round "
                                   f"observed?)")
        width = max(len(f) for f in pending)
        features = torch.stack([F.pad(f, (0, 0, width - len(f), 0)) for f in pending])  # (R, T, D)
        features = features.to(self.model.device, self.model.dtype)       # left-padded with zeros
        # (R, T, V'), (R, T, D); the pending features count as fed only now (a failed step keeps
        # them)
        out = self._feed(seqs, [seq.context[seq.draft_len + 1:] for seq in seqs], features)
        for seq, f in zip(seqs, pending, strict=True):
            self.pending[seq.request_id] = f[:0]
            self.fed[seq.request_id] = f                       # until observe: rewind needs it
        return out

    def _choose(self, seqs: list[Sequence], logits: Tensor, drafts: list[list[int]]):
        """Each row's draft and ``q``: plain greedy rows map the argmax over ``V'`` to its id (no
        full-vocabulary tensor); other rows get ``q`` over the full vocabulary, zero outside
        ``V'``. Either way a row whose logits hold NaN fails alone (``choose_drafts``)."""
        if all(seq.sampling.raw_argmax and seq.constraint is None for seq in seqs):
            picks = [token for token, _ in choose_drafts(seqs, logits, drafts)]     # ids in V'
            return [(token, None) for token in self.model.vocab[picks].tolist()]
        return choose_drafts(seqs, full_vocab(self.model, logits), drafts)


def full_vocab(head: EagleHead, logits: Tensor) -> Tensor:
    """Draft logits ``(R, V')`` over ``V'`` -> the full vocabulary, ``-inf`` outside ``V'``."""
    if logits.shape[-1] == (V := head.config.vocab_size):
        return logits
    return logits.new_full((logits.shape[0], V), float("-inf")).index_copy_(1, head.vocab, logits)


def load_drafter(name_or_path: str | Path, target: Llama, max_seq_len: int | None = None,
                 fast: bool | None = None) -> EagleDrafter:
    """An [`EagleDrafter`][minispec.extra_drafters.eagle.EagleDrafter] for ``target`` from a shipped
    head's name or a directory.

    Args:
        name_or_path: ``"smollm2-135m-instruct-eagle"`` or a directory written by
            [`save_head`][minispec.extra_drafters.eagle_head.save_head].
        target: the target the head drafts for (its embedding, norm and LM head are used).
        max_seq_len: longest context (default: the target's).
        fast: pack the head for oneDNN
            ([`EagleHead.make_fast`][minispec.extra_drafters.eagle_head.EagleHead.make_fast]);
            default: when the target runs packed (``ms.load(..., fast=True)``).

    Raises:
        FileNotFoundError: neither a shipped head nor a directory holding one.
        ValueError: the head was made for a target of another shape.
    """
    from minispec import zoo

    name = str(name_or_path)
    directory = zoo.head_path(name) if name in zoo.HEADS else Path(name_or_path)
    if not directory.is_dir():
        raise FileNotFoundError(f"{name_or_path!r} is neither a shipped head "
                                f"({', '.join(zoo.HEADS)}) nor a directory")
    head = load_head(directory, target)
    if fast or (fast is None and is_fast(target)):
        head.make_fast()
    return EagleDrafter(head, max_seq_len)

