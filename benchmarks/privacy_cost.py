"""What user-level DP costs a synchronous round on the batched path, measured side by side in one process.

One leaf's round (``LeafRoundRunner``, batched devices, no NVFlare) and the server's aggregation of its sum,
alternately without DP (:class:`~devsim.aggregation.FedAvg`) and with central DP (each device's update clipped where
it is computed; :class:`~devsim.privacy.server.PrivateAggregator` adds seeded Gaussian noise to the sum, divides by
the fixed denominator and steps the accountant), the same devices from the same model; the first round of each is a
warm-up. Printed: each setting's median round (ms) and their ratio (target: DP <= 1.10x). ``--asynchronous``: the
same for a DP-FedBuff version (B = ``--devices`` jobs in one ``run_jobs`` call, each delta clipped, with ``--noise-at
leaves`` also noised with its share, then one buffer applied with its noise and the accountant's step).

    .venv/bin/python benchmarks/privacy_cost.py --rounds 12 --json   # benchmarks/results/privacy_cost-rdp-<date>.json
    .venv/bin/python benchmarks/privacy_cost.py --asynchronous --json     # privacy_cost-async-server-<date>.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.harness import Session, arguments  # noqa: E402
from devsim.aggregation import FedAvg, LeafUpdate  # noqa: E402
from devsim.aggregation.fedbuff import FedBuff  # noqa: E402
from devsim.codec import model_to_numpy  # noqa: E402
from devsim.config import AsyncConfig, SimulationConfig  # noqa: E402
from devsim.models import build_model  # noqa: E402
from devsim.privacy.buffered import BufferedPrivacy  # noqa: E402
from devsim.privacy.device import DevicePrivacy  # noqa: E402
from devsim.privacy.plan import PrivacyPlan  # noqa: E402
from devsim.privacy.server import LeafSum, PrivateAggregator  # noqa: E402
from devsim.training.leaf_runner import LeafRoundRunner  # noqa: E402
from processors.task_processor import TaskDeviceProcessor  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = arguments(__doc__)
    parser.add_argument("--devices", type=int, default=20, help="devices trained per round")
    parser.add_argument("--device-batch", type=int, default=10, help="devices per batched computation")
    parser.add_argument("--rounds", type=int, default=12, help="rounds per setting (the first is a warm-up)")
    parser.add_argument("--accountant", choices=("rdp", "pld"), default="rdp")
    parser.add_argument("--asynchronous", action="store_true", help="a DP-FedBuff version instead (RDP only)")
    parser.add_argument("--noise-at", choices=("server", "leaves"), default="server", help="with --asynchronous")
    args = parser.parse_args(argv)
    session = Session("privacy_cost")
    settings = dict(dataset="digits", samples_per_device=50, partition="iid", batch_size=10, seed=0)
    runner = LeafRoundRunner([TaskDeviceProcessor.from_settings(settings)], device_batch=args.device_batch)
    if args.asynchronous:
        return _asynchronous(args, runner, session)
    config = SimulationConfig(
        dp="central", dp_noise_multiplier=1.0, dp_clip=1.0, dp_accountant=args.accountant, devices_per_leaf=500
    )
    aggregator = PrivateAggregator(PrivacyPlan.from_settings(config), seed=0, num_leaves=1)
    fedavg = FedAvg()
    weights = model_to_numpy(build_model("cnn"))
    devices = list(range(args.devices))
    times: dict[str, list[float]] = {"plain": [], "dp": []}
    try:
        for round_num in range(args.rounds):
            for name in ("plain", "dp") if round_num % 2 == 0 else ("dp", "plain"):
                started = time.perf_counter()
                if name == "plain":
                    result = runner.run_round(round_num, weights, devices)
                    update = LeafUpdate("leaf", result.delta_sum, result.total_weight, len(devices))
                    fedavg.aggregate(weights, [update])
                else:
                    result = runner.run_round(round_num, weights, devices, privacy=aggregator.device_privacy())
                    leaf = LeafSum(result.delta_sum, len(devices), result.counts.get("dp_below_clip", 0))
                    aggregator.aggregate(round_num, weights, [leaf])
                if round_num:
                    times[name].append(time.perf_counter() - started)
    finally:
        runner.close()
    _report(
        args,
        session,
        times,
        f"round without DP {{plain}}, with DP ({args.accountant}) {{private}}",
        f"DP round / plain round, batched path ({args.accountant})",
        f"privacy_cost-{args.accountant}",
    )
    return 0


def _asynchronous(args: argparse.Namespace, runner: LeafRoundRunner, session: Session) -> int:
    """A DP-FedBuff version (B jobs trained in one leaf call, one buffer applied) against a plain FedBuff one."""
    config = AsyncConfig(
        dp="central",
        dp_noise_multiplier=1.0,
        dp_clip=1.0,
        dp_noise_at=args.noise_at,
        buffer_size=args.devices,
        devices_per_leaf=500,
    ).validate()
    privacy = BufferedPrivacy(PrivacyPlan.from_settings(config), seed=0)
    job = privacy.job_privacy()
    device = DevicePrivacy(job["clip"], job["noise_std"], 0)
    weights = model_to_numpy(build_model("cnn"))
    shapes = {name: value.shape for name, value in weights.items()}
    devices = list(range(args.devices))
    times: dict[str, list[float]] = {"plain": [], "dp": []}
    try:
        for version in range(1, args.rounds + 1):
            for name in ("plain", "dp") if version % 2 else ("dp", "plain"):
                seeds = [1000 * version + d for d in devices]
                started = time.perf_counter()
                payload = runner.run_jobs(weights, devices, devices, seeds, privacy=device if name == "dp" else None)
                buffer = FedBuff(len(devices), 1.0)
                for row in range(len(devices)):
                    buffer.add({k: v[row] for k, v in payload["deltas"].items()}, 0)
                if name == "plain":
                    buffer.apply(weights)
                else:
                    buffer.apply(weights, privacy.noise(version, shapes))
                    privacy.applied()
                if version > 1:
                    times[name].append(time.perf_counter() - started)
    finally:
        runner.close()
    _report(
        args,
        session,
        times,
        f"version of {args.devices} jobs without DP {{plain}}, DP-FedBuff (noise at the {args.noise_at}) {{private}}",
        f"DP-FedBuff version / plain FedBuff version, batched path (noise at the {args.noise_at})",
        f"privacy_cost-async-{args.noise_at}",
    )
    return 0


def _report(
    args: argparse.Namespace, session: Session, times: dict[str, list[float]], line: str, name: str, benchmark: str
) -> None:
    """Print the medians and their ratio (``line`` with ``{plain}`` and ``{private}`` for the two medians in ms) and,
    with ``--json``, write the figure ``name`` to ``benchmarks/results/<benchmark>-<date>.json``."""
    plain, private = statistics.median(times["plain"]), statistics.median(times["dp"])
    ratio = private / plain
    print(f"machine: {session.where()}")
    print(f"{line.format(plain=f'{plain * 1000:.1f} ms', private=f'{private * 1000:.1f} ms')}: {ratio:.3f}x")
    if args.json:
        shown = session.figure(name, f"{ratio:.3f}x", "<= 1.10x")
        session.benchmark = benchmark
        session.write({"settings": vars(args), "seconds": times, "ratio": ratio}, [shown])


if __name__ == "__main__":
    sys.exit(main())
