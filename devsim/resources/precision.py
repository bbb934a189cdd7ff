"""Float32 precision of a process's CUDA work (``--tf32``)."""

from __future__ import annotations

import torch

__all__ = ["apply_tf32"]


def apply_tf32(enabled: bool) -> str:
    """Let (``enabled``) or forbid float32 matmuls and cuDNN convolutions to run as TF32 in this process.

    Sets ``torch.backends.cuda.matmul.allow_tf32`` and ``torch.backends.cudnn.allow_tf32`` (both process-wide);
    harmless without CUDA. Returns a short description for start-up logs.
    """
    torch.backends.cuda.matmul.allow_tf32 = bool(enabled)
    torch.backends.cudnn.allow_tf32 = bool(enabled)
    return f"tf32 {'on' if enabled else 'off'} (matmul and cuDNN)"
