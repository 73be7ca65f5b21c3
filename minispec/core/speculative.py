"""Speculative sampling and verification: the accept rule, and the one walk that applies it.

Notation (Leviathan et al. 2023): ``p`` is the target distribution, ``q`` the draft distribution,
both over a vocabulary of ``V`` tokens and both *after* the same sampling adjustments
([`minispec.core.sampling.probs_from_logits`][minispec.core.sampling.probs_from_logits]). ``k``
(gamma in the paper) is the number of draft tokens checked in one round.

The one rule everything here is built from (Leviathan §2.3, Stratos §1):

* draw ``x ~ q``; accept it iff ``u < p(x) / q(x)`` for ``u ~ U[0, 1)``;
* on rejection, draw from the residual ``norm(max(0, p - q))``.

The accepted-or-resampled token is distributed exactly as ``p`` (Leviathan App. A.1). Several
proposals at one position are tried in turn, each against what the earlier rejections left
(iterative speculative sampling, Stratos §2). [`verify`][minispec.core.speculative.verify] walks a
round's [`Proposal`][minispec.core.tree.Proposal] -- a chain (Algorithm 1) or a tree (SpecInfer)
-- from the root, applying that rule at every node: it is what both drivers run, for every row.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from minispec.core.sampling import check_probs, one_hot, sample
from minispec.core.tree import Proposal

__all__ = ["Draft", "IterativeResult", "Verdict", "iterative_speculative_sample", "residual",
           "speculate", "speculative_sample", "verify"]

Draws = Sequence[tuple[int, Tensor | None]]     # (token x_j, the q_j it was drawn from, or None)


@dataclass(frozen=True)
class Draft:
    """Proposed tokens and the distributions they were drawn from, for one context: what a
    one-context ``draft(context, k, sampling, generator)`` returns (the graders' drafter form);
    ``Proposal.chain(draft.tokens, draft.probs)`` makes it the chain that
    [`verify`][minispec.core.speculative.verify] walks.

    Attributes:
        tokens: ``[n]`` int64, ``0 <= n <= k`` guesses.
        probs: ``[n, V]`` row ``i`` is the ``q`` token ``i`` was drawn from, or ``None`` when the
            drafter is deterministic (one-hot ``q``).
    """

    tokens: Tensor
    probs: Tensor | None = None

    def __len__(self) -> int:
        return int(self.tokens.shape[0])


def residual(p: Tensor, q: Tensor) -> Tensor:
    """The residual distribution ``norm(max(0, p - q))`` used after a rejection.

    Args:
        p: ``[..., V]`` target probabilities.
        q: ``[..., V]`` draft probabilities (broadcastable to ``p``).

    Returns:
        The normalised excess of ``p`` over ``q``, ``[..., V]``. Where ``p == q`` the excess is all
        zeros; there a rejection has probability 0 (every ``x`` with ``q(x) > 0`` is accepted), so
        the row is never used and we return ``p`` itself instead of dividing by zero.

    Raises:
        ValueError: when ``p`` or ``q`` is not a distribution (NaN, negative, rows not summing
            to 1).
    """
    check_probs(p, "p")
    check_probs(q, "q")
    return _residual(p, q)


def _residual(p: Tensor, q: Tensor) -> Tensor:
    """[`residual`][minispec.core.speculative.residual] on inputs already checked (the verify loop's
    inner step)."""
    excess = (p - q).clamp_min(0)                                     # (..., V)
    mass = excess.sum(dim=-1, keepdim=True)                           # (..., 1)
    safe_mass = mass.clamp_min(torch.finfo(excess.dtype).tiny)
    return torch.where(mass > 0, excess / safe_mass, p.expand_as(excess))


def _uniform_stream(uniforms: Iterable[float] | None, generator: torch.Generator | None,
                    device: torch.device) -> Iterator[Tensor]:
    """Yield ``u ~ U[0, 1)`` one at a time, from ``uniforms`` when given, else from
    ``generator``."""
    if uniforms is not None:
        for u in uniforms:
            yield torch.as_tensor(float(u), device=device)
        raise ValueError("ran out of the uniforms that were passed in")
    while True:
        yield torch.rand((), generator=generator, device=device)


def speculate(p: Tensor, proposals: Draws, us: Iterator[Tensor], tested: list[float]
              ) -> tuple[int | None, Tensor]:
    """The rule at one position: try ``proposals`` in order, each against what ``p`` has left.

    Proposal ``j`` (token ``x_j`` drawn from ``q_j``; ``q_j = None`` is one-hot) is kept iff
    ``u < p_left(x_j) / q_j(x_j)``, where ``p_left`` is what ``p`` has left after the earlier
    rejections: each one sets ``p_left = norm(max(0, p_left - q_j))`` (Stratos §2; with one
    proposal, Leviathan's rule). Appends ``min(1, p_{j-1}(x_j) / q_j(x_j))``
    of every test to ``tested``.

    Returns:
        ``(index of the kept proposal or None, the distribution left)``: on ``None`` the token is
        drawn from what is left; it has the law ``p``.
    """
    for j, (x, q) in enumerate(proposals):
        p_x, q_x = float(p[x]), 1.0 if q is None else float(q[x])
        if q_x <= 0:
            raise ValueError(f"proposal {j} is token {x} but its q gives it probability 0: q "
                             "must be the distribution the token was actually drawn from")
        tested.append(min(1.0, p_x / q_x))
        # u < p(x) / q(x), strict and without a division: with u = 0, p(x) = 0 is still rejected
        if float(next(us)) * q_x < p_x:
            return j, p
        if q is None:
            q = one_hot(torch.tensor(x, device=p.device), p.shape[-1]).to(p.dtype)
        p = _residual(p, q)       # speculate on what the target has left
    return None, p


def speculative_sample(p: Tensor, q: Tensor, generator: torch.Generator | None = None
                       ) -> tuple[int, bool]:
    """One token of speculative sampling: propose from ``q``, keep it or resample (Stratos §1).

    Args:
        p: ``[V]`` target distribution.
        q: ``[V]`` draft distribution.
        generator: random stream (``None``: torch's global one).

    Returns:
        The token, distributed exactly as ``p``, and whether it was the draft's proposal
        (``P(accepted) = sum_x min(p(x), q(x))``, Leviathan Thm 3.5).
    """
    if p.ndim != 1 or p.shape != q.shape:
        raise ValueError(f"p and q must both be [V] with the same V, got {tuple(p.shape)} and "
                         f"{tuple(q.shape)}")
    result = iterative_speculative_sample(p, q[None], generator)     # one proposal: K = 1
    return result.token, result.accepted_index is not None


@dataclass(frozen=True)
class IterativeResult:
    """Outcome of
    [`iterative_speculative_sample`][minispec.core.speculative.iterative_speculative_sample].

    Attributes:
        token: the emitted token (law ``p``).
        accepted_index: which proposal was accepted, or ``None`` if all were rejected.
        final_probs: ``[V]`` the residual the token was drawn from after all rejections (or the
            ``p_{j-1}`` the accepted proposal was tested against).
        accept_probs: ``min(1, p_{j-1}(x_j) / q_j(x_j))`` for each proposal tested, in order.
    """

    token: int
    accepted_index: int | None
    final_probs: Tensor
    accept_probs: list[float]


def iterative_speculative_sample(p: Tensor, qs: Tensor, generator: torch.Generator | None = None,
                                 *, proposals: Sequence[int] | None = None,
                                 uniforms: Iterable[float] | None = None) -> IterativeResult:
    """Iterative speculative sampling with proposals ``q_1..q_K`` (Stratos §2): the rule
    [`verify`][minispec.core.speculative.verify] applies at a node with ``K`` children.

    Args:
        p: ``[V]`` target distribution.
        qs: ``[K, V]`` proposal distributions (they may repeat).
        generator: random stream.
        proposals: ``[K]`` tokens ``x_j ~ q_j`` already drawn (drawn here when ``None``).
        uniforms: acceptance uniforms to use instead of drawing them, consumed in order.

    Returns:
        An [`IterativeResult`][minispec.core.speculative.IterativeResult] whose token has law
        ``p``.
    """
    if p.ndim != 1 or qs.ndim != 2 or qs.shape[1] != p.shape[0]:
        raise ValueError(f"expected p [V] and qs [K, V], got {tuple(p.shape)} and "
                         f"{tuple(qs.shape)}")
    check_probs(p, "p")
    check_probs(qs, "qs")
    if proposals is None:
        proposals = [int(sample(q, generator)) for q in qs]
    if len(proposals) != qs.shape[0]:
        raise ValueError(f"got {len(proposals)} proposals for {qs.shape[0]} distributions")
    tested: list[float] = []
    us = _uniform_stream(uniforms, generator, p.device)
    j, left = speculate(p, list(zip(proposals, qs, strict=True)), us, tested)
    token = proposals[j] if j is not None else int(sample(left, generator))
    return IterativeResult(token, j, left, tested)


@dataclass(frozen=True)
class Verdict:
    """The outcome of [`verify`][minispec.core.speculative.verify] on one row.

    Attributes:
        tokens: the tokens to append: the accepted drafts along ``path``, then one token drawn at
            the last node reached -- the correction from the residual after a rejection, or the
            bonus token from the target's row when the walk reached a leaf.
        path: the accepted nodes, root excluded (on a chain: ``1..num_accepted``).
        final_probs: ``[V]`` the distribution the last token was drawn from (one-hot in greedy
            mode; ``None`` when the walk was given argmaxes only).
        accept_probs: ``min(1, p(x) / q(x))`` of every test made, in order (sampled mode).
        bonus: whether every draft on the path was accepted to a leaf, so the last token is the
            free bonus token.
    """

    tokens: list[int]
    path: list[int]
    final_probs: Tensor | None
    accept_probs: list[float]
    bonus: bool

    @property
    def num_accepted(self) -> int:
        """How many draft tokens were accepted (the depth of the accepted path)."""
        return len(self.path)


def verify(proposal: Proposal, target: Tensor | Sequence[int],
           generator: torch.Generator | None = None, *, greedy: bool | None = None,
           uniforms: Iterable[float] | None = None) -> Verdict:
    """The accept walk: what both drivers run on every row, for chains and trees alike.

    From the root, the draws made at the current node are tried in draw order by
    [`speculate`][minispec.core.speculative.speculate] (on a chain: Algorithm 1's one test per
    position, Leviathan et al.; on a tree: SpecInfer's iterative rule); the first kept one is the
    next node. When every draw there is rejected, or the node is a leaf, one last token is drawn
    from what is left, and the emitted tokens have the target's law (Stratos §2). Greedy
    (Stratos App. A): step to the child whose token is the target's argmax while there is one, then
    emit that argmax.

    Args:
        proposal: the round's drafts ([`Proposal.chain`][minispec.core.tree.Proposal.chain], or a
            tree).
        target: ``[N, V]`` the target's ``p`` at the root (row 0) and at every node; or, for
            greedy decoding, the ``N`` argmax ids alone (nothing is drawn).
        generator: random stream for the uniforms and the last draw.
        greedy: exact-match mode; ``None`` picks it when every target row is one-hot.
        uniforms: acceptance uniforms to use instead of drawing them, consumed in order (for
            teaching and for exact enumeration in tests).

    Returns:
        A [`Verdict`][minispec.core.speculative.Verdict]: the accepted path and its tokens, plus
        one more token.
    """
    best = _check_target(proposal, target)             # the argmaxes, when they decide
    greedy = best is not None if greedy is None else greedy
    if not greedy and not isinstance(target, Tensor):
        raise ValueError("sampled verification needs the target's distributions, not argmaxes")
    if greedy and best is None:
        best = target.argmax(dim=-1).tolist()
    tokens, node, path, tested = proposal.tree.tokens, 0, [], []
    us = None if greedy else _uniform_stream(uniforms, generator, target.device)
    while True:
        draws = proposal.draws[node]
        if greedy:                  # the child that is the target's own choice, if one is
            kept = next((j for j, (c, _) in enumerate(draws) if tokens[c] == best[node]), None)
        else:                       # each draw against what p has left after the earlier ones
            kept, left = speculate(target[node], [(tokens[c], q) for c, q in draws], us, tested)
        if kept is None:
            break
        node = draws[kept][0]
        path.append(node)
    if greedy:
        last = best[node]
        final = (one_hot(torch.tensor(last), target.shape[-1]).to(target.dtype)
                 if isinstance(target, Tensor) else None)
    else:
        last, final = int(sample(left, generator)), left
    return Verdict([tokens[i] for i in path] + [last], path, final, tested, not draws)


def _check_target(proposal: Proposal, target: Tensor | Sequence[int]) -> list[int] | None:
    """Check ``target`` against the proposal; the argmax ids when they decide (argmaxes given, or
    every row one-hot), else ``None``."""
    n = len(proposal.tree)
    if not isinstance(target, Tensor):
        if len(target) != n:
            raise ValueError(f"got {len(target)} argmax ids for a tree of {n} nodes")
        return [int(t) for t in target]
    if target.ndim != 2 or target.shape[0] != n:
        raise ValueError(f"target must be [N, V] with N = {n} (the root and every node), "
                         f"got {tuple(target.shape)}")
    V = target.shape[-1]
    if any(not 0 <= t < V for t in proposal.tree.tokens[1:]):
        raise ValueError(f"draft tokens must lie in [0, {V})")
    if any(q is not None and q.shape != (V,) for draws in proposal.draws for _, q in draws):
        raise ValueError(f"every draft q must be a [V] = [{V}] distribution, as the target's rows")
    check_probs(target, "target")
    one_hot_rows = bool((target.amax(dim=-1) == 1).all())
    return target.argmax(dim=-1).tolist() if one_hot_rows else None
