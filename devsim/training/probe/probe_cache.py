"""The batching probe's verdict, kept on disk per model, task, training settings, machine and PyTorch version.

:func:`devsim.training.probe.batch_probe.probe_batching` decides, once per leaf process, whether a model trains many
devices batched or one at a time; with ``--device-batch auto`` on the CPU the verdict depends on a timing taken while
the leaves start together, so two runs of the same job could take different paths (the same accuracy, a loss
differing in the fourth digit from the float rounding of each path). :func:`cached_probe` keeps the first verdict in a
small JSON file under the user's cache folder and gives it to every later probe with the same key: the runs repeat
and skip the probe's ~0.3-1 s of training and timing.

The key (:func:`probe_key`) names everything the verdict depends on: the model's architecture (its ``repr``) and the
source of every module class in it, the task (its name and origin, the SHA-256 of a task file, the input shape and
dtype), the loss and augmentation functions (name and source), the local training settings, whether the verdict was
timed, the compute device (and the GPU's name), the machine (host name, CPU model, cores this process may use, the
architecture), the PyTorch version and the source of the probe itself. A change to any of them is another key, so
another probe. The folder is ``$DEVSIM_CACHE_DIR`` when set (``off``: no cache), else
``$XDG_CACHE_HOME/nvflare-devsim`` or ``~/.cache/nvflare-devsim``; a verdict is one file
``batch-probe/<key hash>.json``, deleted to probe again. A file that cannot be read or written is ignored (the probe
runs).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import inspect
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn

from devsim.cache_dir import CACHE_ENV, CACHE_OFF, cache_root  # noqa: F401  (re-exported)
from devsim.training.probe.batch_probe import ProbeOutcome

FOLDER = "batch-probe"
FORMAT = 1


def _source_digest(obj: Any) -> str:
    """SHA-256 of the source file that defines ``obj`` (a function or class), '' when it has none."""
    try:
        path = inspect.getsourcefile(obj) or inspect.getfile(obj)
    except (TypeError, OSError):
        return ""
    try:
        with open(path, "rb") as stream:
            return hashlib.sha256(stream.read()).hexdigest()
    except OSError:
        return ""


def _callable_id(fn: Callable | None) -> dict[str, str] | None:
    """A function's qualified name and its file's digest (None for None)."""
    if fn is None:
        return None
    target = getattr(fn, "func", fn)  # a functools.partial names its function
    name = f"{getattr(target, '__module__', '')}.{getattr(target, '__qualname__', type(target).__qualname__)}"
    return {"name": name, "source": _source_digest(target)}


def _cpu_model() -> str:
    """The CPU's model name (Linux ``/proc/cpuinfo``), else the platform's processor string."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as stream:
            for line in stream:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def machine_key(device: torch.device) -> dict[str, Any]:
    """What identifies this machine and compute device for a timing: host, CPU, usable cores, GPU, PyTorch."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else None
    return {
        "host": platform.node(),
        "arch": platform.machine(),
        "cpu": _cpu_model(),
        "cores": cores,
        "device": device.type,
        "gpu": gpu,
        "torch": torch.__version__,
        "python": sys.version.split()[0],
    }


def task_identity(record: dict[str, Any], track_features: bool = False) -> dict[str, Any]:
    """What names a task and its data in a probe key, from its record (:meth:`devsim.tasks.task.Task.record`)."""
    named = {k: record.get(k) for k in ("name", "origin", "sha256", "sample_shape", "input_dtype", "num_classes")}
    return {**named, "track_features": bool(track_features)}


def probe_key(
    model: nn.Module,
    task: dict[str, Any],
    spec: Any,
    objective: Any,
    device: torch.device,
    timed: bool,
) -> dict[str, Any]:
    """The key of a probe's verdict (JSON-able): ``model`` a fresh copy of the task's model, ``task`` what names
    the task and its data (:func:`task_identity`), ``spec`` the local training settings (a dataclass),
    ``objective`` the loss and augmentation (:class:`devsim.training.local.Objective`)."""
    import devsim.training.batched as batched_module
    import devsim.training.probe.batch_probe as probe_module

    classes = sorted({type(m) for m in model.modules()}, key=lambda c: f"{c.__module__}.{c.__qualname__}")
    return {
        "format": FORMAT,
        "model": repr(model),
        "model_sources": {f"{c.__module__}.{c.__qualname__}": _source_digest(c) for c in classes},
        "task": task,
        "spec": dataclasses.asdict(spec),
        "loss": _callable_id(objective.loss),
        "classification": bool(objective.classification),
        "augment": _callable_id(objective.augment),
        "timed": bool(timed),
        "machine": machine_key(device),
        "probe": [_source_digest(probe_module.probe_batching), _source_digest(batched_module.BatchedTrainer)],
    }


def task_probe_key(task: Any, spec: Any, objective: Any, device: torch.device, timed: bool, track_features: bool):
    """:func:`probe_key` of a task (:class:`devsim.tasks.task.Task`: its record names it, a fresh model of it is
    built) trained with ``spec`` and ``objective`` on ``device``."""
    model = task.build_model(track_features=track_features)
    return probe_key(model, task_identity(task.record(), track_features), spec, objective, device, timed)


def key_path(key: dict[str, Any], root: str) -> str:
    """The verdict file of ``key`` under ``root``."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()
    return os.path.join(root, FOLDER, f"{digest[:32]}.json")


LOCK_WAIT_SECONDS = 120.0
"""How long a probe waits for another process probing the same key (the leaves of a run start together) before it
probes on its own."""


def cached_probe(key: dict[str, Any], run: Callable[[], ProbeOutcome]) -> tuple[ProbeOutcome, str | None]:
    """The verdict stored for ``key``, else ``run()``'s, stored for the next time. Processes probing the same key
    at once take turns (a lock file next to the verdict), so the leaves of one run share one verdict. Returns
    (outcome, the file it came from, or None when it was probed now)."""
    root = cache_root()
    if not root:
        return run(), None
    path = key_path(key, root)
    with _turn(f"{path}.lock"):
        stored = _load(path, key)
        if stored is not None:
            return stored, path
        outcome = run()
        _store(path, key, outcome)
    return outcome, None


def _load(path: str, key: dict[str, Any]) -> ProbeOutcome | None:
    """The verdict in ``path`` when it was stored for ``key``."""
    try:
        with open(path, encoding="utf-8") as stream:
            stored = json.load(stream)
        if stored.get("key") == json.loads(json.dumps(key, default=str)):
            return ProbeOutcome(**stored["outcome"])
    except (OSError, ValueError, TypeError, KeyError):
        pass
    return None


def _store(path: str, key: dict[str, Any], outcome: ProbeOutcome) -> None:
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        partial = f"{path}.{os.getpid()}.tmp"
        with open(partial, "w", encoding="utf-8") as stream:
            json.dump({"key": key, "outcome": dataclasses.asdict(outcome)}, stream, indent=1, default=str)
        os.replace(partial, path)
    except OSError:
        pass


@contextlib.contextmanager
def _turn(lock_path: str) -> Iterator[None]:
    """Hold an exclusive lock on ``lock_path`` while the block runs (waiting at most :data:`LOCK_WAIT_SECONDS`;
    without it, or where files cannot be locked, the block runs anyway)."""
    try:
        import fcntl

        os.makedirs(os.path.dirname(lock_path), exist_ok=True)
        handle = open(lock_path, "a+")  # noqa: SIM115 - closed below
    except (ImportError, OSError):
        yield
        return
    try:
        deadline = time.monotonic() + LOCK_WAIT_SECONDS
        while True:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.02)
        yield
    finally:
        handle.close()  # releases the lock
