"""The switch for this project's runtime defaults (NVFlare streaming and glibc allocator settings, short
simulator polls): on unless ``DEVSIM_RUNTIME_ENV_DEFAULTS=0``. Imports nothing heavy, so a component that
NVFlare builds early can read it."""

from __future__ import annotations

import os
from collections.abc import Mapping

RUNTIME_ENV_DEFAULTS_SWITCH = "DEVSIM_RUNTIME_ENV_DEFAULTS"


def runtime_defaults_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """False when ``DEVSIM_RUNTIME_ENV_DEFAULTS=0`` in ``environ`` (default ``os.environ``)."""
    environ = os.environ if environ is None else environ
    return environ.get(RUNTIME_ENV_DEFAULTS_SWITCH, "1").strip() != "0"
