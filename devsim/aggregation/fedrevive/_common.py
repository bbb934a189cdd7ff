"""Helpers shared by synthesis and distillation: frozen teachers, per-class teacher weights, per-sample KL."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F


class WorkAbandoned(Exception):
    """Raised inside synthesis or distillation when their caller has abandoned the work (its result would never be
    read), at the next inner step."""


def check_abandoned(stop) -> None:
    """Raise :class:`WorkAbandoned` when ``stop`` (a ``threading.Event`` or None) is set."""
    if stop is not None and stop.is_set():
        raise WorkAbandoned


TeacherModel = tuple[nn.Module, np.ndarray]
"""A teacher network (with the input normalisation of the clients) and its class proportions ``(num_classes,)``."""


@contextmanager
def frozen(modules: Sequence[nn.Module]) -> Iterator[None]:
    """Put ``modules`` in eval mode with ``requires_grad=False`` parameters; restore both on exit.

    Gradients still flow through them to their inputs.
    """
    saved = [(m.training, [p.requires_grad for p in m.parameters()]) for m in modules]
    for module in modules:
        module.eval()
        module.requires_grad_(False)
    try:
        yield
    finally:
        for module, (training, flags) in zip(modules, saved, strict=True):
            module.train(training)
            for param, flag in zip(module.parameters(), flags, strict=True):
                param.requires_grad_(flag)


def adam(params, device: torch.device, **kwargs) -> torch.optim.Adam:
    """``torch.optim.Adam`` with the fused kernel on CPU and CUDA (one kernel for all parameters).

    Same update rule as the default per-parameter loop (differences at float rounding, ~1e-8); measured 3-4x
    faster per step for the generator and the CNN student on a CPU core, where the loop's per-tensor
    elementwise passes cost 6-14 ms a step for the width-32 generator.
    """
    return torch.optim.Adam(params, fused=device.type in ("cpu", "cuda") or None, **kwargs)


def proportions_tensor(teachers: Sequence[TeacherModel], device: torch.device) -> torch.Tensor:
    """Stack the teachers' ``q`` into float32 ``(num_teachers, num_classes)`` on ``device``, rows normalised."""
    qs = torch.as_tensor(np.stack([np.asarray(q, dtype=np.float64) for _, q in teachers]), dtype=torch.float32)
    if qs.dim() != 2 or bool((qs < 0).any()) or bool((qs.sum(dim=1) <= 0).any()):
        raise ValueError("each teacher needs a 1-D q of non-negative proportions with a positive sum")
    return (qs / qs.sum(dim=1, keepdim=True)).to(device)


def class_weight_matrix(qs: torch.Tensor) -> torch.Tensor:
    """Per-class teacher weights ``q_k(c) / sum_t q_t(c)`` ``(num_teachers, num_classes)``; columns sum to 1.

    A class no teacher has (all ``q_t(c) = 0``) gets the uniform weight ``1 / num_teachers``.
    """
    totals = qs.sum(dim=0, keepdim=True)
    uniform = torch.full_like(qs, 1.0 / qs.shape[0])
    return torch.where(totals > 0, qs / totals.clamp_min(torch.finfo(qs.dtype).tiny), uniform)


def kl_per_sample(teacher_logits: torch.Tensor, student_logits: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """``KL(softmax(t / T) || softmax(s / T))`` per sample ``(B,)`` for logits ``(B, num_classes)`` (nats)."""
    log_t = F.log_softmax(teacher_logits / temperature, dim=1)
    log_s = F.log_softmax(student_logits / temperature, dim=1)
    return (log_t.exp() * (log_t - log_s)).sum(dim=1)
