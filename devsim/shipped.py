"""Files a job carries in its ``custom/`` folder (a user's task file, a checkpoint to continue from): at a site
NVFlare puts that folder on ``sys.path``, so they are found there by their path relative to it."""

from __future__ import annotations

import os
import sys


def find_shipped(relative_path: str) -> str | None:
    """The file ``relative_path`` (e.g. ``devsim_user_task/my_task.py``) inside a folder on ``sys.path``, or None
    outside a job that carries it."""
    for entry in sys.path:
        candidate = os.path.join(entry or os.getcwd(), relative_path)
        if os.path.isfile(candidate):
            return candidate
    return None
