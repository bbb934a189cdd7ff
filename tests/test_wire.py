"""Per-job fields of Collab messages: short ones as lists, long ones as arrays, the same values either way, and
NVFlare's per-call INFO lines quieted without hiding warnings."""

from __future__ import annotations

import logging

import numpy as np

from devsim_flare.leaf_calls import PER_CALL_LOGGERS, quiet_per_call_logs
from devsim_flare.wire import MAX_LIST_LENGTH, per_job_field


def test_short_fields_go_as_lists_and_long_ones_as_arrays_with_the_same_values():
    short = per_job_field(np.array([3, 1, 2], dtype=np.int64))
    assert short == [3, 1, 2] and all(type(v) is int for v in short)
    assert per_job_field(np.array([0.5, 1.5], dtype=np.float32)) == [0.5, 1.5]
    assert per_job_field((7, 8)) == [7, 8]
    long = per_job_field(list(range(MAX_LIST_LENGTH + 1)))
    assert isinstance(long, np.ndarray) and long.dtype == np.int64 and long.tolist() == list(range(MAX_LIST_LENGTH + 1))
    floats = per_job_field(np.linspace(0, 1, 100, dtype=np.float32))
    assert floats.dtype == np.float32 and float(np.sum(floats)) == float(
        np.sum(np.linspace(0, 1, 100, dtype=np.float32))
    )


def test_per_call_info_lines_are_quieted_and_warnings_kept():
    from nvflare.collab.api.group import Group
    from nvflare.collab.runtime.cell_dispatcher import CellDispatcher

    assert {f"{c.__module__}.{c.__qualname__}" for c in (CellDispatcher, Group)} == set(PER_CALL_LOGGERS)
    saved = {name: logging.getLogger(name).level for name in PER_CALL_LOGGERS}
    try:
        quiet_per_call_logs()
        for name in PER_CALL_LOGGERS:
            logger = logging.getLogger(name)
            assert not logger.isEnabledFor(logging.INFO) and logger.isEnabledFor(logging.WARNING)
    finally:
        for name, level in saved.items():
            logging.getLogger(name).setLevel(level)
