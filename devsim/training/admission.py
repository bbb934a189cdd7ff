"""What a leaf does with each device it trained in a synchronous round, in order: drop it (dropout), corrupt it
(fault injection, testing), send it over the uplink (:class:`~devsim.compression.UplinkCompressor`), check it
(finite, within the norm limit) and add it, weighted by its samples, to the worker's sum. Under differential
privacy each update is clipped (and in local DP noised) before the uplink and counts once in the sum.

:func:`admit` takes one device's delta; :func:`admit_rows` a batched group's stacked ``(D, *shape)`` deltas, which
cross the uplink together and are then checked and summed device by device in the same order, so both give the
same sum.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from devsim.compression import UplinkCompressor, UplinkStats
from devsim.population.dropout import DROPPED, DropoutModel
from devsim.population.faults import FaultInjector
from devsim.privacy.device import DevicePrivacy
from devsim.training.local import DeviceMetrics


@dataclass
class ChunkResult:
    """One worker's share of a round: its weighted delta sum, accepted devices' metrics, counts, rejections."""

    accumulator: list[torch.Tensor]
    metrics: list[DeviceMetrics]
    counts: dict[str, int]
    rejections: list[str]
    uplink: UplinkStats = field(default_factory=UplinkStats)


@dataclass(frozen=True)
class RoundChecks:
    """What a synchronous round applies to each device: dropout, injected faults, the uplink and the norm limit."""

    dropout: DropoutModel | None
    faults: FaultInjector | None
    max_norm: float | None
    uplink: UplinkCompressor
    privacy: DevicePrivacy | None = None

    def outcome(self, round_num: int, device_id: int) -> str:
        return self.dropout.outcome(round_num, device_id) if self.dropout is not None and self.dropout.enabled else "ok"


def admit(
    result: ChunkResult,
    delta: list[torch.Tensor],
    metrics: DeviceMetrics,
    outcome: str,
    round_num: int,
    checks: RoundChecks,
) -> None:
    """Add one trained device's delta to the chunk's sum unless it dropped out or fails validation."""
    if outcome == DROPPED:
        result.counts["dropped"] += 1
        return
    _inject_fault(delta, metrics.device_id, round_num, checks)
    below = checks.privacy.apply_(delta, round_num, metrics.device_id) if checks.privacy is not None else None
    received = checks.uplink.transmit(metrics.device_id, round_num, delta, result.uplink)
    _accept(result, received, metrics, checks, below)


def admit_rows(
    result: ChunkResult,
    deltas: list[torch.Tensor],
    metrics: list[DeviceMetrics],
    outcomes: list[str],
    round_num: int,
    checks: RoundChecks,
) -> None:
    """:func:`_admit` for a batched group: ``deltas`` are (D, *shape), row i being ``metrics[i]``'s device. The
    devices that did not drop out cross the uplink together (:meth:`UplinkCompressor.transmit_rows`); the sum,
    the checks and their order are those of admitting the devices one by one."""
    kept = [i for i, outcome in enumerate(outcomes) if outcome != DROPPED]
    result.counts["dropped"] += len(outcomes) - len(kept)
    if not kept:
        return
    rows = deltas if len(kept) == len(outcomes) else [t[kept] for t in deltas]
    for row, i in enumerate(kept):
        _inject_fault([t[row] for t in rows], metrics[i].device_id, round_num, checks)
    ids = [metrics[i].device_id for i in kept]
    below = checks.privacy.apply_rows_(rows, round_num, ids) if checks.privacy is not None else [None] * len(ids)
    received = checks.uplink.transmit_rows(ids, round_num, rows, result.uplink)
    per_row = [[t[row] for t in received] for row in range(len(kept))]
    norms = torch.stack([_norm(delta) for delta in per_row]).tolist()  # one host sync for the group, not one a row
    for row, i in enumerate(kept):
        _accept(result, per_row[row], metrics[i], checks, below[row], norms[row])


def _inject_fault(delta: list[torch.Tensor], device_id: int, round_num: int, checks: RoundChecks) -> None:
    """Corrupt ``delta`` in place when the fault injector picks this device in this round (testing)."""
    fault = checks.faults.device_fault(round_num, device_id) if checks.faults is not None else None
    if fault is not None:
        _corrupt_tensors(delta, fault)


def _norm(delta: list[torch.Tensor]) -> torch.Tensor:
    """The L2 norm of a whole delta, a 0-d tensor on its device (the same operations row by row or alone)."""
    return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(delta)))


def _accept(
    result: ChunkResult,
    delta: list[torch.Tensor],
    metrics: DeviceMetrics,
    checks: RoundChecks,
    below: bool | None,
    norm: float | None = None,
) -> None:
    """Add a received delta to the chunk's sum unless it is non-finite or too large: weighted by its samples, or
    under DP by 1 (each device's clipped update counts once; ``below``: its norm was within the clip norm).
    ``norm``: the delta's :func:`_norm` when the caller computed it already."""
    device_id = metrics.device_id
    norm = float(_norm(delta)) if norm is None else norm
    max_norm = checks.max_norm
    if not np.isfinite(norm) or (max_norm is not None and norm > max_norm):
        result.counts["rejected"] += 1
        reason = "non-finite values" if not np.isfinite(norm) else f"norm {norm:.3g} exceeds {max_norm:.3g}"
        result.rejections.append(f"device {device_id}: {reason}")
        return
    weight = 1.0 if checks.privacy is not None else float(metrics.num_samples)
    torch._foreach_add_(result.accumulator, delta, alpha=weight)
    result.metrics.append(metrics)
    if below:
        result.counts["dp_below_clip"] = result.counts.get("dp_below_clip", 0) + 1


def _corrupt_tensors(delta: list[torch.Tensor], kind: str) -> None:
    """Device-level fault injection in place (testing): non-finite values or an absurd scale."""
    if kind == "nan":
        delta[0].fill_(float("nan"))
    elif kind == "inf":
        delta[0].fill_(float("inf"))
    elif kind == "norm":
        torch._foreach_mul_(delta, 1e6)
