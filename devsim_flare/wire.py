"""Small per-job fields of Collab messages in the form NVFlare serialises cheapest.

NVFlare (FOBS) serialises a NumPy array through its array decomposer at a fixed cost of about 200 us per array
(dump and load, measured on this project's 2-core CPU), whatever its size, and a list element by element (msgpack):
seven fields of 5 values cost 23 us as lists against 207 us as arrays; at 100 values the two are even; at 1,000 the
lists cost 10x. An asynchronous leaf call carries a handful of jobs, so its per-job fields go as lists up to
:data:`MAX_LIST_LENGTH` values and as arrays beyond.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

MAX_LIST_LENGTH = 32
"""Longest per-job field sent as a list; a longer one goes as a NumPy array."""


def per_job_field(values: Sequence | np.ndarray, dtype: type = np.int64) -> list | np.ndarray:
    """``values`` (one per job) as a list of Python numbers when short, else as a ``dtype`` array (an array stays
    one). Either form indexes and sums alike on the receiving side."""
    if len(values) <= MAX_LIST_LENGTH:
        return np.asarray(values).tolist() if isinstance(values, np.ndarray) else list(values)
    return np.asarray(values, dtype=values.dtype if isinstance(values, np.ndarray) else dtype)
