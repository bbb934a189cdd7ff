"""CUDA's one-time start in a process, taken on a background thread while the process waits for other things.

The first CUDA call of a process creates its context, and the first matrix product and convolution create the
cuBLAS and cuDNN handles and load their libraries; all of it lies on the way to a server's first evaluation and a
leaf's first training step. A job's server and leaf processes spend the same time waiting for NVFlare to start the
other processes and connect them (the server from its process start to its run, a leaf before its set-up).
:func:`start_cuda_warmup` does that start then, on a daemon thread, so the first real CUDA call finds it done (or
waits only for the rest of it inside CUDA's own initialisation lock). It allocates a few bytes on the device,
draws no random numbers and changes no setting, so a run's results are the same with or without it; without CUDA it
does nothing.
"""

from __future__ import annotations

import threading
import time

import torch

WARMUP_STAMPS = ("cuda_warmup_started", "cuda_warmup_done")
"""Wall-clock stamps (``time.time()`` seconds) of the warm-up's start and end in this process."""

_stamps: dict[str, float] = {}
_thread: threading.Thread | None = None
_lock = threading.Lock()


def warm_cuda(device: torch.device) -> None:
    """Create ``device``'s context and its cuBLAS and cuDNN handles: a one-element tensor, a 64 x 64 matrix product
    and a 3 x 3 convolution over an 8 x 8 image, then wait for them."""
    ones = torch.ones(64, 64, device=device)
    torch.mm(ones, ones)
    image = torch.ones(1, 3, 8, 8, device=device)
    torch.nn.functional.conv2d(image, torch.ones(4, 3, 3, 3, device=device))
    torch.cuda.synchronize(device)


def start_cuda_warmup() -> threading.Thread | None:
    """Start warming the default CUDA device (``cuda``: the first visible GPU) on a daemon thread, once per process;
    the thread, or None where CUDA is unavailable. A warm-up that fails is left to the real first call, which
    reports the error where it happens."""
    global _thread
    with _lock:
        if _thread is not None:
            return _thread
        if not torch.cuda.is_available():
            return None

        def warm() -> None:
            _stamps["cuda_warmup_started"] = time.time()
            try:
                warm_cuda(torch.device("cuda"))
            except Exception:  # noqa: BLE001 - the process's own first CUDA call raises it again, in context
                return
            _stamps["cuda_warmup_done"] = time.time()

        _thread = threading.Thread(target=warm, name="cuda-warmup", daemon=True)
        _thread.start()
        return _thread


def warmup_stamps() -> dict[str, float]:
    """The warm-up's stamps in this process so far (:data:`WARMUP_STAMPS`; empty without one)."""
    return dict(_stamps)


def warmup_parts() -> dict[str, float]:
    """For a leaf's set-up record: the warm-up's seconds (``cuda_warmup``) and the wall-clock stamp of its start
    (``cuda_warmup_started_at``); empty unless a warm-up has finished in this process."""
    stamps = warmup_stamps()
    if not set(WARMUP_STAMPS) <= set(stamps):
        return {}
    started, done = (stamps[name] for name in WARMUP_STAMPS)
    return {"cuda_warmup": done - started, "cuda_warmup_started_at": started}
