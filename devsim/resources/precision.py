"""How a process's CUDA work computes float32: TF32 or not (``--tf32``), and whether cuDNN times its algorithms per
shape (``--cudnn-benchmark``)."""

from __future__ import annotations

import torch

__all__ = ["apply_cudnn_benchmark", "apply_tf32"]


def apply_tf32(enabled: bool) -> str:
    """Let (``enabled``) or forbid float32 matmuls and cuDNN convolutions to run as TF32 in this process.

    Sets ``torch.backends.cuda.matmul.allow_tf32`` and ``torch.backends.cudnn.allow_tf32`` (both process-wide);
    harmless without CUDA. Returns a short description for start-up logs.
    """
    torch.backends.cuda.matmul.allow_tf32 = bool(enabled)
    torch.backends.cudnn.allow_tf32 = bool(enabled)
    return f"tf32 {'on' if enabled else 'off'} (matmul and cuDNN)"


def apply_cudnn_benchmark(enabled: bool) -> str:
    """Let cuDNN time every convolution algorithm the first time it meets a shape and keep the fastest (``enabled``),
    or take its heuristic's choice (PyTorch's default). Sets ``torch.backends.cudnn.benchmark`` (process-wide);
    harmless without CUDA. The search costs time at each new shape (a batched leaf meets a handful: its group
    sizes); the chosen algorithms may differ from run to run, so float32 rounding may too. Returns a short
    description for start-up logs."""
    torch.backends.cudnn.benchmark = bool(enabled)
    return f"cuDNN benchmark {'on' if enabled else 'off'}"
