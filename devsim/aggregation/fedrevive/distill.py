"""FedRevive's server-side KD: distil the teacher buffer into a copy of the global model on pooled synthetic images."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn
from torch.profiler import record_function

from devsim.aggregation.fedrevive._common import (
    TeacherModel,
    adam,
    check_abandoned,
    frozen,
    kl_per_sample,
    proportions_tensor,
)
from devsim.aggregation.fedrevive.config import DFKDConfig
from devsim.aggregation.fedrevive.ensemble import TeacherEnsemble, loop_forward
from devsim.aggregation.fedrevive.inputs import augment_inputs
from devsim.aggregation.fedrevive.pool import SyntheticPool
from devsim.codec import load_numpy_into_model

__all__ = ["distill"]

Weights = dict[str, np.ndarray]


def distill(
    student_weights: Weights,
    teachers: Sequence[TeacherModel],
    pool: SyntheticPool,
    config: DFKDConfig,
    *,
    student: nn.Module,
    generator: torch.Generator | None = None,
    losses: list[float] | None = None,
    ensemble: TeacherEnsemble | None = None,
    stop=None,
) -> Weights:
    """Distil ``teachers`` into ``student_weights`` and return ``delta_KD = student - student_weights``.

    ``student`` is a scratch module of the same architecture (its device is used); it is overwritten with
    ``student_weights`` and left holding the distilled weights. Training: fresh (fused) Adam (``config.kd_lr``, L2
    ``config.kd_weight_decay``) for ``config.kd_iterations`` steps; per step every teacher ``k`` draws
    ``config.kd_batch_per_teacher`` pool items with class probabilities ``q_k`` (one multinomial draw for all
    teachers; images optionally cropped / flipped; always mapped to model inputs by ``config``'s normalisation,
    except a task generator's items, which are model inputs already) and the loss is
    ``T^2 * sum_k sum_samples KL(teacher_k || student) / total samples`` at temperature
    ``T = config.kd_temperature``. The student runs in eval mode, so BatchNorm and feature-tracker
    buffers keep their values (their delta is 0); teachers are frozen and run as the vectorised ``ensemble``
    (when ``config.teacher_batching`` is "all"; built here if not given) or one by one. Randomness comes from the CPU
    ``generator``. Per-step loss values are appended to ``losses`` when given. ``stop`` (a ``threading.Event``), once
    set, ends the work with :class:`WorkAbandoned` at the next step.

    Returns float32 arrays with the keys and shapes of ``student_weights``. Raises ValueError for an empty pool
    or no teachers.
    """
    if not teachers:
        raise ValueError("distill needs at least one teacher")
    if len(pool) == 0:
        raise ValueError("distill needs a non-empty synthetic pool")
    device = next(student.parameters()).device
    load_numpy_into_model(student, student_weights)
    modules = [module for module, _ in teachers]
    qs = proportions_tensor(teachers, torch.device("cpu"))
    mean = torch.tensor(config.normalize_mean, dtype=torch.float32, device=device)
    std = torch.tensor(config.normalize_std, dtype=torch.float32, device=device)
    temperature = config.kd_temperature
    was_training = student.training
    student.eval()
    optimizer = adam(student.parameters(), device, lr=config.kd_lr, weight_decay=config.kd_weight_decay)
    try:
        with frozen(modules):
            if config.teacher_batching != "all":
                ensemble = None
            elif ensemble is None:
                ensemble = TeacherEnsemble(modules)
            for _ in range(config.kd_iterations):
                check_abandoned(stop)
                with record_function("fedrevive.kd.sample_augment"):
                    items, _ = pool.sample_each(config.kd_batch_per_teacher, qs, generator)
                    shape = items.shape
                    images = items.to(device).flatten(0, 1)
                    if config.task_generator is None:
                        crop_flip = config.kd_augment and config.image
                        images = augment_inputs(images, mean, std, config.augment_padding, generator, crop_flip)
                with record_function("fedrevive.kd.teachers"), torch.no_grad():
                    per_teacher = images.view(shape)
                    if ensemble is not None:
                        teacher_logits = ensemble.forward(per_teacher, shared=False)[0]
                    else:
                        teacher_logits = loop_forward(modules, per_teacher, shared=False)[0]
                with record_function("fedrevive.kd.student_forward"):
                    student_logits = student(images)
                    loss = temperature**2 * kl_per_sample(teacher_logits.flatten(0, 1), student_logits, temperature)
                    loss = loss.mean()
                with record_function("fedrevive.kd.student_backward"):
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                with record_function("fedrevive.kd.optimizer"):
                    optimizer.step()
                if losses is not None:
                    losses.append(loss.item())
    finally:
        student.train(was_training)
    state = student.state_dict()
    return {
        name: (state[name].detach().to("cpu", torch.float32).numpy() - np.asarray(base, dtype=np.float32))
        for name, base in student_weights.items()
    }
