"""A batched group's admission (``admit_rows``) gives exactly what admitting its devices one by one gives: the same
sum, counts and rejections, the norm limit included (no NVFlare)."""

from __future__ import annotations

import torch

from devsim.compression import CodecSpec, UplinkCompressor
from devsim.training.admission import ChunkResult, RoundChecks, admit, admit_rows
from devsim.training.local import DeviceMetrics


def _empty(shapes) -> ChunkResult:
    return ChunkResult([torch.zeros(s) for s in shapes], [], {"dropped": 0, "silent": 0, "rejected": 0}, [])


def test_rows_are_admitted_exactly_as_one_by_one_with_the_norm_limit():
    generator = torch.Generator().manual_seed(3)
    shapes = [(4, 3), (5,)]
    devices = 6
    deltas = [torch.randn(devices, *s, generator=generator) for s in shapes]
    deltas[0][2] *= 50  # device 2 is over the limit
    deltas[1][4, 0] = float("nan")  # device 4 is not finite
    metrics = [DeviceMetrics(d, 10 + d, 3, 0.5, 0.5, 0.0) for d in range(devices)]
    outcomes = ["ok"] * devices
    outcomes[1] = "dropped"
    limit = float(torch.linalg.vector_norm(torch.cat([t[0].reshape(-1) for t in deltas]))) * 3
    checks = RoundChecks(None, None, limit, UplinkCompressor(CodecSpec("none")))
    batched, single = _empty(shapes), _empty(shapes)
    admit_rows(batched, [t.clone() for t in deltas], metrics, outcomes, 7, checks)
    for d in range(devices):
        admit(single, [t[d].clone() for t in deltas], metrics[d], outcomes[d], 7, checks)
    assert all(torch.equal(a, b) for a, b in zip(batched.accumulator, single.accumulator, strict=True))
    assert batched.counts == single.counts == {"dropped": 1, "silent": 0, "rejected": 2}
    assert batched.rejections == single.rejections and len(batched.rejections) == 2
    assert [m.device_id for m in batched.metrics] == [m.device_id for m in single.metrics] == [0, 3, 5]
