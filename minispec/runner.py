"""One speculative round, written once: prefill, draft, verify, roll back, emit.

[`SpeculativeRunner`][minispec.runner.SpeculativeRunner] owns the target model, its KV cache and the
drafter, and turns a batch of [`Sequence`][minispec.sequence.Sequence] objects into tokens. Both
decoding loops call its phases in the same order --
[`minispec.speculative_generate`][minispec.decoding.speculative_generate] with a batch of one, the
[`Engine`][minispec.engine.Engine] with every running request::

    drafts = runner.draft(seqs, ks)                     # 1. k_b guesses per row (+ q)
    verdicts, hidden = runner.verify(seqs, drafts)      # 2. ONE target forward, accept / reject
    runner.rollback(seqs, verdicts, hidden)             # 3. truncate both caches to n + accepted
    emitted = runner.emit(seqs, drafts, verdicts)       # 4. append tokens until a stop rule fires

so every rule of a round exists once: the verify forward (row ``b`` feeds ``[last, d_1..d_kb]`` at
positions ``n_b-1..``), the accept rule (greedy rows compare argmaxes, sampled rows go through
[`verify_batch`][minispec.speculative.verify_batch] with their own generators), the NaN check, the
rollback of both caches, the drafter's hook, the stop rules (in
[`Sequence.append`][minispec.sequence.Sequence.append]) and the statistics.

A request whose logits contain NaN fails alone (``finish_reason="error"``): it gets no verdict and
no token, and the other rows go on. The counters ``target_forwards``, ``draft_forwards`` and
``prefill_forwards`` count batched forwards, whatever the batch size.
"""

from __future__ import annotations

import time

import torch
from torch import Tensor

from minispec.drafters import Drafter
from minispec.model import Llama
from minispec.sampling import one_hot, probs_for_rows
from minispec.sequence import Sequence
from minispec.speculative import Draft, GreedyVerdict, Verdict, verify_batch, verify_greedy

__all__ = ["SpeculativeRunner"]


class SpeculativeRunner:
    """The phases of a speculative round over a batch of sequences (module docstring).

    Args:
        target: the target model ``p``; the runner works on its device.
        target_cache: its KV cache; each sequence's slot is ``seq.slot``, reserved for the round.
        drafter: a batched [`Drafter`][minispec.drafters.Drafter], or ``None`` (plain decoding).
    """

    def __init__(self, target: Llama, target_cache, drafter: Drafter | None = None) -> None:
        self.target, self.target_cache, self.drafter = target, target_cache, drafter
        self.device = target.device
        self.target_forwards = self.prefill_forwards = 0

    @property
    def draft_forwards(self) -> int:
        """Batched draft-model forwards so far (lazy prefills included; 0 without a model)."""
        return getattr(self.drafter, "forwards", 0)

    def prefill(self, seqs: list[Sequence], budgets: list[int] | None = None) -> None:
        """Batched target prefill of each ``context[:-1]`` (right-padded); logits are discarded.

        Each row continues where its prefill stopped (``seq.num_cached``) and feeds at most
        ``budgets[b]`` tokens (chunked prefill; default: all that is left). A drafter with
        ``observe_prefill`` (an EAGLE head) gets the target's hidden states of the prefilled
        positions: ``observe_prefill(seqs, starts, hidden)``, ``hidden[b]`` of shape ``(T_b, D)``.
        """
        rows = []
        for b, seq in enumerate(seqs):
            start, end = seq.num_cached, seq.num_tokens - 1
            if budgets is not None:
                end = min(end, start + budgets[b])
            if end > start:
                rows.append((seq, start, seq.context[start:end]))
        if not rows:
            return
        width = max(len(ids) for _, _, ids in rows)
        ids = [t + [0] * (width - len(t)) for _, _, t in rows]
        pos = [list(range(s, s + len(t))) + [-1] * (width - len(t)) for _, s, t in rows]
        hook = getattr(self.drafter, "observe_prefill", None)   # a drafter reading the features
        out = self._forward(ids, pos, [seq.slot for seq, _, _ in rows], return_hidden=hook is not None)
        self.prefill_forwards += 1
        if hook is not None:
            hook([seq for seq, _, _ in rows], [s for _, s, _ in rows],
                 [out[1][r, :len(t)] for r, (_, _, t) in enumerate(rows)])          # (T_b, D) each
        for seq, _, t in rows:
            seq.num_cached += len(t)
            seq.stats.prefill_tokens += len(t)

    # ------------------------------------------------------------------ 1. draft

    def draft(self, seqs: list[Sequence], ks: list[int]) -> list[Draft]:
        """Up to ``ks[b]`` draft tokens per row from the drafter (none without one)."""
        t0 = time.perf_counter()
        if self.drafter is None:
            drafts = [Draft(torch.zeros(0, dtype=torch.long)) for _ in seqs]
        else:
            drafts = self.drafter.propose_batch(seqs, ks)
        elapsed = time.perf_counter() - t0
        for seq in seqs:
            seq.stats.draft_time += elapsed                     # the batch's time, shared
        return drafts

    # ------------------------------------------------------------------ 2. verify

    def verify(self, seqs: list[Sequence], drafts: list[Draft]) -> tuple[list, Tensor | None]:
        """One target forward over ``[B, K+1]``, then each row's verdict (``None`` if it failed).

        Returns:
            The verdicts, one per row (``None`` for a row that failed; a verdict has ``tokens``,
            1..k_b+1 ids, and ``num_accepted``), and the target's last hidden states
            ``(B, K+1, D)`` when the drafter wants them, else ``None``.
        """
        t0 = time.perf_counter()
        tokens = [d.tokens.tolist() for d in drafts]
        logits, hidden = self._verify_forward(seqs, tokens)                  # (B, K+1, V)
        verdicts = self._accept(seqs, drafts, tokens, logits)
        elapsed = time.perf_counter() - t0
        for seq in seqs:
            seq.stats.verify_time += elapsed
        return verdicts, hidden

    def _verify_forward(self, seqs: list[Sequence], tokens: list[list[int]]) -> tuple[Tensor, Tensor | None]:
        """Row b feeds ``[last, d_1..d_kb]`` at positions ``n_b-1..`` (padding: position -1)."""
        width = 1 + max(len(t) for t in tokens)
        ids, pos = [], []
        for seq, t in zip(seqs, tokens, strict=True):
            row, pad, n = [seq.context[-1]] + t, width - 1 - len(t), seq.num_tokens
            ids.append(row + [0] * pad)
            pos.append(list(range(n - 1, n - 1 + len(row))) + [-1] * pad)
        self.target_forwards += 1
        wants_hidden = bool(getattr(self.drafter, "wants_hidden", False))
        out = self._forward(ids, pos, [s.slot for s in seqs], wants_hidden)
        return out if wants_hidden else (out, None)

    def _accept(self, seqs: list[Sequence], drafts: list[Draft], tokens: list[list[int]],
                logits: Tensor) -> list[Verdict | GreedyVerdict | None]:
        """The accept rule per row: greedy rows compare argmaxes, the others go through
        ``verify_batch``, one call per group of rows with the same number of drafts."""
        verdicts: list = [None] * len(seqs)
        width = torch.tensor([len(t) + 1 for t in tokens], device=logits.device)       # (B,)
        valid = torch.arange(logits.shape[1], device=logits.device)[None] < width[:, None]
        nan = (torch.isnan(logits).any(dim=-1) & valid).any(dim=-1).tolist()         # (B,)
        for seq, bad in zip(seqs, nan, strict=True):
            if bad:
                seq.fail(ValueError("logits contain NaN"))      # an error for this request alone
        fast = [b for b, s in enumerate(seqs) if s.sampling.raw_argmax and not nan[b]]
        best = logits[fast].argmax(dim=-1).tolist() if fast else []                    # (F, K+1)
        for b, row in zip(fast, best, strict=True):
            verdicts[b] = verify_greedy(tokens[b], row)
        groups: dict[int, list[int]] = {}
        for b in range(len(seqs)):
            if verdicts[b] is None and not nan[b]:
                groups.setdefault(len(tokens[b]), []).append(b)
        for k, rows in groups.items():
            for b, v in zip(rows, self._verify_group(seqs, drafts, tokens, logits, rows, k), strict=True):
                verdicts[b] = v
        return verdicts

    def _verify_group(self, seqs, drafts, tokens, logits: Tensor, rows: list[int], k: int) -> list[Verdict]:
        """``verify_batch`` on rows with ``k`` drafts each; row b, position t: p(. | context, d_1..d_t)."""
        V = logits.shape[-1]
        draft_tokens = torch.tensor([tokens[b] for b in rows], dtype=torch.long,
                                    device=self.device).reshape(len(rows), k)         # (G, k)
        q = None
        if k > 0 and any(drafts[b].probs is not None for b in rows):
            q = torch.stack([_q_or_one_hot(drafts[b], V, self.device) for b in rows])  # (G, k, V)
        p = torch.stack([
            probs_for_rows(logits[b, :k + 1], [seqs[b].sampling] * (k + 1),
                           [seqs[b].context + tokens[b][:t] for t in range(k + 1)])
            for b in rows])                                                            # (G, k+1, V)
        return verify_batch(draft_tokens, q, p, [seqs[b].generator for b in rows])

    # ------------------------------------------------------------------ 3. roll back

    def rollback(self, seqs: list[Sequence], verdicts: list, hidden: Tensor | None = None) -> None:
        """Keep ``[.., last, accepted drafts]`` (``n + a`` positions) in the target cache; let the
        drafter roll its own state back and see the hidden states of the accepted positions only."""
        live = [b for b, v in enumerate(verdicts) if v is not None]
        for b in live:
            self.target_cache.truncate_to(seqs[b].slot, seqs[b].num_tokens + verdicts[b].num_accepted)
        if self.drafter is not None and live:
            accepted = [verdicts[b].num_accepted for b in live]
            states = None if hidden is None else [hidden[b, :a + 1] for b, a in zip(live, accepted, strict=True)]
            self.drafter.observe([seqs[b] for b in live], accepted, states)

    # ------------------------------------------------------------------ 4. emit

    def emit(self, seqs: list[Sequence], drafts: list[Draft], verdicts: list) -> list[list[int]]:
        """Append each verdict's tokens to its sequence (stop rules apply); the emitted tokens."""
        emitted = []
        for seq, draft, verdict in zip(seqs, drafts, verdicts, strict=True):
            if verdict is None:                       # failed in this round: nothing to emit
                emitted.append([])
                continue
            seq.stats.record_round(len(draft), verdict.num_accepted)
            emitted.append(seq.append(verdict.tokens, draft.tokens.tolist(), verdict.num_accepted))
            seq.num_cached = seq.num_tokens - 1       # the cache holds all but the newest token
        return emitted

    # ------------------------------------------------------------------ helpers

    def _forward(self, ids: list[list[int]], pos: list[list[int]], slots: list[int],
                 return_hidden: bool = False):
        """The target on (B, T) ids at (B, T) positions (-1 = padding) of cache ``slots``."""
        ids_t = torch.tensor(ids, dtype=torch.long, device=self.device)          # (B, T)
        pos_t = torch.tensor(pos, dtype=torch.long, device=self.device)          # (B, T)
        return self.target(ids_t, pos_t, self.target_cache, slots, return_hidden=return_hidden)



def _q_or_one_hot(draft: Draft, vocab_size: int, device: torch.device) -> Tensor:
    """A row's q ``(k, V)``; one-hot at the drafts when the drafter is deterministic."""
    if draft.probs is not None:
        return draft.probs.to(device)
    return one_hot(draft.tokens.to(device), vocab_size)
