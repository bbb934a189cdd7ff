"""Set-up compute on one torch thread, so that it cannot slow the training threads that come after it.

PyTorch's CPU kernels parallelise with OpenMP, and every OS thread that runs a parallel region gets its own team
of helper threads, which stays behind. When a process's main (or set-up) thread runs model code with N > 1 torch
threads and device workers later train in other threads, the two teams compete for the cores: measured on this
2-core machine, the small CNN trained 3.2x slower in a worker thread after one forward pass had run in the main
thread at 2 torch threads (13,500 -> 4,200 samples/s), and at full speed when that forward pass ran at 1 thread.
Task checks, the batching probe and memory estimates run here, once, before training starts.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def one_torch_thread() -> Iterator[None]:
    """Run the block with ``torch.set_num_threads(1)`` and restore the previous count afterwards."""
    previous = torch.get_num_threads()
    if previous == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
