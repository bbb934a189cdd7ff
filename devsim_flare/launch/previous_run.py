"""The previous run's simulator workspace, moved out of the way of the next run and removed in the background.

NVFlare's simulator starts by deleting its job workspace (``<workspace>/nvflare/<job>``: the server's and each
leaf's copy of the job folder and their logs, ~600 files for a digits run) except ``startup/`` and ``local/``, and
only then creates its server: 0.45 s on this machine's file system when idle, 2 s under load, on the way to the first
round. :func:`set_aside` moves those entries into ``<workspace>/.devsim-trash/`` first (a rename on the same file
system), so NVFlare finds nothing left to delete; :func:`remove_in_background` deletes everything in that folder in a
daemon thread at the lowest CPU priority while the run starts. What a command that ended before its thread finished
left there is removed by the next one. Nothing of the run itself changes: NVFlare deploys the same job folder into
an empty workspace, as it would after its own deletion.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import time

TRASH_FOLDER = ".devsim-trash"
KEPT = ("startup", "local")
"""What NVFlare's simulator keeps in its job workspace across runs (it moves them aside and back around its
deletion)."""


def set_aside(job_workspace: str, workspace: str) -> str | None:
    """Move the entries of ``job_workspace`` other than :data:`KEPT` into a new folder under
    ``<workspace>/.devsim-trash``; returns that folder (None when there was nothing to move). An entry that cannot be
    moved stays for NVFlare to delete."""
    try:
        entries = [name for name in os.listdir(job_workspace) if name not in KEPT]
    except OSError:
        return None
    if not entries:
        return None
    trash = os.path.join(workspace, TRASH_FOLDER, f"{os.path.basename(job_workspace)}-{os.getpid()}-{time.time_ns()}")
    os.makedirs(trash, exist_ok=True)
    for name in entries:
        with contextlib.suppress(OSError):
            os.rename(os.path.join(job_workspace, name), os.path.join(trash, name))
    return trash


def remove_in_background(workspace: str) -> threading.Thread:
    """Start a daemon thread that deletes everything under ``<workspace>/.devsim-trash``, at the lowest CPU priority
    this thread may take (Linux: per thread); returns it."""
    thread = threading.Thread(target=_remove_all, args=(os.path.join(workspace, TRASH_FOLDER),), daemon=True)
    thread.start()
    return thread


def _remove_all(trash: str) -> None:
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
    with contextlib.suppress(OSError):
        for name in os.listdir(trash):
            shutil.rmtree(os.path.join(trash, name), ignore_errors=True)


def clear_previous_run(recipe, env, workspace: str) -> str | None:
    """Before NVFlare's ``SimEnv`` ``env`` runs ``recipe``: set its job workspace's previous run aside
    (:func:`set_aside`) and start removing it (:func:`remove_in_background`); returns the folder it went to."""
    name, root = getattr(recipe, "job_name", None), getattr(env, "workspace_root", None)  # a Collab recipe's
    if not name or not root:
        return None
    moved = set_aside(os.path.join(root, name), workspace)
    remove_in_background(workspace)
    return moved
