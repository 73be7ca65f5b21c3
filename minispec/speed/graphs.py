"""CUDA graphs: record a static step's kernels once, replay them with one launch.

A decode step of a small model is hundreds of small kernels; launched one by one from Python,
the host sets the pace and the GPU idles between them. A CUDA graph records the kernels of one
call -- with the addresses of every tensor they touch -- and replays them all from one launch.
That is why the step it records reads only preallocated buffers
([`StaticStep`][minispec.speed.static_step.StaticStep]): before each replay the new inputs are
copied into the same buffers, and the outputs appear in the same output tensors.

One graph per step (a bucket ``(B, T, S)`` of one model: the target's, or a draft model's that
shares its pool), captured the first time the step runs, all in one memory pool (the steps run
one at a time and their outputs are copied out, so they can share their temporaries). Capture
follows PyTorch's recipe: run the step once on a side stream first (it allocates its workspaces
and warms the kernels up), then record it.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["CudaGraphs"]


class CudaGraphs:
    """Captured steps, sharing one memory pool.

    Attributes: graphs -- step -> (the graph, its output tensors).
    """

    def __init__(self) -> None:
        self.graphs: dict[object, tuple[torch.cuda.CUDAGraph, tuple[Tensor, ...]]] = {}
        self.pool = None                       # the memory pool every graph allocates from

    def run(self, step) -> tuple[Tensor, ...]:
        """Replay ``step``'s graph (capturing it on first use); its output tensors, which the
        next replay of the same bucket overwrites."""
        if step not in self.graphs:
            self.graphs[step] = self._capture(step)
        graph, outputs = self.graphs[step]
        graph.replay()
        return outputs

    def _capture(self, step) -> tuple[torch.cuda.CUDAGraph, tuple[Tensor, ...]]:
        """Warm ``step.run`` up on a side stream, then record it into the shared pool. Both
        runs write the same keys and values to the same cache entries as the replay will."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            step.run()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            outputs = step.run()
        self.pool = graph.pool()
        return graph, outputs
