"""One speculative round, written once: prefill, draft, verify, roll back, emit.

[`SpeculativeRunner`][minispec.decoding.runner.SpeculativeRunner] owns the target model, its KV
cache and the drafter, and turns a batch of [`Sequence`][minispec.core.sequence.Sequence] objects
into tokens. Both drivers call [`round`][minispec.decoding.runner.SpeculativeRunner.round] --
[`minispec.speculative_generate`][minispec.decoding.loop.speculative_generate] with a batch of one,
the [`Engine`][minispec.serving.engine.Engine] with every running request -- with each row's ``k``
(fixed, or chosen by the draft-length policy, which times the round from outside), and the round
runs the phases in order::

    proposals = runner.draft(seqs, ks)                  # 1. a chain or a tree of guesses per row
    verdicts, hidden = runner.verify(seqs, proposals)   # 2. ONE target forward, walk each proposal
    runner.rollback(seqs, proposals, verdicts, hidden)  # 3. keep the accepted path in both caches
    emitted = runner.emit(seqs, proposals, verdicts)    # 4. append tokens until a stop rule fires

A chain of ``k`` drafts is the tree with one child per node, so every proposal is a
[`Proposal`][minispec.core.tree.Proposal] and every rule of a round -- the verify forward,
the accept rule, the rollback, the stop rules -- exists once
([`SpeculativeRunner`][minispec.decoding.runner.SpeculativeRunner] spells each out).

A request whose logits contain NaN or +inf, or whose drafter proposes something invalid, fails alone
(``finish_reason="error"``): it gets no verdict and no token, and the other rows go on; no phase is
ever run twice, so every request draws its random numbers once, as in a run of its own. The
counters ``target_forwards`` and ``prefill_forwards`` count batched forwards, whatever the batch.
"""

from __future__ import annotations

import time

import torch
from torch import Tensor

from minispec.core.constraint import ask
from minispec.core.sampling import check_probs, is_int, probs_for_rows
from minispec.core.sequence import Sequence
from minispec.core.speculative import Verdict, verify
from minispec.core.tree import Proposal, tree_size
from minispec.drafters.base import Drafter, Shape
from minispec.models.llama import Llama, TreeAttention
from minispec.models.static_step import StaticForward

__all__ = ["SpeculativeRunner"]


class SpeculativeRunner:
    """The phases of a speculative round over a batch of sequences (module docstring).

    A chain of ``k`` drafts is the tree with one child per node, so every rule of a round exists
    once:

    * **the verify forward**: row ``b`` feeds the root (its last token) and every node; node ``i``
      sits at RoPE position ``n_b - 1 + depth(i)``, is stored at cache position ``n_b - 1 + i`` and
      sees the context and its own ancestors (tree attention; for a batch of chains that is the
      causal mask, and the plain path runs);
    * **the accept rule**: [`verify`][minispec.core.speculative.verify] walks each row's proposal
      with the row's own generator (on a chain: Algorithm 1's loop, Leviathan et al.); plain
      greedy rows walk the target's argmaxes without building distributions;
    * **the rollback**: both caches keep exactly the accepted path
      ([`KVCache.compact`][minispec.models.kv_cache.KVCache.compact]; on a chain: a truncation),
      and the drafter sees the target's features of the accepted positions only;
    * **the stop rules** ([`Sequence.append`][minispec.core.sequence.Sequence.append]) and the
      statistics.

    Args:
        target: the target model ``p``; the runner works on its device.
        target_cache: its KV cache; each sequence's slot is ``seq.slot``, reserved for the round.
        drafter: a [`Drafter`][minispec.drafters.base.Drafter], or ``None`` (plain decoding).
        branching: draft trees with ``branching[t]`` children per node at depth ``t``; ``None``:
            chains.
        graphs: run the target's forwards, and a draft model's chain steps, as static-shape
            steps ([`StaticForward`][minispec.models.static_step.StaticForward]), captured as CUDA
            graphs on a GPU, run eagerly on the CPU; ``None`` (default): on a GPU only.
    """

    def __init__(self, target: Llama, target_cache, drafter: Drafter | None = None,
                 branching: tuple[int, ...] | None = None, graphs: bool | None = None) -> None:
        self.target, self.target_cache, self.drafter = target, target_cache, drafter
        self.branching, self.device = branching, target.device
        self.target_forwards = self.prefill_forwards = 0
        graphs = target.device.type == "cuda" if graphs is None else graphs
        self.static = StaticForward(target, target_cache) if graphs else None
        if graphs and drafter is not None and drafter.cache is not None:
            drafter.capture(self.static)                # a draft model's steps: static too

    def prefill(self, seqs: list[Sequence], budgets: list[int] | None = None) -> None:
        """Batched target prefill of each ``context[:-1]`` (right-padded); logits are discarded.

        Each row continues where its prefill stopped (``seq.num_cached``) and feeds at most
        ``budgets[b]`` tokens (chunked prefill; default: all that is left). The drafter is told
        (``observe_prefill``), with the target's features of those positions if it wants them.
        """
        rows = []
        for seq, budget in zip(seqs, budgets or [s.prefill_left for s in seqs], strict=True):
            start, end = seq.num_cached, seq.num_cached + min(seq.prefill_left, budget)
            if end > start:
                rows.append((seq, start, seq.context[start:end]))
        if not rows:
            return
        width = max(len(ids) for _, _, ids in rows)
        ids = [t + [0] * (width - len(t)) for _, _, t in rows]
        pos = [list(range(s, s + len(t))) + [-1] * (width - len(t)) for _, s, t in rows]
        _, hidden = self._forward(ids, pos, [seq for seq, _, _ in rows])
        self.prefill_forwards += 1
        if self.drafter is not None:
            wants = self.drafter.wants_hidden
            states = [hidden[r, :len(t)] for r, (_, _, t) in enumerate(rows)] if wants else None
            self.drafter.observe_prefill([seq for seq, _, _ in rows], [s for _, s, _ in rows],
                                         states)
        for seq, _, t in rows:
            seq.num_cached += len(t)

    def round(self, seqs: list[Sequence], ks: list[int]) -> list[list[int]]:
        """One speculative round over the batch: row ``b`` drafts ``ks[b]`` (a chain of up to
        ``ks[b]`` drafts, or a tree of that depth); the tokens each row emitted.

        Four calls and nothing else: who chooses ``ks`` and what a round costs are the
        draft-length policy's business ([`GoodputK.round`][minispec.decoding.goodput.GoodputK.round]
        times this call from outside).
        """
        proposals = self.draft(seqs, ks)                          # 1. guesses, every row
        verdicts, hidden = self.verify(seqs, proposals)           # 2. one target forward, walks
        self.rollback(seqs, proposals, verdicts, hidden)          # 3. keep the accepted paths
        return self.emit(seqs, proposals, verdicts)               # 4. tokens out

    # ------------------------------------------------------------------ 1. draft

    def draft(self, seqs: list[Sequence], ks: list[int]) -> list[Proposal]:
        """Each row's proposal: up to ``ks[b]`` drafts in a chain, or a tree of depth ``ks[b]``.

        A row whose drafter fails, or proposes a token outside the vocabulary, is failed alone. A
        round of chains with every ``k`` 0 is a plain step: the drafter is not called (a lazy
        drafter catches up on the context when it next drafts). A row with a grammar
        (``seq.constraint``) that forces tokens proposes them, a chain with one-hot ``q``, instead
        of asking the drafter; its drafter's proposal loses what the grammar forbids
        (``_allowed``).
        """
        t0 = time.perf_counter()
        if self.drafter is None or (self.branching is None and not any(ks)):
            proposals = [Proposal.chain([]) for _ in seqs]   # a plain step
        else:
            shapes = ks if self.branching is None else [self.branching[:k] for k in ks]
            forced = {b: f for b, (seq, k) in enumerate(zip(seqs, ks, strict=True))
                      if k > 0 and (f := ask(seq, "forced", k))}
            proposals = [Proposal.chain(forced.get(b, [])) for b in range(len(seqs))]
            rows = [b for b in range(len(seqs)) if b not in forced]
            drafted = self.drafter.propose([seqs[b] for b in rows], [shapes[b] for b in rows])
            for b, proposal in zip(rows, drafted, strict=True):
                checked = _checked(seqs[b], proposal, shapes[b], self.target.config.vocab_size)
                proposals[b] = _allowed(seqs[b], checked)
        elapsed = time.perf_counter() - t0
        for seq, k in zip(seqs, ks, strict=True):
            seq.stats.draft_time += elapsed                     # the batch's time, shared
            seq.stats.k_per_round.append(k)
        return proposals

    # ------------------------------------------------------------------ 2. verify

    def verify(self, seqs: list[Sequence], proposals: list[Proposal]
               ) -> tuple[list[Verdict | None], Tensor | None]:
        """One target forward over every row's proposal, then each row's walk down it.

        Returns:
            One verdict per row (``None`` for a row that failed: its ``path`` holds the accepted
            nodes, its ``tokens`` the accepted drafts plus one token from the target), and the
            target's final hidden states ``(B, N, D)`` when the drafter wants them, else ``None``.
        """
        t0 = time.perf_counter()
        live = [b for b, seq in enumerate(seqs) if not seq.is_finished]
        verdicts: list[Verdict | None] = [None] * len(seqs)
        hidden = None
        if live:
            logits, hidden = self._verify_forward([seqs[b] for b in live],
                                                  [proposals[b] for b in live])
            # two batched reductions instead of three small ops per row: (B, N) each
            bad = (torch.isnan(logits) | torch.isposinf(logits)).any(dim=-1).tolist()
            argmax = logits.argmax(dim=-1).tolist()
            for r, b in enumerate(live):                    # logits[r]: (N_b.., V)
                n = len(proposals[b].tree)
                verdicts[b] = self._walk(seqs[b], proposals[b], logits[r, :n], argmax[r][:n],
                                         any(bad[r][:n]))
            wants = self.drafter is not None and self.drafter.wants_hidden
            hidden = dict(zip(live, hidden, strict=True)) if wants else None   # row b's features
        elapsed = time.perf_counter() - t0
        for seq in seqs:
            seq.stats.verify_time += elapsed
        return verdicts, hidden

    def _verify_forward(self, seqs: list[Sequence], proposals: list[Proposal]
                        ) -> tuple[Tensor, Tensor | None]:
        """Row b feeds its root and nodes; padding sits at position -1. Logits ``(B, N, V)``."""
        width = max(len(p.tree) for p in proposals)
        ids, pos, store = [], [], []
        for seq, prop in zip(seqs, proposals, strict=True):
            n, pad = seq.num_tokens, width - len(prop.tree)
            ids.append([seq.context[-1]] + prop.tree.tokens[1:] + [0] * pad)
            pos.append([n - 1 + d for d in prop.depths()] + [-1] * pad)       # RoPE positions
            store.append(list(range(n - 1, n - 1 + len(prop.tree))) + [-1] * pad)
        tree = None
        if not all(p.is_chain for p in proposals):      # a chain's ancestors are its causal mask
            mask = torch.zeros(len(seqs), width, width, dtype=torch.bool)           # (B, N, N)
            for b, prop in enumerate(proposals):
                mask[b, :len(prop.tree), :len(prop.tree)] = prop.tree.ancestor_mask()
            tree = TreeAttention(torch.tensor(store, device=self.device),
                                 torch.tensor([s.num_tokens - 1 for s in seqs], device=self.device),
                                 mask.to(self.device))
        self.target_forwards += 1
        return self._forward(ids, pos, seqs, tree)

    def _walk(self, seq: Sequence, proposal: Proposal, logits: Tensor, argmax: list[int],
              non_finite: bool) -> Verdict | None:
        """The accept rule on one row: ``logits`` ``(N, V)`` at the root and every node, their
        ``argmax``, and whether any holds NaN or +inf."""
        if non_finite:
            seq.fail(ValueError("logits contain NaN or +inf (from this request's own tokens or "
                                "non-finite weights)"))
            return None
        grammar = seq.constraint
        if seq.sampling.raw_argmax and grammar is None:     # plain greedy: argmaxes only
            return verify(proposal, argmax)
        tree = proposal.tree
        paths = [seq.context]
        for i in range(1, len(tree)):                       # the context each node's p sees
            paths.append(paths[tree.parents[i]] + [tree.tokens[i]])
        n = seq.num_tokens                                  # a grammar masks p at every node
        masks = None if grammar is None else [ask(seq, "mask", path[n:]) for path in paths]
        if seq.is_finished:                                 # its grammar failed
            return None
        p = probs_for_rows(logits, [seq.sampling] * len(tree), paths, masks)      # (N, V)
        try:
            return verify(proposal, p, seq.generator, greedy=seq.sampling.greedy)
        except ValueError as error:                         # a q of another vocabulary ...
            seq.fail(error)
            return None

    # ------------------------------------------------------------------ 3. roll back

    def rollback(self, seqs: list[Sequence], proposals: list[Proposal], verdicts: list,
                 hidden: dict[int, Tensor] | None = None) -> None:
        """Keep ``[.., last, accepted path]`` (``n + a`` positions) in the target cache, moved to
        consecutive positions; let the drafter roll its own state back and see the features of
        the root and the accepted nodes only."""
        live = [b for b, v in enumerate(verdicts) if v is not None]
        for b in live:
            n = seqs[b].num_tokens
            self.target_cache.compact(seqs[b].slot, n, [n - 1 + node for node in verdicts[b].path])
        if self.drafter is not None and live:
            paths = [verdicts[b].path for b in live]
            states = None if hidden is None else [hidden[b][[0] + verdicts[b].path] for b in live]
            self.drafter.observe([seqs[b] for b in live], [len(p) for p in paths], states, paths)

    # ------------------------------------------------------------------ 4. emit

    def emit(self, seqs: list[Sequence], proposals: list[Proposal], verdicts: list
             ) -> list[list[int]]:
        """Append each verdict's tokens to its sequence (stop rules apply); the emitted tokens."""
        emitted = []
        for seq, proposal, verdict in zip(seqs, proposals, verdicts, strict=True):
            if verdict is None:                       # failed in this round: nothing to emit
                emitted.append([])
                continue
            seq.stats.record_round(proposal.depth, verdict.num_accepted)
            shown = proposal.main_chain(verdict.path)
            emitted.append(seq.append(verdict.tokens, shown, verdict.num_accepted))
            seq.num_cached = seq.num_tokens - 1       # the cache holds all but the newest token
        return emitted

    # ------------------------------------------------------------------ helpers

    def _forward(self, ids: list[list[int]], pos: list[list[int]], seqs: list[Sequence],
                 tree: TreeAttention | None = None) -> tuple[Tensor, Tensor]:
        """The target on (B, T) ids at (B, T) positions (-1 = padding) of the rows' cache slots."""
        ids_t = torch.tensor(ids, dtype=torch.long, device=self.device)          # (B, T)
        pos_t = torch.tensor(pos, dtype=torch.long, device=self.device)          # (B, T)
        slots = [s.slot for s in seqs]
        # an EAGLE-3 head's layers (B, T, 3D), else the final-normed states (B, T, D)
        layers = None if self.drafter is None else self.drafter.feature_layers
        if (self.static is not None and layers is None
                and (out := self.static(ids_t, pos_t, slots, tree))):
            return out                                    # a static bucket held the batch
        return self.target(ids_t, pos_t, self.target_cache, slots, return_hidden=layers or True,
                           tree=tree)


def _allowed(seq: Sequence, proposal: Proposal) -> Proposal:
    """A constrained row's proposal without what its grammar forbids: a node stays when its parent
    stays, is no EOS, and the mask after the parent's path allows its token (a chain is cut at the
    first forbidden draft; a deterministic cut keeps verification exact)."""
    if seq.constraint is None or seq.is_finished or len(proposal.tree) == 1:
        return proposal
    tree, paths, keep = proposal.tree, {0: []}, [0]
    for i in range(1, len(tree)):                         # depth-first: parents come first
        parent = tree.parents[i]
        if parent not in paths or (parent and tree.tokens[parent] in seq.eos_token_ids):
            continue
        if (mask := ask(seq, "mask", paths[parent])) is None and seq.is_finished:
            return Proposal.chain([])                     # its grammar failed
        if mask is None or bool(mask[tree.tokens[i]]):
            paths[i] = paths[parent] + [tree.tokens[i]]
            keep.append(i)
    if len(keep) == len(tree):
        return proposal
    index = {old: new for new, old in enumerate(keep)}
    draws = [[(index[c], q) for c, q in proposal.draws[o] if c in index] for o in keep]
    pruned = Proposal.build([-1] + [index[tree.parents[o]] for o in keep[1:]],
                            [tree.tokens[o] for o in keep], draws)
    pruned.created = [proposal.created[keep[i]] for i in pruned.created]   # the drafter's numbers
    return pruned


def _checked(seq: Sequence, proposal: Proposal, shape: Shape, vocab_size: int) -> Proposal:
    """A drafter's proposal for a row, or the root alone when it does not fit ``shape`` (deeper,
    or more nodes), holds a token id outside the vocabulary or a ``q`` that is no distribution:
    then the row fails."""
    depth, nodes = (shape, shape + 1) if isinstance(shape, int) else (len(shape), tree_size(shape))
    ids = proposal.tree.tokens[1:]
    qs = [q for draws in proposal.draws for _, q in draws if q is not None]
    try:
        if proposal.depth > depth or len(proposal.tree) > nodes or not all(
                is_int(t) and 0 <= t < vocab_size for t in ids):
            raise ValueError(f"the drafter proposed token ids {ids} in {len(proposal.tree) - 1} "
                             f"nodes of depth {proposal.depth}; expected ids in [0, {vocab_size})"
                             f" in at most {nodes - 1} nodes of depth {depth}")
        if qs:
            check_probs(torch.stack(qs), "the drafter's q")
    except (ValueError, RuntimeError) as error:           # RuntimeError: q rows of two widths
        seq.fail(error)
        return Proposal.chain([])
    return proposal
