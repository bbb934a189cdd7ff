"""How long the server waits for a leaf's reply: ``--round-timeout`` when given, else sized from the work.

A fixed default must cover the slowest work anyone runs (600 s), so a run of 0.3 s rounds waited ten minutes for a
leaf that was not coming. Sized from the rounds measured so far, the wait follows the run: :data:`MULTIPLE` times
the slowest reply seen, never below :data:`FLOOR_SECONDS` (start-up hiccups, a garbage collection, a loaded
machine), and :data:`FIRST_SECONDS` until a first reply has been timed (the first round also loads data, builds
models and compiles). A leaf that dies is noticed without this wait (:mod:`devsim_flare.leaf_liveness`); the
timeout is for a leaf that hangs while its process lives.
"""

from __future__ import annotations

import math

MULTIPLE = 10.0
"""The automatic timeout is this many times the slowest reply measured so far."""
FLOOR_SECONDS = 60.0
"""The automatic timeout is never shorter than this (seconds)."""
FIRST_SECONDS = 600.0
"""The automatic timeout before any reply was measured (seconds)."""


class RoundTimeout:
    """Seconds to wait for a leaf's reply (:attr:`seconds`): ``explicit`` when set, else
    ``max(FLOOR_SECONDS, MULTIPLE x the slowest reply observed)``, :data:`FIRST_SECONDS` before any.

    Only the slowest reply is kept (one float): nothing grows with the rounds.
    """

    def __init__(self, explicit: float | None = None):
        if explicit is not None and not (math.isfinite(explicit) and explicit > 0):
            raise ValueError(f"round timeout must be finite and > 0 seconds, got {explicit}")
        self.explicit = explicit
        self.slowest: float | None = None

    def observe(self, seconds: float) -> None:
        """Record the duration (seconds) of one leaf reply or round."""
        if math.isfinite(seconds) and seconds >= 0 and (self.slowest is None or seconds > self.slowest):
            self.slowest = float(seconds)

    @property
    def seconds(self) -> float:
        """The wait to use now (seconds)."""
        if self.explicit is not None:
            return float(self.explicit)
        if self.slowest is None:
            return FIRST_SECONDS
        return max(FLOOR_SECONDS, MULTIPLE * self.slowest)

    def describe(self) -> str:
        """``--round-timeout 20s`` or ``--round-timeout auto (now 60s)``, for error messages."""
        if self.explicit is not None:
            return f"--round-timeout {self.explicit:g}s"
        return f"--round-timeout auto (now {self.seconds:g}s)"
