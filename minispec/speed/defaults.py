"""The speed wing's defaults: what ``adaptive=`` and ``graphs=`` name in both drivers.

``minispec``'s ``__init__`` installs [`collaborators`][minispec.speed.defaults.collaborators] as
the core's ``DEFAULTS.speed``: the engine then chooses goodput ``k`` for chains by default, and
runs static-shape steps (CUDA graphs) on a GPU; ``speculative_generate`` drafts a fixed ``k``
unless ``adaptive=True``.
"""

from __future__ import annotations

import torch

from minispec.decoding.runner import FixedK
from minispec.speed.goodput import GoodputK
from minispec.speed.static_step import StaticForwards

__all__ = ["collaborators", "forward_for", "policy_for"]


def collaborators(adaptive: bool | None, graphs: bool | None, k: int, chains: bool,
                  device: torch.device) -> tuple[GoodputK | FixedK, StaticForwards | None]:
    """The policy (``policy_for``) and the forward (``forward_for``) the two flags name."""
    return policy_for(adaptive, k, chains), forward_for(graphs, device)


def policy_for(adaptive: bool | None, k: int, chains: bool) -> GoodputK | FixedK:
    """Both drivers' draft-length policy: ``GoodputK(k)`` (``k`` the upper bound) for chains of
    drafts unless ``adaptive=False``; ``FixedK`` (every round drafts ``k``) with
    ``adaptive=False``, without a drafter (``k = 0``) or for trees, whose depth is fixed.

    Raises:
        ValueError: ``adaptive`` is not ``True``, ``False`` or ``None``, or ``adaptive=True`` has
            no chain length to choose.
    """
    if adaptive is not None and not isinstance(adaptive, bool):
        raise ValueError(f"adaptive must be True, False or None, got {adaptive!r}")
    if adaptive and not (k > 0 and chains):
        raise ValueError("adaptive=True chooses the length of a chain of drafts: it needs a "
                         "drafter and no branching")
    return FixedK() if adaptive is False or not (k > 0 and chains) else GoodputK(k)


def forward_for(graphs: bool | None, device: torch.device) -> StaticForwards | None:
    """The ``forward`` for ``graphs``: static-shape steps when ``True`` (``None``: on a GPU),
    else ``None`` (eager).

    Raises:
        ValueError: ``graphs`` is not ``True``, ``False`` or ``None``.
    """
    if graphs is not None and not isinstance(graphs, bool):
        raise ValueError(f"graphs must be True, False or None, got {graphs!r}")
    return StaticForwards() if (device.type == "cuda" if graphs is None else graphs) else None
