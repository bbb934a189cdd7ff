"""Validation of model updates before they reach aggregation: one bad reply must not poison the model.

A leaf's reply (or an asynchronous job's result) is checked against the global model's entries:
same keys, ``numpy.ndarray`` values of dtype float32 and the expected shapes, only finite values,
and a global L2 norm under an absolute and/or adaptive limit. Every check returns an
:class:`UpdateRejection` instead of raising, whatever the input: a hostile or corrupt payload is
dropped and counted, and the server keeps running.
"""

from __future__ import annotations

import functools
import math
import numbers
import statistics
import threading
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

CATEGORIES = ("keys", "shape", "dtype", "non_finite", "norm", "weight", "type", "error")
"""Rejection categories counted by :meth:`UpdateValidator.counts` ("error": the check itself failed)."""

NORM_HISTORY = 100
"""Accepted norms remembered for the adaptive limit's median."""

ADAPTIVE_MIN_UPDATES = 5
"""Accepted updates needed before the adaptive limit applies."""

_MAX_LISTED = 5
_MAX_REPR = 60
_MAX_REASON = 500


@dataclass(frozen=True)
class UpdateRejection:
    """Why an update was refused.

    ``source`` names the sender ("site-1", "device 17"), ``reason`` is a human-readable sentence
    naming the offending entry, and ``category`` is one of :data:`CATEGORIES`.
    """

    source: str
    reason: str
    category: str

    def __str__(self) -> str:
        return f"update from {self.source} rejected ({self.category}): {self.reason}"


class _Reject(Exception):
    """Internal: a failed check, carried up to the public entry point."""

    def __init__(self, category: str, reason: str):
        super().__init__(reason)
        self.category = category
        self.reason = reason


class UpdateValidator:
    """Checks updates against the model's entries and norm limits; thread-safe.

    ``reference`` gives the expected entry names and shapes (e.g. the global weights; only shapes are
    kept). ``max_norm`` is an absolute limit on the global L2 norm of the per-sample-mean delta
    (model-parameter units). ``max_norm_factor`` (> 1) adds an adaptive limit of that factor times the
    median norm of the last :data:`NORM_HISTORY` accepted updates, once :data:`ADAPTIVE_MIN_UPDATES`
    updates were accepted; with both set, the smaller limit applies. Updates checked one at a time
    (:meth:`check_delta`, :meth:`check_job_result`) also remember the norms of the last
    :data:`NORM_HISTORY` candidates, rejected ones included, and the adaptive limit uses their lower median
    where it is the larger: a scale most recent updates share is where training is, so a run whose
    updates all grew together recovers after about half a history of rejections instead of rejecting
    every update from then on. Use one validator per kind of update (leaf mean deltas and single-device
    job deltas have different typical norms).
    """

    def __init__(
        self,
        reference: Mapping[str, np.ndarray],
        max_norm: float | None = None,
        max_norm_factor: float | None = None,
    ):
        if not isinstance(reference, Mapping) or not reference:
            raise ValueError("reference must be a non-empty mapping of model entry names to arrays")
        if max_norm is not None and not (_is_real(max_norm) and math.isfinite(max_norm) and max_norm > 0):
            raise ValueError(f"max_norm must be a finite number > 0 or None, got {max_norm!r}")
        if max_norm_factor is not None and not (
            _is_real(max_norm_factor) and math.isfinite(max_norm_factor) and max_norm_factor > 1
        ):
            raise ValueError(f"max_norm_factor must be a finite number > 1 or None, got {max_norm_factor!r}")
        self._shapes: dict[str, tuple[int, ...]] = {str(k): tuple(np.shape(v)) for k, v in reference.items()}
        self.max_norm = None if max_norm is None else float(max_norm)
        self.max_norm_factor = None if max_norm_factor is None else float(max_norm_factor)
        self._norms: deque[float] = deque(maxlen=NORM_HISTORY)
        self._candidates: deque[float] = deque(maxlen=NORM_HISTORY)
        """Norms of the last updates checked one at a time that passed every check but the adaptive limit."""
        self._counts = dict.fromkeys(CATEGORIES, 0)
        self._lock = threading.Lock()

    def check_delta(self, delta: Mapping, source: str, weight: float = 1.0) -> UpdateRejection | None:
        """None if ``delta`` is acceptable, else the rejection (counted).

        ``weight`` divides the norm before the limits apply: pass the sample count when ``delta`` is a
        sample-weighted sum, so that the per-sample-mean delta is what is limited.
        """
        return self._run(source, lambda: self._check(delta, _positive(weight, "weight")))

    def check_leaf_payload(self, payload: Mapping, source: str) -> UpdateRejection | None:
        """Check a synchronous leaf reply (``LeafRoundResult.to_payload``): ``delta_sum`` and ``total_weight``; a
        round of one reply (:meth:`check_round`)."""
        name = _safe_text(source) if not isinstance(source, str) else source
        return self.check_round({name: payload})[name]

    def check_round(
        self, payloads: Mapping[str, Any], max_norms: Mapping[str, float | None] | None = None
    ) -> dict[str, UpdateRejection | None]:
        """Check a synchronous round's leaf replies together (each as :meth:`check_leaf_payload`); returns, per
        source, None or its rejection. ``max_norms`` gives a source's absolute limit in place of ``max_norm``.

        The adaptive limit is ``max_norm_factor`` times the larger of the remembered median and this round's lower
        median (:func:`statistics.median_low`, taken when at least two replies pass every other check). A scale that
        most of a round's leaves share is where training is, not a fault: when learning leaves a plateau, leaf
        updates grow 25x within 50 rounds (digits, one local step a device), which a median of the last
        :data:`NORM_HISTORY` updates alone rejected, every leaf at once. The lower median stays an honest norm while
        at most half of the replies are faulty (one of two, two of four)."""
        limits = max_norms or {}
        norms: dict[str, float] = {}

        def measure(source: str, payload: Any) -> None:
            norms[source] = self._leaf_norm(payload, limits.get(source, self.max_norm))

        results = {
            source: self._run(source, functools.partial(measure, source, payload))
            for source, payload in payloads.items()
        }
        with self._lock:
            limit, why = self._adaptive_limit(sorted(norms.values()))
            for source, norm in norms.items():
                if limit is not None and not norm <= limit:
                    results[source] = self._reject_locked(
                        source, "norm", f"norm {norm:.1e} exceeds the limit {limit:.1e}{why}"
                    )
                else:
                    self._norms.append(norm)
        return results

    def check_job_result(self, delta: Mapping, num_samples: Any, source: str) -> UpdateRejection | None:
        """Check one asynchronous job's (unweighted) delta and its sample count (finite, > 0)."""

        def check() -> None:
            _positive(num_samples, "num_samples")
            self._check(delta, 1.0)

        return self._run(source, check)

    def counts(self) -> dict[str, int]:
        """Rejections so far per category (every category of :data:`CATEGORIES`, zeros included)."""
        with self._lock:
            return dict(self._counts)

    @property
    def median_norm(self) -> float | None:
        """Median norm of the remembered accepted updates; None before any was accepted."""
        with self._lock:
            return statistics.median(self._norms) if self._norms else None

    def _run(self, source: Any, check: Callable[[], None]) -> UpdateRejection | None:
        name = _safe_text(source) if not isinstance(source, str) else source
        try:
            check()
            return None
        except _Reject as rejection:
            return self._reject(name, rejection.category, rejection.reason)
        except Exception as error:
            return self._reject(name, "error", f"could not check the update: {type(error).__name__}: {error}")

    def _reject(self, source: str, category: str, reason: str) -> UpdateRejection:
        with self._lock:
            return self._reject_locked(source, category, reason)

    def _reject_locked(self, source: str, category: str, reason: str) -> UpdateRejection:
        """:meth:`_reject` for a caller that holds the lock."""
        self._counts[category] += 1
        text = reason if len(reason) <= _MAX_REASON else reason[: _MAX_REASON - 3] + "..."
        return UpdateRejection(source=source, reason=text, category=category)

    def _leaf_norm(self, payload: Any, max_norm: float | None) -> float:
        """A leaf reply's per-sample-mean delta norm after every check but the adaptive limit (raises _Reject)."""
        if not isinstance(payload, Mapping):
            raise _Reject("type", f"payload has type {_type_name(payload)}, expected a mapping")
        if "delta_sum" not in payload:
            raise _Reject("type", "payload has no 'delta_sum'")
        if "total_weight" not in payload:
            raise _Reject("weight", "payload has no 'total_weight'")
        weight = _positive(payload["total_weight"], "total_weight")
        norm = self._norm(payload["delta_sum"], weight, square_sum=True)
        if max_norm is not None and not norm <= max_norm:
            raise _Reject("norm", f"norm {norm:.1e} exceeds the limit {max_norm:.1e}")
        return norm

    def _check(self, delta: Any, weight: float) -> None:
        limited = self.max_norm is not None or self.max_norm_factor is not None
        norm = self._norm(delta, weight, square_sum=limited)
        if not limited:
            return
        with self._lock:
            limit, why = self._limit(recent=True)
            self._candidates.append(norm)
            if limit is not None and not norm <= limit:
                raise _Reject("norm", f"norm {norm:.1e} exceeds the limit {limit:.1e}{why}")
            self._norms.append(norm)

    def _norm(self, delta: Any, weight: float, square_sum: bool) -> float:
        """Keys, types, shapes and finiteness of ``delta`` (raises _Reject); with ``square_sum`` its global L2 norm
        divided by ``weight``, else 0.0."""
        if not isinstance(delta, Mapping):
            raise _Reject(
                "type", f"delta has type {_type_name(delta)}, expected a mapping of model entry names to arrays"
            )
        _check_keys(delta, self._shapes)
        total = 0.0
        with np.errstate(over="ignore", invalid="ignore"):  # float32 overflow is expected: _square_sum redoes it
            for key, shape in self._shapes.items():
                total += _check_entry(key, delta[key], shape, square_sum=square_sum)
        return math.sqrt(total) / weight

    def _limit(self, recent: bool = False) -> tuple[float | None, str]:
        """Current limit and how the adaptive part came about; with ``recent``, the adaptive part also weighs the
        remembered candidates' lower median (caller holds the lock)."""
        limit, why = self.max_norm, ""
        candidates = list(self._candidates) if recent and len(self._candidates) >= ADAPTIVE_MIN_UPDATES else []
        adaptive, adaptive_why = self._adaptive_limit(candidates, "the last {} checked")
        if adaptive is not None and (limit is None or adaptive < limit):
            limit, why = adaptive, adaptive_why
        return limit, why

    def _adaptive_limit(self, round_norms: list[float], which: str = "this round's {}") -> tuple[float | None, str]:
        """The adaptive limit (None before :data:`ADAPTIVE_MIN_UPDATES` accepted updates, or without a factor) from
        the remembered median and, with two or more, the lower median of ``round_norms`` (``which``, formatted with
        their count, names them in the reason); and how it came about (caller holds the lock)."""
        if self.max_norm_factor is None or len(self._norms) < ADAPTIVE_MIN_UPDATES:
            return None, ""
        median = statistics.median(self._norms)
        why = f" ({self.max_norm_factor:g} x median {median:.1e} of the last {len(self._norms)} accepted)"
        if len(round_norms) >= 2 and statistics.median_low(round_norms) > median:
            median = statistics.median_low(round_norms)
            why = f" ({self.max_norm_factor:g} x {median:.1e}, the lower median of {which.format(len(round_norms))})"
        return (self.max_norm_factor * median, why) if median > 0 else (None, "")


def _check_keys(delta: Mapping, shapes: Mapping[str, tuple[int, ...]]) -> None:
    present = list(delta.keys())
    present_set = set(present)
    missing = [k for k in shapes if k not in present_set]
    unexpected = [k for k in present if not (isinstance(k, str) and k in shapes)]
    problems = []
    if missing:
        problems.append(f"missing keys {_listing(missing)}")
    if unexpected:
        problems.append(f"unexpected keys {_listing(unexpected)}")
    if problems:
        raise _Reject("keys", "; ".join(problems))


def _check_entry(key: str, value: Any, shape: tuple[int, ...], square_sum: bool = False) -> float:
    """Type, dtype, shape and finiteness of one entry; with ``square_sum`` returns its float64 sum of squares
    (else 0.0). A finite sum of squares already proves every value finite, so the separate finiteness pass runs
    only when the sum is not: one pass over the entry instead of two when the caller needs the norm."""
    if type(value) is not np.ndarray:
        raise _Reject("type", f"{key} has type {_type_name(value)}, expected numpy.ndarray")
    if value.dtype != np.float32:
        raise _Reject("dtype", f"dtype {value.dtype} for {key}, expected float32")
    if value.shape != shape:
        raise _Reject("shape", f"shape {value.shape} != expected {shape} for {key}")
    if square_sum:
        total = _square_sum(value)
        finite = math.isfinite(total)
    else:
        total, finite = 0.0, bool(np.isfinite(value).all())
    if not finite:
        nan = int(np.isnan(value).sum())
        inf = int(np.isinf(value).sum())
        raise _Reject("non_finite", f"non-finite values in {key} ({nan} NaN, {inf} inf)")
    return total


def _square_sum(value: np.ndarray) -> float:
    """Sum of squares of a float32 array, finite exactly when every value is.

    First a float32 dot product (BLAS, no copy, about 7x faster than a float64 pass at the CNN's sizes): any NaN or
    inf makes it non-finite, so a finite result proves every value finite. Only when it is not finite (a bad value,
    or float32 overflow past about 3.4e38) is it redone in float64, which cannot overflow for finite float32 values
    (at most about 1.2e77 per value) and so tells the two apart."""
    flat = value.reshape(-1)
    fast = float(np.dot(flat, flat))
    if math.isfinite(fast):
        return fast
    return float(np.square(value, dtype=np.float64).sum())


def _positive(value: Any, name: str) -> float:
    if not _is_real(value):
        raise _Reject("weight", f"{name} has type {_type_name(value)}, expected a number > 0")
    number = float(value)
    if not (math.isfinite(number) and number > 0):
        raise _Reject("weight", f"{name} must be > 0 and finite, got {number!r}")
    return number


def _is_real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


def _type_name(value: Any) -> str:
    kind = type(value)
    module = kind.__module__
    return kind.__qualname__ if module == "builtins" else f"{module}.{kind.__qualname__}"


def _safe_text(value: Any) -> str:
    try:
        text = repr(value) if not isinstance(value, str) else value
    except Exception:
        text = f"<{type(value).__name__} with a failing repr>"
    return text if len(text) <= _MAX_REPR else text[: _MAX_REPR - 3] + "..."


def _key_text(key: Any) -> str:
    """A key as it would appear in a Python list literal, truncated."""
    if isinstance(key, str):
        return repr(key if len(key) <= _MAX_REPR else key[: _MAX_REPR - 3] + "...")
    return _safe_text(key)


def _listing(items: list[Any]) -> str:
    shown = ", ".join(_key_text(item) for item in items[:_MAX_LISTED])
    more = f", ... {len(items) - _MAX_LISTED} more" if len(items) > _MAX_LISTED else ""
    return f"[{shown}{more}]"
