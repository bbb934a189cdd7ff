"""Run checkpoints: global weights plus everything needed to continue a run exactly.

A checkpoint is one file, ``<run_dir>/checkpoint.pt``, replaced atomically. It holds the
global weights (float32 arrays), the number of completed rounds (or versions), the strategy's
state, how many records the run had logged (the records themselves are in ``records.jsonl`` beside it, appended to
as the run goes: :meth:`~devsim.observe.results.RunRecorder.log_records`), and any extra state (virtual clock,
scheduler, generator).
All other randomness in a run is derived from ``(seed, round, device)``, so restoring this is
enough for a resumed run to reach the same final weights as an uninterrupted one.

NumPy arrays travel as tensors inside the file (:class:`StoredArray`) and come back as NumPy arrays of the same
dtype and shape: ``torch.save`` writes a tensor's storage as raw bytes, where it pickles an array through a copy.
Measured on this 2-core machine (2026-11-27) on a FedRevive ResNet-18 run's end checkpoint (the in-flight base
versions' snapshots, the teacher buffer): written in 14-18 s and 966 MiB pickled, in 0.8-1.0 s and 691 MiB as tensors
(pickle protocol 2 writes bytes as latin-1 text); read in 7.2 s against 0.2 s. The GPU suite's FedRevive run took
20.8 s from its last version to its exit on the H200 machine, where this file was written once.
"""

from __future__ import annotations

import copy
import os
import tempfile
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from devsim.observe.results import read_logged_records
from devsim.shipped import find_shipped

CHECKPOINT_NAME = "checkpoint.pt"


class StoredArray:
    """A NumPy array held as a tensor sharing its memory, for :func:`save_checkpoint` (see the module docstring)."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor


def _walk(value: Any, convert: Callable[[Any], Any], memo: dict[int, Any]) -> Any:
    """``value`` with ``convert`` applied to it and, where it leaves a dict, OrderedDict, list or tuple unchanged, to
    its items (containers of other types are left as they are); the same object gives the same result (``memo``:
    id to result), so arrays shared in the state stay shared."""
    if id(value) in memo:
        return memo[id(value)]
    out = convert(value)
    if out is value and type(value) in (dict, OrderedDict):
        out = type(value)((key, _walk(item, convert, memo)) for key, item in value.items())
    elif out is value and type(value) in (list, tuple):
        out = type(value)(_walk(item, convert, memo) for item in value)
    memo[id(value)] = out
    return out


def _stored(value: Any) -> Any:
    """A NumPy array that torch can hold as a :class:`StoredArray`; anything else (object, string or non-native byte
    order arrays included) as it is."""
    if not isinstance(value, np.ndarray) or value.dtype.kind not in "biufc" or not value.dtype.isnative:
        return value
    array = value if value.flags.c_contiguous and value.flags.writeable else np.array(value, order="C")
    try:
        return StoredArray(torch.from_numpy(array))
    except TypeError:  # a dtype torch has no tensor type for
        return value


def _unstored(value: Any) -> Any:
    """A :class:`StoredArray` back to its NumPy array; anything else as it is."""
    return value.tensor.numpy() if isinstance(value, StoredArray) else value


def save_checkpoint(run_dir: str, state: dict[str, Any]) -> str:
    """Write ``state`` to ``<run_dir>/checkpoint.pt`` atomically; returns the path."""
    os.makedirs(run_dir, exist_ok=True)
    path = os.path.join(run_dir, CHECKPOINT_NAME)
    fd, tmp = tempfile.mkstemp(dir=run_dir, prefix=".checkpoint.", suffix=".pt")
    os.close(fd)
    try:
        torch.save(_walk(state, _stored, {}), tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return path


CHECKPOINT_WAIT_SECONDS = 900.0
"""Longest wait for a checkpoint being written in the background (a FedRevive end state of ~700 MiB took 1 s here)."""


class CheckpointWriter:
    """Saves a run's periodic checkpoints from one background thread where a core is free for it, so that rounds do
    not wait for the file; else in the calling thread.

    :meth:`save` copies the state (``copy.deepcopy``: the run goes on changing its own) and hands the copy to the
    thread; at most one write is in flight, a second waits for the first. ``wait=True`` (a run's last checkpoint, a
    stop) writes in the calling thread after the one in flight, so the file is complete when it returns. A failed
    background write raises at the next :meth:`save` or :meth:`wait`. A ResNet-18 state of 90 MB took 70-190 ms
    to save on the 2-core CPU and 25 ms to copy; the 62k-parameter CNN's 1.1-3.5 ms against 0.2 ms. Where the
    leaves' training holds every core (one ResNet-18 leaf on the 2 cores), a background write slows the round as
    much as it saves: its checkpoint's 39-49 ms between rounds became 6.5 ms, its round 324-337 ms became 384 ms.
    ``background`` False writes every checkpoint in the calling thread (see :func:`background_pays`)."""

    def __init__(self, background: bool = True) -> None:
        self.background = bool(background)
        self._pool: ThreadPoolExecutor | None = None
        self._pending: Future | None = None

    def save(self, run_dir: str, state: dict[str, Any], wait: bool = False) -> None:
        """Write ``state`` as ``<run_dir>/checkpoint.pt``: in the background, or now with ``wait``."""
        self.wait()
        if wait or not self.background:
            save_checkpoint(run_dir, state)
            return
        try:
            snapshot = copy.deepcopy(state)
        except Exception:  # noqa: BLE001 - a state that cannot be copied is saved now, as before
            save_checkpoint(run_dir, state)
            return
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint")
        self._pending = self._pool.submit(save_checkpoint, run_dir, snapshot)

    def wait(self) -> None:
        """Wait for the write in flight (at most :data:`CHECKPOINT_WAIT_SECONDS`); raises its error."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result(timeout=CHECKPOINT_WAIT_SECONDS)

    def close(self) -> BaseException | None:
        """Wait for the write in flight and stop the thread; returns a failed write's error instead of raising it
        (a run that is ending on another error keeps that one)."""
        error = None
        try:
            self.wait()
        except Exception as failed:  # noqa: BLE001 - returned to the caller
            error = failed
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        return error


def background_pays(leaves_on_host: int) -> bool:
    """Whether a background checkpoint writer has a core of its own: more usable cores than the server's thread and
    one per leaf training on this host (the leaves of ``--env sim`` and ``poc``; 0 for a deployment's server)."""
    from devsim.resources.workers import usable_cpu_cores

    return usable_cpu_cores() > int(leaves_on_host) + 1


CARRIED_RUN_FOLDER = "devsim_resume"
"""A run folder a resubmitted job carries (``custom/devsim_resume/`` of its server app): ``--env prod`` resumes a
job from the checkpoint it downloaded (see :mod:`devsim_flare.deployment.prod_run`)."""


def locate_run_dir(run_dir: str) -> str:
    """``run_dir`` itself when it is a folder; else, for the bare name :data:`CARRIED_RUN_FOLDER`, the folder the
    job carries (:func:`devsim.shipped.find_shipped`)."""
    if os.path.isdir(run_dir) or run_dir != CARRIED_RUN_FOLDER:
        return run_dir
    carried = find_shipped(os.path.join(run_dir, CHECKPOINT_NAME))
    return os.path.dirname(carried) if carried else run_dir


def load_checkpoint(run_dir: str) -> dict[str, Any]:
    """Read ``<run_dir>/checkpoint.pt`` (``run_dir`` found by :func:`locate_run_dir`); FileNotFoundError names the
    path when there is none."""
    folder = locate_run_dir(run_dir)
    path = os.path.join(folder, CHECKPOINT_NAME)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no checkpoint at {path}; --resume needs a run folder that saved one")
    state = _walk(torch.load(path, weights_only=False), _unstored, {})
    if isinstance(state.get("records"), dict):
        state["records"] = read_logged_records(folder, state["records"])
    return state


def records_counted(path: str) -> int:
    """How many round records the checkpoint file at ``path`` counts (its records log's mark, or its list)."""
    records = torch.load(path, weights_only=False).get("records", [])
    return int(records["count"]) if isinstance(records, dict) else len(records)


def weights_to_tensors(weights: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """State-dict form of a weights dict, for ``final_model.pt`` (loadable with ``load_state_dict``)."""
    return {name: torch.from_numpy(np.ascontiguousarray(value)) for name, value in weights.items()}
