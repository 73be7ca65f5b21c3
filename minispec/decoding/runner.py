"""One speculative round, written once: prefill, draft, verify, roll back, emit.

[`SpeculativeRunner`][minispec.decoding.runner.SpeculativeRunner] owns the target model, its KV
cache and the drafter, and turns a batch of [`Sequence`][minispec.core.sequence.Sequence] objects
into tokens. Both drivers call [`round`][minispec.decoding.runner.SpeculativeRunner.round] --
[`minispec.speculative_generate`][minispec.decoding.loop.speculative_generate] with a batch of one,
the [`Engine`][minispec.serving.engine.Engine] with every running request -- with each row's ``k``
(from the draft-length policy: [`FixedK`][minispec.decoding.runner.FixedK] here, every row its
``k``; a policy that chooses ``k`` from measured costs wraps the round the same way), and the round
runs the phases in order::

    proposals = runner.draft(seqs, ks)                  # 1. a chain or a tree of guesses per row
    verdicts, hidden = runner.score(seqs, proposals)    # 2. ONE target forward, walk each proposal
    runner.rollback(seqs, proposals, verdicts, hidden)  # 3. keep the accepted path in both caches
    emitted = runner.emit(seqs, proposals, verdicts)    # 4. append tokens until a stop rule fires

What the round does not decide is passed in: ``forward`` (eager ``Llama.forward`` by default),
``verify`` ([`verify`][minispec.core.speculative.verify], or a student's chain verifier), drafter.

A request whose logits contain NaN or +inf, or whose drafter proposes something invalid, fails alone
(``finish_reason="error"``): it gets no verdict and no token, and the other rows go on. When a
batched ``propose`` raises, the rows' random streams are restored, the drafter rewinds, and the
batch is asked again in halves until the rows responsible are found: they fail, and every other
row drafts from the same state with the same random numbers as in a run without them. The
counters ``target_forwards`` and ``prefill_forwards`` count batched forwards, whatever the batch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from minispec.core.constraint import ask
from minispec.core.sampling import check_probs, is_int, non_finite, probs_for_rows
from minispec.core.sequence import Sequence
from minispec.core.speculative import Verdict, verify
from minispec.core.tree import Proposal, tree_size
from minispec.drafters.base import Drafter, Shape
from minispec.models.llama import Forward, Llama, TreeAttention, eager_forward

__all__ = ["DEFAULTS", "ChainVerifier", "Defaults", "FixedK", "SpeculativeRunner", "chain_verdict",
           "collaborators", "run_round"]

#: A chain verifier with the graders' signature (``ms.check.verifier``): ``verify(draft_tokens
#: [k], draft_probs [k, V] | None, target_probs [k + 1, V], generator) -> tokens`` (1..k+1 ids).
ChainVerifier = Callable[..., object]


class FixedK:
    """The core's draft-length policy: every row drafts its cap (``k``, shrunk near its limits).

    A policy wraps the round: ``round(runner, seqs, caps)`` runs it with each row's ``k``;
    ``choices`` records why and ``costs`` what it measured (nothing here); ``forget`` drops a
    finished request.
    """

    choices: tuple = ()
    costs = None

    def round(self, runner: SpeculativeRunner, seqs: list[Sequence], caps: list[int]
              ) -> list[list[int]]:
        """``runner.round(seqs, caps)``: each row drafts all it may."""
        return runner.round(seqs, caps)

    def forget(self, request_id: str) -> None:
        """Nothing is kept per request."""


class Defaults:
    """The collaborators the wings install when ``minispec`` is imported (the package's
    ``__init__``); the core alone has none: it runs eagerly, with a fixed ``k``, on token ids.

    Attributes:
        speed: ``speed(adaptive, graphs, k, chains, device) -> (policy, forward)``, the policy
            and the forward the drivers' ``adaptive=`` and ``graphs=`` name (the speed wing's
            [`collaborators`][minispec.speed.defaults.collaborators]).
        prompts: the encoder of prompts that are not token ids (text, chat messages):
            ``encode_prompt``, ``is_chat`` and ``end_of_turn_ids`` (the loading wing's module).
    """

    speed: Any = None
    prompts: Any = None


#: The collaborators the drivers use (module docstring of ``minispec.speed``).
DEFAULTS = Defaults()


def collaborators(adaptive: bool | None, graphs: bool | None, k: int, chains: bool,
                  device: torch.device) -> tuple[Any, Forward | None]:
    """The draft-length policy and the ``forward`` that ``adaptive=`` and ``graphs=`` name: the
    speed wing's choice; without it, ``FixedK`` and the eager forward.

    Raises:
        ValueError: ``adaptive`` or ``graphs`` asks for what no wing provides, or for what
            cannot be (the speed wing's checks).
    """
    if DEFAULTS.speed is not None:
        return DEFAULTS.speed(adaptive, graphs, k, chains, device)
    if adaptive or graphs:
        raise ValueError("adaptive=True and graphs=True need the speed wing (import minispec)")
    return FixedK(), None


def run_round(policy, runner: SpeculativeRunner, seqs: list[Sequence], k: int
              ) -> list[list[int]]:
    """Both drivers' round: each row may draft ``k`` (shrunk near its limits), the policy chooses
    how many it does. The tokens each row emitted."""
    return policy.round(runner, seqs, [seq.round_k(k) for seq in seqs])


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
      greedy rows walk the target's argmaxes without building distributions; a chain verifier
      passed in (``verify``) walks the chains instead, and its tokens are checked;
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
        forward: how the target runs a step (a ``Forward``: ``forward(model, cache)``); ``None``:
            eager ``Llama.forward``.
        verify: a chain verifier with the graders' signature (``ChainVerifier``) to walk every
            row instead of [`verify`][minispec.core.speculative.verify]; ``None``: the one walk.
    """

    def __init__(self, target: Llama, target_cache, drafter: Drafter | None = None,
                 branching: tuple[int, ...] | None = None, forward: Forward | None = None,
                 verify: ChainVerifier | None = None) -> None:
        if verify is not None and (branching is not None or not callable(verify)):
            raise ValueError("verify= takes a chain verifier, fn(draft_tokens, draft_probs, "
                             "target_probs, generator) -> tokens; it cannot walk draft trees")
        self.target, self.target_cache, self.drafter = target, target_cache, drafter
        self.branching, self.device, self.chain_verifier = branching, target.device, verify
        self.target_forwards = self.prefill_forwards = 0
        self.step = (forward or eager_forward)(target, target_cache)

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

    def round(self, seqs: list[Sequence], ks: list[int],
              mark: Callable[[str], None] | None = None) -> list[list[int]]:
        """One speculative round over the batch: row ``b`` drafts ``ks[b]`` (a chain of up to
        ``ks[b]`` drafts, or a tree of that depth); the tokens each row emitted.

        Four calls and nothing else: who chooses ``ks`` and what a round costs are the
        draft-length policy's business. ``mark(phase)``, if given, is called after each phase
        (``"draft"``, ``"score"``, ``"rollback"``, ``"emit"``): a policy that times the phases
        reads its own clock there.
        """
        mark = mark or (lambda phase: None)
        proposals = self.draft(seqs, ks)                          # 1. guesses, every row
        mark("draft")
        verdicts, hidden = self.score(seqs, proposals)            # 2. one target forward, walks
        mark("score")
        self.rollback(seqs, proposals, verdicts, hidden)          # 3. keep the accepted paths
        mark("rollback")
        emitted = self.emit(seqs, proposals, verdicts)            # 4. tokens out
        mark("emit")
        return emitted

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
        for seq, k in zip(seqs, ks, strict=True):
            seq.stats.k_per_round.append(k)
        if self.drafter is None or (self.branching is None and not any(ks)):
            return [Proposal.chain([]) for _ in seqs]           # a plain step
        shapes = ks if self.branching is None else [self.branching[:k] for k in ks]
        forced = {b: f for b, (seq, k) in enumerate(zip(seqs, ks, strict=True))
                  if k > 0 and (f := ask(seq, "forced", k))}             # a grammar's free drafts
        proposals = [Proposal.chain(forced.get(b, [])) for b in range(len(seqs))]
        rows = [b for b in range(len(seqs)) if b not in forced]
        drafted = self._propose([seqs[b] for b in rows], [shapes[b] for b in rows]) if rows else []
        for b, proposal in zip(rows, drafted, strict=True):
            checked = _checked(seqs[b], proposal, shapes[b], self.target.config.vocab_size)
            proposals[b] = _allowed(seqs[b], checked)
        return proposals

    def _propose(self, seqs: list[Sequence], shapes: list[Shape]) -> list[Proposal]:
        """The drafter's proposals for the batch. When the batched call raises, every row's
        random stream is put back, the drafter rewinds, and each half is asked alone (down to one
        row, which then fails): the rows responsible fail, the others draft as if alone."""
        states = [seq.generator.get_state() for seq in seqs]
        try:
            return self.drafter.propose(seqs, shapes)
        except Exception as error:
            for seq, state in zip(seqs, states, strict=True):
                seq.generator.set_state(state)
            self.drafter.rewind(seqs)
            if len(seqs) == 1:
                seqs[0].fail(error)
                return [Proposal.chain([])]
            half = len(seqs) // 2
            return (self._propose(seqs[:half], shapes[:half])
                    + self._propose(seqs[half:], shapes[half:]))

    # ------------------------------------------------------------------ 2. score

    def score(self, seqs: list[Sequence], proposals: list[Proposal]
              ) -> tuple[list[Verdict | None], Tensor | None]:
        """One target forward over every row's proposal, then each row's walk down it.

        Returns:
            One verdict per row (``None`` for a row that failed: its ``path`` holds the accepted
            nodes, its ``tokens`` the accepted drafts plus one token from the target), and the
            target's final hidden states ``(B, N, D)`` when the drafter wants them, else ``None``.
        """
        live = [b for b, seq in enumerate(seqs) if not seq.is_finished]
        verdicts: list[Verdict | None] = [None] * len(seqs)
        hidden = None
        if live:
            logits, hidden = self._verify_forward([seqs[b] for b in live],
                                                  [proposals[b] for b in live])
            # two batched reductions instead of three small ops per row: (B, N) each
            bad = non_finite(logits).tolist()
            argmax = logits.argmax(dim=-1).tolist()
            for r, b in enumerate(live):                    # logits[r]: (N_b.., V)
                n = len(proposals[b].tree)
                verdicts[b] = self._walk(seqs[b], proposals[b], logits[r, :n], argmax[r][:n],
                                         any(bad[r][:n]))
            wants = self.drafter is not None and self.drafter.wants_hidden
            hidden = dict(zip(live, hidden, strict=True)) if wants else None   # row b's features
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
        if seq.sampling.raw_argmax and self.chain_verifier is None and grammar is None:
            return verify(proposal, argmax)                 # plain greedy: argmaxes only
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
            if self.chain_verifier is not None:
                return chain_verdict(self.chain_verifier, proposal, p, seq.generator)
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
        return self.step(ids_t, pos_t, slots, tree, layers or True)


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


def chain_verdict(fn: ChainVerifier, proposal: Proposal, p: Tensor, generator) -> Verdict:
    """A chain verifier's outcome as a ``Verdict``: ``fn(draft_tokens, draft_probs, p,
    generator)`` must return 1..k+1 token ids whose first ``a`` are the drafts ``d_1..d_a``
    (Algorithm 1's shape); ``ValueError`` otherwise (the row fails, the others go on)."""
    drafts = proposal.tree.tokens[1:]
    qs = [q for draws in proposal.draws[:-1] for _, q in draws]
    q = None if any(x is None for x in qs) or not qs else torch.stack(qs)            # (k, V)
    out = fn(torch.tensor(drafts, dtype=torch.long), q, p, generator)
    out = getattr(out, "tokens", out)                 # a Verdict-like result, or the tokens
    tokens = out.tolist() if isinstance(out, Tensor) else list(out)
    a = len(tokens) - 1
    if not (0 <= a <= len(drafts) and all(is_int(t) for t in tokens)
            and tokens[:a] == drafts[:a] and 0 <= tokens[-1] < p.shape[-1]):
        raise ValueError(f"the verifier returned {tokens!r} for the drafts {drafts}: expected "
                         f"1..{len(drafts) + 1} token ids, the first ones the accepted drafts")
    return Verdict(tokens, list(range(1, a + 1)), None, [], a == len(drafts))


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
