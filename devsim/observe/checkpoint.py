"""Run checkpoints: global weights plus everything needed to continue a run exactly.

A checkpoint is one file, ``<run_dir>/checkpoint.pt``, replaced atomically. It holds the
global weights (float32 arrays), the number of completed rounds (or versions), the strategy's
state, the results recorded so far, and any extra state (virtual clock, scheduler, generator).
All other randomness in a run is derived from ``(seed, round, device)``, so restoring this is
enough for a resumed run to reach the same final weights as an uninterrupted one.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import numpy as np
import torch

from devsim.shipped import find_shipped

CHECKPOINT_NAME = "checkpoint.pt"


def save_checkpoint(run_dir: str, state: dict[str, Any]) -> str:
    """Write ``state`` to ``<run_dir>/checkpoint.pt`` atomically; returns the path."""
    os.makedirs(run_dir, exist_ok=True)
    path = os.path.join(run_dir, CHECKPOINT_NAME)
    fd, tmp = tempfile.mkstemp(dir=run_dir, prefix=".checkpoint.", suffix=".pt")
    os.close(fd)
    try:
        torch.save(state, tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return path


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
    path = os.path.join(locate_run_dir(run_dir), CHECKPOINT_NAME)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no checkpoint at {path}; --resume needs a run folder that saved one")
    return torch.load(path, weights_only=False)


def weights_to_tensors(weights: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    """State-dict form of a weights dict, for ``final_model.pt`` (loadable with ``load_state_dict``)."""
    return {name: torch.from_numpy(np.ascontiguousarray(value)) for name, value in weights.items()}
