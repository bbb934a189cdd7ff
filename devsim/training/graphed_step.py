"""The batched step replayed from CUDA graphs captured from the eager step, one graph per input shape.

:class:`GraphedStep` wraps a :data:`devsim.training.flat_step.Step` (``step(params, buffers, inputs, targets)``).
The first call of a shape copies its arguments into static tensors of its own, runs the eager step there a few
times on a side stream (cuDNN and cuBLAS pick their kernels, the caching allocator settles), and captures one
more run into a ``torch.cuda.CUDAGraph``. Every call then copies its arguments into that shape's static inputs,
replays the graph (one launch for the forward and backward pass of every device), and copies the buffers the
forward pass updated in place (BatchNorm's running statistics) back into the tensors it was given.

Against ``torch.compile(mode="reduce-overhead")`` this keeps eager's kernels, so a replay computes what the eager
step computes (on an H200 the deltas of groups of 2 and 4 were bit-identical, of 10 within 6.7e-8: cuDNN's own
run-to-run nondeterminism), and a shape costs the capture (a few eager steps, milliseconds) instead of a
compilation (seconds each). It does not fuse kernels.

The outputs (gradients, losses, model outputs) are the graph's static tensors: each call's outputs are
overwritten by the next call of the same shape, so a caller uses them before it calls again, as
:class:`devsim.training.batched._Lockstep` does (the optimizer reads the gradients at once). Calls of one
instance must not overlap (one worker thread owns a trainer).

``capture=False`` keeps every step of the mechanism but the graph (the step runs eagerly on the static tensors):
the CPU's tests check the copying in and out with it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from devsim.training.flat_step import Step

__all__ = ["GRAPH_OPTIONS", "GraphedStep", "WARMUP_RUNS"]

GRAPH_OPTIONS = {"cuda_graphs": True}
"""The ``compile_options`` of :class:`devsim.training.batched.BatchedTrainer` that select :class:`GraphedStep`
(every other dict goes to ``torch.compile``)."""

WARMUP_RUNS = 3
"""Eager runs of a new shape on the side stream before its capture (PyTorch's whole-network capture example uses 3)."""


@dataclass
class _Captured:
    """One shape's static arguments, its graph (None without capture) and the outputs the graph writes."""

    params: tuple[torch.Tensor, ...]
    buffers: tuple[torch.Tensor, ...]
    inputs: torch.Tensor
    targets: torch.Tensor
    graph: torch.cuda.CUDAGraph | None
    outputs: tuple


def _key(tensors: Sequence[torch.Tensor]) -> tuple:
    return tuple((tuple(t.shape), t.dtype, t.device) for t in tensors)


def _copy_into(static: Sequence[torch.Tensor], given: Sequence[torch.Tensor]) -> None:
    if static:
        torch._foreach_copy_(list(static), list(given))


class GraphedStep:
    """``step`` replayed from a CUDA graph per argument shape (see the module docstring).

    Args:
        step: the eager batched step, pure but for in-place buffer updates.
        capture: capture CUDA graphs (True needs the arguments on a CUDA device); False runs ``step`` on the
            static tensors (the mechanism without the graph, for tests).
        warmup: eager runs of a new shape before its capture.
    """

    def __init__(self, step: Step, capture: bool = True, warmup: int = WARMUP_RUNS):
        self.step = step
        self.capture = capture
        self.warmup = warmup
        self._shapes: dict[tuple, _Captured] = {}

    @property
    def shapes(self) -> int:
        """Shapes captured so far (one graph each)."""
        return len(self._shapes)

    def __call__(
        self,
        params: tuple[torch.Tensor, ...],
        buffers: tuple[torch.Tensor, ...],
        inputs: torch.Tensor,
        targets: torch.Tensor,
    ):
        key = _key([*params, *buffers, inputs, targets])
        entry = self._shapes.get(key)
        if entry is None:
            entry = self._shapes[key] = self._build(params, buffers, inputs, targets)
        _copy_into(entry.params, params)
        _copy_into(entry.buffers, buffers)
        entry.inputs.copy_(inputs)
        entry.targets.copy_(targets)
        if entry.graph is not None:
            entry.graph.replay()
            outputs = entry.outputs
        else:
            outputs = self.step(entry.params, entry.buffers, entry.inputs, entry.targets)
        _copy_into(buffers, entry.buffers)
        return outputs

    def _build(self, params, buffers, inputs, targets) -> _Captured:
        static = _Captured(
            tuple(t.detach().clone() for t in params),
            tuple(t.detach().clone() for t in buffers),
            inputs.detach().clone(),
            targets.detach().clone(),
            None,
            (),
        )
        if not self.capture:
            return static
        if inputs.device.type != "cuda":
            raise ValueError(f"CUDA graphs need the step's tensors on a CUDA device, got {inputs.device}")
        side = torch.cuda.Stream(device=inputs.device)
        side.wait_stream(torch.cuda.current_stream(inputs.device))
        with torch.cuda.stream(side):
            for _ in range(self.warmup):
                self.step(static.params, static.buffers, static.inputs, static.targets)
        torch.cuda.current_stream(inputs.device).wait_stream(side)  # the warm-up's buffer updates are overwritten:
        graph = torch.cuda.CUDAGraph()  # every call copies its own buffers in before the replay
        side.wait_stream(torch.cuda.current_stream(inputs.device))
        with torch.cuda.stream(side):  # torch.cuda.graph() without its synchronize, gc.collect() and empty_cache()
            graph.capture_begin(capture_error_mode="thread_local")
            try:
                static.outputs = self.step(static.params, static.buffers, static.inputs, static.targets)
            finally:
                graph.capture_end()
        torch.cuda.current_stream(inputs.device).wait_stream(side)
        static.graph = graph
        return static
