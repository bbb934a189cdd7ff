"""Where a round's wall time goes: disjoint parts that add up to the whole.

All times are seconds. Timestamps are wall-clock ``time.time()`` values; durations are seconds.

Synchronous round
-----------------
A round is decomposed along the critical path of its slowest leaf, the leaf whose reply arrived
last (approximated by the largest ``leaf_replied_at``)::

    round_start -> dispatch_start               server_prepare
    dispatch_start -> leaf received_at          dispatch
    leaf_train_wall                             leaf_compute
    leaf_aggregate                              leaf_aggregate
    received_at -> replied_at, minus the two    leaf_overhead   (decode, payload building)
    leaf replied_at -> results_in               return
    results_in -> aggregate_end                 server_aggregate
    aggregate_end -> eval_end                   evaluation      (0 in rounds without evaluation)
    wall - sum of the above                     remainder

Unclamped, these parts telescope to ``eval_end - round_start`` exactly, so with consistent clocks
every part is >= 0 and the parts sum to the wall time (up to float rounding, ~1e-15 s). Each part
is clamped at 0, and ``remainder = wall - sum(parts)`` reports what the clamping removed: it is
never positive, and it is negative only when the clocks disagree, i.e. clock skew between the
server and leaf processes (``dispatch`` and ``return`` mix the two clocks) or ``time.time`` being
slewed or stepped against the leaf's ``perf_counter`` durations (``leaf_overhead``). Skew that
keeps every part non-negative only moves time between ``dispatch`` and ``return`` and cannot be
detected from these stamps. ``RoundTiming.skewed()`` flags a remainder below ``-tolerance``.

``device_compute_sum`` (over all leaves, all devices) and ``device_compute_max`` (slowest single
device) are informational and not part of the sum, as is ``codec_seconds`` (encode + decode of the
device updates on the uplink, error feedback's bookkeeping included, summed over devices and leaves;
it is inside ``leaf_compute``). ``critical_leaf_codec_seconds`` is the slowest leaf's share of it:
the codec seconds on the round's critical path, i.e. what the codec adds to the round's wall time
when the leaves run side by side (``codec_seconds`` over the wall overstates that by up to the number
of leaves). The summary prints both codec figures with their share of the wall time.

Asynchronous version window
---------------------------
A window runs from one global version's publication to the next; it plays the role of the round.
The server's own serial sections (``server_prepare``, ``server_aggregate``, ``evaluation``) are
summed over the window as they are disjoint in the server thread. While the server is blocked
waiting for results (``WindowTiming.add_wait``), several calls may be in flight at once, so
wall time cannot be assigned to one call: each accepted call is decomposed as above (``dispatch``,
``leaf_compute``, ``leaf_aggregate``, ``leaf_overhead``, ``return``), these per-call seconds are
summed over the window's calls (busy seconds), and the blocked time is split over the five call
parts in proportion to those sums. ``remainder = wall - sum(parts)`` is then the server time
outside every measured section (positive), or blocked time with no accepted call to attribute it
to. A call counts in the window in which its result is accepted. The raw busy seconds and the
concurrency (busy seconds / blocked seconds) are reported in ``info``.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

SERVER_PARTS = ("server_prepare", "server_aggregate", "evaluation")
WALL_SHARE_INFO = (  # info seconds printed with a share of the wall
    "codec_seconds",
    "critical_leaf_codec_seconds",
    "server_decode_seconds",
)
CALL_PARTS = ("dispatch", "leaf_compute", "leaf_aggregate", "leaf_overhead", "return")
MEASURED_PARTS = (
    "server_prepare",
    "dispatch",
    "leaf_compute",
    "leaf_aggregate",
    "leaf_overhead",
    "return",
    "server_aggregate",
    "evaluation",
)
PART_NAMES = (*MEASURED_PARTS, "remainder")
SKEW_TOLERANCE_S = 1e-3


@dataclass(frozen=True)
class ServerStamps:
    """The server's ``time.time()`` stamps of one round (seconds since the epoch)."""

    round_start: float
    dispatch_start: float
    results_in: float
    aggregate_end: float
    eval_end: float


@dataclass(frozen=True)
class LeafTiming:
    """One leaf's reply timing: wall-clock stamps (leaf clock, s) and durations (s)."""

    name: str
    received_at: float
    replied_at: float
    train_wall: float
    aggregate: float = 0.0
    device_compute_sum: float = 0.0
    device_compute_max: float = 0.0
    codec_seconds: float = 0.0

    @classmethod
    def from_payload(cls, name: str, timing: Mapping[str, float]) -> LeafTiming:
        """From a leaf payload's ``timing`` dict (``leaf_received_at``, ``leaf_replied_at``, ``leaf_train_wall``
        required; ``leaf_aggregate``, ``device_compute_sum``, ``device_compute_max``, ``codec_seconds`` default
        to 0)."""
        missing = [k for k in ("leaf_received_at", "leaf_replied_at", "leaf_train_wall") if k not in timing]
        if missing:
            raise ValueError(f"leaf {name!r}: timing lacks {', '.join(missing)}")
        return cls(
            name=name,
            received_at=float(timing["leaf_received_at"]),
            replied_at=float(timing["leaf_replied_at"]),
            train_wall=float(timing["leaf_train_wall"]),
            aggregate=float(timing.get("leaf_aggregate", 0.0)),
            device_compute_sum=float(timing.get("device_compute_sum", 0.0)),
            device_compute_max=float(timing.get("device_compute_max", 0.0)),
            codec_seconds=float(timing.get("codec_seconds", 0.0)),
        )


def call_parts(dispatch_start: float, results_in: float, leaf: LeafTiming) -> dict[str, float]:
    """One call's parts in seconds, each clamped at 0 (see the module docstring).

    ``dispatch_start`` and ``results_in`` are server stamps; the leaf's stamps are on its own clock.
    """
    return {
        "dispatch": max(0.0, leaf.received_at - dispatch_start),
        "leaf_compute": max(0.0, leaf.train_wall),
        "leaf_aggregate": max(0.0, leaf.aggregate),
        "leaf_overhead": max(0.0, leaf.replied_at - leaf.received_at - leaf.train_wall - leaf.aggregate),
        "return": max(0.0, results_in - leaf.replied_at),
    }


@dataclass(frozen=True)
class RoundTiming:
    """A round's (or version window's) wall time in seconds and its disjoint parts.

    ``measured`` holds every part of ``MEASURED_PARTS`` (s, each >= 0); the remainder is derived so
    that ``sum(parts().values()) == wall``. ``critical_leaf`` names the slowest leaf (None for an
    async window). ``info`` holds informational seconds and counts that are not part of the sum.
    """

    wall: float
    measured: Mapping[str, float]
    critical_leaf: str | None = None
    info: Mapping[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if set(self.measured) != set(MEASURED_PARTS):
            raise ValueError(f"measured parts must be exactly {', '.join(MEASURED_PARTS)}")

    @classmethod
    def from_round(cls, stamps: ServerStamps, leaves: Mapping[str, Mapping[str, float]]) -> RoundTiming:
        """Break a synchronous round down along its slowest leaf.

        ``leaves`` maps leaf name to the ``timing`` dict of its reply (see ``LeafTiming.from_payload``).
        The slowest leaf is the one with the largest ``leaf_replied_at`` (ties: first name in sort order).
        Without any reply (every selected device sat on a lost leaf) the call parts are 0 and the round's
        time between dispatch and results falls in the remainder.
        """
        if not leaves:
            measured = dict.fromkeys(MEASURED_PARTS, 0.0)
            measured["server_prepare"] = max(0.0, stamps.dispatch_start - stamps.round_start)
            measured["server_aggregate"] = max(0.0, stamps.aggregate_end - stamps.results_in)
            measured["evaluation"] = max(0.0, stamps.eval_end - stamps.aggregate_end)
            info = dict.fromkeys(
                ("device_compute_sum", "device_compute_max", "codec_seconds", "critical_leaf_codec_seconds"), 0.0
            )
            return cls(stamps.eval_end - stamps.round_start, measured, None, info)
        replies = [LeafTiming.from_payload(name, leaves[name]) for name in sorted(leaves)]
        slowest = max(replies, key=lambda leaf: leaf.replied_at)
        measured = {
            "server_prepare": max(0.0, stamps.dispatch_start - stamps.round_start),
            **call_parts(stamps.dispatch_start, stamps.results_in, slowest),
            "server_aggregate": max(0.0, stamps.aggregate_end - stamps.results_in),
            "evaluation": max(0.0, stamps.eval_end - stamps.aggregate_end),
        }
        info = {
            "device_compute_sum": sum(leaf.device_compute_sum for leaf in replies),
            "device_compute_max": max(leaf.device_compute_max for leaf in replies),
            "codec_seconds": sum(leaf.codec_seconds for leaf in replies),
            "critical_leaf_codec_seconds": slowest.codec_seconds,
        }
        return cls(stamps.eval_end - stamps.round_start, measured, slowest.name, info)

    @property
    def remainder(self) -> float:
        """``wall - sum(measured parts)`` in seconds; negative only through clock skew (sync rounds)."""
        return self.wall - math.fsum(self.measured.values())

    def parts(self) -> dict[str, float]:
        """Every part in seconds, in ``PART_NAMES`` order, remainder last; they sum to ``wall``."""
        parts = {name: float(self.measured[name]) for name in MEASURED_PARTS}
        parts["remainder"] = self.remainder
        return parts

    def skewed(self, tolerance: float = SKEW_TOLERANCE_S) -> bool:
        """True when the remainder is below ``-tolerance`` seconds (the clocks disagree)."""
        return self.remainder < -tolerance

    def to_dict(self) -> dict:
        """JSON form for a results record: ``{"wall", "parts", "critical_leaf", "info"}``."""
        return {"wall": self.wall, "parts": self.parts(), "critical_leaf": self.critical_leaf, "info": dict(self.info)}

    @classmethod
    def from_dict(cls, data: Mapping) -> RoundTiming:
        """Inverse of ``to_dict`` (the stored remainder is recomputed)."""
        parts = data["parts"]
        return cls(
            wall=float(data["wall"]),
            measured={name: float(parts[name]) for name in MEASURED_PARTS},
            critical_leaf=data.get("critical_leaf"),
            info={k: float(v) for k, v in (data.get("info") or {}).items()},
        )


class WindowTiming:
    """Accumulates an async version window's parts; memory is constant in the number of calls.

    Usage: ``WindowTiming(start)``; ``add(part, s)`` for the server's serial sections; ``add_wait(s)``
    for time the server spent blocked on results; ``add_call(...)`` for each result accepted in this
    window; ``close(end)`` returns the window's ``RoundTiming``. See the module docstring.
    """

    def __init__(self, start: float):
        self.start = float(start)
        self._server = dict.fromkeys(SERVER_PARTS, 0.0)
        self._busy = dict.fromkeys(CALL_PARTS, 0.0)
        self._wait = 0.0
        self._calls = 0
        self._compute_sum = 0.0
        self._compute_max = 0.0
        self._codec = 0.0
        self._server_decode = 0.0

    def add(self, part: str, seconds: float) -> None:
        """Add ``seconds`` (>= 0) of a server-thread section: one of ``SERVER_PARTS``."""
        if part not in self._server:
            raise ValueError(f"unknown server part {part!r}; one of {', '.join(SERVER_PARTS)}")
        self._server[part] += max(0.0, float(seconds))

    def add_server_decode(self, seconds: float) -> None:
        """Add ``seconds`` (>= 0) the server spent decoding forwarded device updates (inside its own parts)."""
        self._server_decode += max(0.0, float(seconds))

    def add_wait(self, seconds: float) -> None:
        """Add ``seconds`` (>= 0) during which the server thread was blocked waiting for call results."""
        self._wait += max(0.0, float(seconds))

    def add_call(
        self, dispatch_start: float, result_in: float, leaf_timing: Mapping[str, float], name: str = ""
    ) -> None:
        """Add one accepted call: server stamps of its dispatch and of its result's arrival, and the
        leaf's ``timing`` dict (as for ``LeafTiming.from_payload``)."""
        leaf = LeafTiming.from_payload(name or "call", leaf_timing)
        for part, seconds in call_parts(dispatch_start, result_in, leaf).items():
            self._busy[part] += seconds
        self._calls += 1
        self._compute_sum += leaf.device_compute_sum
        self._compute_max = max(self._compute_max, leaf.device_compute_max)
        self._codec += leaf.codec_seconds

    def close(self, end: float) -> RoundTiming:
        """The window's timing, from ``start`` to ``end`` (server ``time.time()`` stamps, s)."""
        busy_total = math.fsum(self._busy.values())
        if busy_total > 0.0:
            call = {part: self._wait * seconds / busy_total for part, seconds in self._busy.items()}
        else:
            call = dict.fromkeys(CALL_PARTS, 0.0)
        measured = {name: self._server[name] if name in self._server else call[name] for name in MEASURED_PARTS}
        info = {
            "device_compute_sum": self._compute_sum,
            "device_compute_max": self._compute_max,
            "codec_seconds": self._codec,
            "server_decode_seconds": self._server_decode,
            "calls": float(self._calls),
            "wait": self._wait,
            "call_busy_seconds": busy_total,
            "concurrency": busy_total / self._wait if self._wait > 0.0 else 0.0,
        }
        return RoundTiming(float(end) - self.start, measured, None, info)


def with_info(timing: RoundTiming, values: Mapping[str, float]) -> RoundTiming:
    """``timing`` with ``values`` added to its ``info`` (informational, not part of the seconds' sum)."""
    return dataclasses.replace(timing, info={**timing.info, **{k: float(v) for k, v in values.items()}})


def summarize(timings: Sequence[RoundTiming], unit: str = "round", tolerance: float = SKEW_TOLERANCE_S) -> str:
    """A profiler-style table: total and mean seconds per part and its share of the total wall time.

    ``unit`` names what one timing is ("round" or "window"). Informational values follow the table.
    """
    if not timings:
        return f"timing: no {unit}s recorded"
    count = len(timings)
    wall = math.fsum(t.wall for t in timings)
    totals = {name: math.fsum(t.parts()[name] for t in timings) for name in PART_NAMES}
    width = max(len(name) for name in (*PART_NAMES, "device_compute_sum"))
    lines = [
        f"timing over {count} {unit}{'s' if count != 1 else ''}: {wall:.3f} s wall",
        f"{'part':<{width}}  {'total s':>11}  {'mean s':>10}  {'share':>7}",
    ]
    for name in (*PART_NAMES, "wall"):
        total = wall if name == "wall" else totals[name]
        share = f"{100.0 * total / wall:6.1f}%" if wall > 0 else "      -"
        lines.append(f"{name:<{width}}  {total:11.4f}  {total / count:10.4f}  {share:>7}")
    info_keys = sorted({key for t in timings for key in t.info})
    if info_keys:
        info_width = max(width, *(len(key) for key in info_keys))
        lines.append(f"not in the sum (mean per {unit}; codec seconds with their share of the wall time):")
        for key in info_keys:
            values = [t.info[key] for t in timings if key in t.info]
            share = ""
            if key in WALL_SHARE_INFO:
                key_wall = math.fsum(t.wall for t in timings if key in t.info)
                share = f"  {100.0 * math.fsum(values) / key_wall:6.1f}%" if key_wall > 0 else ""
            mean = math.fsum(values) / len(values)
            shown = f"{mean:10.4f}" if abs(mean) < 1000 else f"{mean:10,.0f}"  # seconds, or counts such as bytes
            lines.append(f"{key:<{info_width}}  {'':>11}  {shown}{share}")
    leaves = Counter(t.critical_leaf for t in timings if t.critical_leaf is not None)
    if leaves:
        ranked = ", ".join(f"{name} {n}x" for name, n in sorted(leaves.items(), key=lambda kv: (-kv[1], kv[0])))
        lines.append(f"slowest leaf: {ranked}")
    skewed = sum(1 for t in timings if t.skewed(tolerance))
    if skewed:
        lines.append(
            f"warning: remainder below -{tolerance:g} s in {skewed} of {count} {unit}s: "
            "clock skew between server and leaf processes"
        )
    return "\n".join(lines)
