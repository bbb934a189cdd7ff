"""This user's cache folder for the project, shared by what it keeps between runs (the batching probe's verdicts,
the warm parent's socket). Imports nothing beyond the standard library."""

from __future__ import annotations

import os

CACHE_ENV = "DEVSIM_CACHE_DIR"
CACHE_OFF = "off"


def cache_root(environ=None) -> str | None:
    """``$DEVSIM_CACHE_DIR`` when set (None for ``off``: nothing is kept), else ``$XDG_CACHE_HOME/nvflare-devsim``
    or ``~/.cache/nvflare-devsim`` (``environ``: default ``os.environ``)."""
    environ = os.environ if environ is None else environ
    chosen = environ.get(CACHE_ENV, "").strip()
    if chosen:
        return None if chosen == CACHE_OFF else os.path.abspath(chosen)
    base = environ.get("XDG_CACHE_HOME") or os.path.join(environ.get("HOME") or os.path.expanduser("~"), ".cache")
    return os.path.join(base, "nvflare-devsim")
