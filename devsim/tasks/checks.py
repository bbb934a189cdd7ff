"""Checks on what a task's functions return, each failing with one :class:`TaskError` line.

:func:`checked_arrays` turns ``data()``'s dict into NumPy arrays of the dtypes the trainers use (float inputs
as float32, integer inputs as int64 except ``uint8``, class ids as int64) after checking keys, lengths,
shapes, dtypes and finiteness. :func:`probe_model` builds a model and runs it, the loss, the metrics and
(when given) ``prepare`` and ``augment`` on a few training rows, which settles whether the task is
classification and how many classes the model outputs.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from devsim.codec import float_state_keys
from devsim.tasks.contract import (
    OPTIONAL_DATA_KEYS,
    REQUIRED_DATA_KEYS,
    TaskError,
    TaskHooks,
    describe_exception,
)

PROBE_ROWS = 8
"""Training rows the probe forward pass uses."""


def call_hook(hooks: TaskHooks, name: str, function: Callable, *args: Any) -> Any:
    """``function(*args)``; an exception becomes a TaskError quoting the task file's line that raised."""
    try:
        return function(*args)
    except TaskError:
        raise
    except Exception as error:
        raise TaskError(hooks.origin, f"{name}() raised {describe_exception(error, hooks.file)}") from error


def _as_numpy(hooks: TaskHooks, key: str, value: Any) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, (list, tuple)):
        try:
            array = np.asarray(value)
        except ValueError as error:
            raise TaskError(hooks.origin, f"data()[{key!r}] is a ragged list ({error}); give an array") from error
        if array.dtype != object:
            return array
    raise TaskError(
        hooks.origin, f"data()[{key!r}] must be a NumPy array or a torch tensor, got {type(value).__name__}"
    )


def _numeric_kind(hooks: TaskHooks, key: str, array: np.ndarray) -> str:
    """``"float"``, ``"int"``, ``"uint8"`` or ``"bool"``; anything else (strings, objects) is refused."""
    if array.dtype == np.bool_:
        return "bool"
    if array.dtype == np.uint8:
        return "uint8"
    if np.issubdtype(array.dtype, np.integer):
        return "int"
    if np.issubdtype(array.dtype, np.floating):
        return "float"
    raise TaskError(
        hooks.origin,
        f"data()[{key!r}] has dtype {array.dtype}; allowed: floating point, integer (e.g. token ids), uint8 or bool",
    )


def _check_finite(hooks: TaskHooks, key: str, array: np.ndarray) -> None:
    if not np.issubdtype(array.dtype, np.floating):
        return
    bad = ~np.isfinite(array)
    if bad.any():
        first = int(np.argwhere(bad.reshape(len(array), -1).any(axis=1))[0, 0]) if array.ndim else 0
        raise TaskError(
            hooks.origin,
            f"data()[{key!r}] holds {int(bad.sum())} NaN or infinite values (first in row {first}); "
            "clean or impute them before returning the arrays",
        )


def _inputs(hooks: TaskHooks, key: str, array: np.ndarray) -> np.ndarray:
    kind = _numeric_kind(hooks, key, array)
    if array.ndim < 1:
        raise TaskError(hooks.origin, f"data()[{key!r}] must have a first dimension (samples), got a scalar")
    if kind == "float":
        converted = array.astype(np.float32)
        _check_finite(hooks, key, array)
        _check_finite(hooks, f"{key} (as float32)", converted)
        return np.ascontiguousarray(converted)
    if kind == "bool":
        return np.ascontiguousarray(array.astype(np.float32))
    if kind == "int":
        return np.ascontiguousarray(array.astype(np.int64))
    return np.ascontiguousarray(array)


def _targets(hooks: TaskHooks, key: str, array: np.ndarray) -> np.ndarray:
    kind = _numeric_kind(hooks, key, array)
    if array.ndim < 1:
        raise TaskError(hooks.origin, f"data()[{key!r}] must have one entry per sample, got a scalar")
    if kind in ("int", "uint8"):
        if array.size and array.min() < 0:
            raise TaskError(
                hooks.origin, f"data()[{key!r}] holds negative class ids (min {array.min()}); class ids are 0..C-1"
            )
        return np.ascontiguousarray(array.astype(np.int64))
    converted = array.astype(np.float32)
    _check_finite(hooks, key, array)
    return np.ascontiguousarray(converted)


@dataclass(frozen=True)
class TaskArrays:
    """``data()``'s arrays as the trainers hold them; ``owner_train`` is None without a natural partition."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    owner_train: np.ndarray | None = None


def checked_arrays(hooks: TaskHooks, values: Any) -> TaskArrays:
    """Validate and convert what ``data()`` returned (see the module docstring)."""
    if not isinstance(values, Mapping):
        raise TaskError(
            hooks.origin,
            f"data() must return a dict with keys {', '.join(REQUIRED_DATA_KEYS)}, got {type(values).__name__}",
        )
    keys = set(values)
    missing = [k for k in REQUIRED_DATA_KEYS if k not in keys]
    if missing:
        raise TaskError(
            hooks.origin, f"data() returned no {', '.join(missing)} (got keys: {', '.join(sorted(map(str, keys)))})"
        )
    unknown = sorted(str(k) for k in keys - set(REQUIRED_DATA_KEYS) - set(OPTIONAL_DATA_KEYS))
    if unknown:
        allowed = ", ".join(REQUIRED_DATA_KEYS + OPTIONAL_DATA_KEYS)
        raise TaskError(hooks.origin, f"data() returned unknown keys {unknown}; allowed keys: {allowed}")
    raw = {k: _as_numpy(hooks, k, values[k]) for k in keys if values[k] is not None}
    x_train, x_test = _inputs(hooks, "x_train", raw["x_train"]), _inputs(hooks, "x_test", raw["x_test"])
    y_train, y_test = _targets(hooks, "y_train", raw["y_train"]), _targets(hooks, "y_test", raw["y_test"])
    for split, x, y in (("train", x_train, y_train), ("test", x_test, y_test)):
        if len(x) == 0:
            raise TaskError(hooks.origin, f"data()['x_{split}'] is empty; every split needs at least one sample")
        if len(x) != len(y):
            raise TaskError(
                hooks.origin, f"x_{split} has {len(x)} samples but y_{split} has {len(y)}; they must be equal"
            )
    if x_train.shape[1:] != x_test.shape[1:] or x_train.dtype != x_test.dtype:
        raise TaskError(
            hooks.origin,
            f"x_train samples are {x_train.shape[1:]} {x_train.dtype} but x_test samples are "
            f"{x_test.shape[1:]} {x_test.dtype}; both splits need the same sample shape and dtype",
        )
    if y_train.shape[1:] != y_test.shape[1:] or y_train.dtype != y_test.dtype:
        raise TaskError(
            hooks.origin,
            f"y_train is {y_train.shape[1:]} {y_train.dtype} per sample but y_test is {y_test.shape[1:]} "
            f"{y_test.dtype}; both splits need the same target shape and dtype",
        )
    owner = raw.get("owner_train")
    if owner is not None:
        if owner.ndim != 1 or not np.issubdtype(owner.dtype, np.integer):
            raise TaskError(
                hooks.origin,
                f"owner_train must be a 1-D integer array (one device id per training sample), "
                f"got {owner.dtype} {owner.shape}",
            )
        if len(owner) != len(x_train):
            raise TaskError(
                hooks.origin, f"owner_train has {len(owner)} entries but x_train has {len(x_train)} samples"
            )
        owner = np.ascontiguousarray(owner.astype(np.int64))
    return TaskArrays(x_train, y_train, x_test, y_test, owner)


@dataclass(frozen=True)
class ProbeResult:
    """What the probe learnt: classification (1-D class ids and ``(batch, C)`` outputs) and ``C``; and the bytes of
    the model's floating-point state as float32 (what one copy of the model weighs on the wire)."""

    classification: bool
    num_classes: int | None
    output_shape: tuple[int, ...]
    model_bytes: int = 0


def build_model(hooks: TaskHooks, **kwargs: Any) -> nn.Module:
    """``hooks.model(**kwargs)``, checked to be an ``nn.Module`` with floating-point parameters."""
    model = call_hook(hooks, "model", functools.partial(hooks.model, **kwargs))
    if not isinstance(model, nn.Module):
        raise TaskError(hooks.origin, f"model() must return a torch.nn.Module, got {type(model).__name__}")
    if not any(p.is_floating_point() and p.requires_grad for p in model.parameters()):
        raise TaskError(hooks.origin, "model() returned a module without trainable floating-point parameters")
    return model


def probe_model(
    hooks: TaskHooks,
    arrays: TaskArrays,
    loss: Callable | None,
    metrics: Callable | None,
) -> ProbeResult:
    """Run model, loss (with a backward pass), metrics, ``prepare`` and ``augment`` on a few training rows.

    ``loss`` / ``metrics`` are the task's own (None: the defaults, which need classification).
    """
    model = build_model(hooks)
    rows = min(PROBE_ROWS, len(arrays.x_train))
    x = torch.from_numpy(arrays.x_train[:rows].copy())
    y = torch.from_numpy(arrays.y_train[:rows].copy())
    inputs = x
    if hooks.prepare is not None:
        inputs = call_hook(hooks, "prepare", hooks.prepare, x)
        if not isinstance(inputs, torch.Tensor) or inputs.shape[:1] != (rows,):
            raise TaskError(
                hooks.origin,
                f"prepare(x) must return a tensor with the same first dimension ({rows} rows), got "
                f"{getattr(inputs, 'shape', type(inputs).__name__)}",
            )
    model.train(rows > 1)
    try:
        outputs = model(inputs)
    except Exception as error:
        raise TaskError(
            hooks.origin,
            f"the model failed on {rows} training samples of shape {tuple(inputs.shape[1:])} {inputs.dtype}: "
            f"{describe_exception(error, hooks.file)}",
        ) from error
    if not isinstance(outputs, torch.Tensor) or outputs.dim() < 1 or outputs.shape[0] != rows:
        raise TaskError(
            hooks.origin,
            f"the model must return one output row per sample (a tensor ({rows}, ...)), got "
            f"{getattr(outputs, 'shape', type(outputs).__name__)}",
        )
    classification = arrays.y_train.ndim == 1 and arrays.y_train.dtype == np.int64 and outputs.dim() == 2
    num_classes = int(outputs.shape[1]) if classification else None
    if classification:
        for split, labels in (("y_train", arrays.y_train), ("y_test", arrays.y_test)):
            if labels.size and labels.max() >= num_classes:
                raise TaskError(
                    hooks.origin,
                    f"{split} holds class {int(labels.max())} but the model outputs {num_classes} classes "
                    f"(outputs {tuple(outputs.shape)}); class ids must lie in 0..{num_classes - 1}",
                )
    elif loss is None:
        raise TaskError(
            hooks.origin,
            f"the default loss (cross-entropy) needs int class ids y of shape (N,) and model outputs "
            f"(batch, classes); here y is {arrays.y_train.dtype} {arrays.y_train.shape[1:] or ''} per sample and "
            f"outputs are {tuple(outputs.shape[1:])} per sample: define loss(outputs, targets)",
        )
    _check_loss(hooks, model, loss, outputs, y)
    _check_metrics(hooks, metrics, outputs.detach(), y, classification)
    if hooks.augment is not None:
        _check_augment(hooks, inputs)
    state = model.state_dict()
    model_bytes = 4 * sum(state[name].numel() for name in float_state_keys(model))
    return ProbeResult(classification, num_classes, tuple(outputs.shape[1:]), model_bytes)


def _check_loss(hooks: TaskHooks, model: nn.Module, loss: Callable | None, outputs, targets) -> None:
    from devsim.tasks.defaults import cross_entropy

    value = call_hook(hooks, "loss", loss or cross_entropy, outputs, targets)
    if not isinstance(value, torch.Tensor) or value.dim() != 0:
        raise TaskError(
            hooks.origin,
            f"loss(outputs, targets) must return a scalar tensor (mean over the batch), got "
            f"{getattr(value, 'shape', type(value).__name__)}",
        )
    if not value.is_floating_point() or value.grad_fn is None:
        raise TaskError(hooks.origin, "loss(outputs, targets) does not depend on the model's outputs (no gradient)")
    if not math.isfinite(float(value.detach())):
        raise TaskError(hooks.origin, f"loss(outputs, targets) is {float(value.detach())} on the untrained model")
    value.backward()
    if not any(p.grad is not None for p in model.parameters()):
        raise TaskError(hooks.origin, "loss(outputs, targets) gives no gradient to any model parameter")


def _check_metrics(hooks: TaskHooks, metrics: Callable | None, outputs, targets, classification: bool) -> None:
    if metrics is None:
        if hooks.lower_is_better:
            raise TaskError(hooks.origin, "LOWER_IS_BETTER names metrics, but the task defines no metrics()")
        return
    values = call_hook(hooks, "metrics", metrics, outputs, targets)
    if not isinstance(values, Mapping):
        raise TaskError(
            hooks.origin, f"metrics(outputs, targets) must return a dict of floats, got {type(values).__name__}"
        )
    for name, value in values.items():
        if not isinstance(name, str) or not name.replace("_", "").isalnum():
            raise TaskError(hooks.origin, f"metric name {name!r} must be a word (letters, digits, '_')")
        if name in ("loss", "round", "version"):
            raise TaskError(hooks.origin, f"metric name {name!r} is taken by the run's own records; rename it")
        try:
            float(value)
        except (TypeError, ValueError) as error:
            raise TaskError(
                hooks.origin, f"metrics() value {name!r} must be a float, got {type(value).__name__}"
            ) from error
    unknown = [name for name in hooks.lower_is_better if name not in values]
    if unknown:
        raise TaskError(
            hooks.origin,
            f"LOWER_IS_BETTER names {', '.join(map(repr, unknown))}, which metrics() does not return (it returns "
            f"{', '.join(map(str, values)) or 'nothing'})",
        )


def _check_augment(hooks: TaskHooks, inputs: torch.Tensor) -> None:
    augmented = call_hook(hooks, "augment", hooks.augment, inputs.detach().clone(), torch.Generator().manual_seed(0))
    if not isinstance(augmented, torch.Tensor) or augmented.shape != inputs.shape:
        raise TaskError(
            hooks.origin,
            f"augment(inputs, generator) must return a tensor of the input shape {tuple(inputs.shape)}, got "
            f"{getattr(augmented, 'shape', type(augmented).__name__)}",
        )
