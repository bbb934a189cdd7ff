"""Batched device training (``--device-batch``) against the leaf's thread pool, in one process.

One leaf's synchronous round (``LeafRoundRunner``, no NVFlare) trains the same devices from the same global model
once per setting: the thread pool (one device at a time per worker) and each ``--batches`` value (that many devices
as one vmapped computation), at 1 worker and every core's worth. Throughput: device-samples/s, median of rounds 2..
of ``--rounds``. Printed: throughput, speed-up against the thread pool, and the largest difference of the leaf
delta sum from the pool's, relative to its largest entry (float rounding only). ``auto`` resolves as a leaf does
(``plan_device_batch``) and says why. ``--json`` writes the rows and the figure (``auto``'s speed-up at its faster
worker count) to ``benchmarks/results/batched_devices-<date>.json``:

    .venv/bin/python benchmarks/batched_devices.py --json
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from benchmarks.harness import Session, arguments, print_table  # noqa: E402
from devsim.codec import model_to_numpy  # noqa: E402
from devsim.config import MODELS, OPTIMIZERS  # noqa: E402
from devsim.models import build_model  # noqa: E402
from devsim.resources.device_batch import plan_device_batch  # noqa: E402
from devsim.training.leaf_runner import LeafRoundRunner  # noqa: E402
from processors.task_processor import TaskDeviceProcessor  # noqa: E402


def settings_of(args) -> dict:
    """The processor settings of the measured leaf."""
    return {
        "dataset": "synthetic",
        "synthetic_train_size": max(4000, args.devices * args.samples),
        "synthetic_test_size": 100,
        "model": args.model,
        "optimizer": args.optimizer,
        "lr": args.lr,
        "partition": "iid",
        "samples_per_device": args.samples,
        "batch_size": args.batch_size,
        "local_epochs": args.epochs,
        "seed": 0,
    }


def resolve(args, value: str, workers: int) -> tuple[int, str]:
    """``--batches`` entry -> (device_batch, note): ``auto`` as a leaf resolves it, a number as is."""
    if value != "auto":
        return int(value), ""
    worker = TaskDeviceProcessor.from_settings(settings_of(args), compute_device=args.compute_device)
    plan = plan_device_batch(
        "auto",
        obstacle=worker.batching_obstacle(),
        device_bytes=worker.batched_device_bytes(),
        device=args.compute_device,
        num_workers=workers,
        num_params=worker.num_params,
    )
    return plan.size, plan.reason


def leaf_rate(
    settings: dict, device: str, devices: int, workers: int, device_batch: int, rounds: int, fill_groups: bool = False
) -> tuple[float, dict]:
    """Median device-samples/s of one leaf (``workers`` processors of ``settings`` on ``device``, ``device_batch``
    devices a computation) training devices 0..``devices``-1 from the same global model, over rounds 2.. (the first
    warms up; one round: that one), and the last round's leaf delta sum (name -> array). Every round is round 0, so
    every setting trains the same batches. On the CPU torch gets usable cores / workers threads."""
    if device == "cpu":
        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // workers))
    torch.manual_seed(0)
    weights = model_to_numpy(build_model(settings["model"]))
    processors = [TaskDeviceProcessor.from_settings(settings, compute_device=device) for _ in range(workers)]
    runner = LeafRoundRunner(processors, device_batch=device_batch, fill_groups=fill_groups)
    samples = devices * settings["samples_per_device"] * settings["local_epochs"]
    rates, result = [], None
    try:
        for round_num in range(rounds):
            started = time.perf_counter()
            result = runner.run_round(0, weights, list(range(devices)))
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            if round_num or rounds == 1:
                rates.append(samples / (time.perf_counter() - started))
    finally:
        runner.close()
    return statistics.median(rates), result.delta_sum


def measure(args, device_batch: int, workers: int) -> tuple[float, dict]:
    """``leaf_rate`` of this invocation's leaf."""
    return leaf_rate(settings_of(args), args.compute_device, args.devices, workers, device_batch, args.rounds)


def main(argv: list[str] | None = None) -> int:
    p = arguments(__doc__)
    p.add_argument("--model", default="cnn", choices=MODELS)
    p.add_argument("--optimizer", default="sgd", choices=OPTIMIZERS)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--devices", type=int, default=64, help="devices trained per round by the leaf")
    p.add_argument("--samples", type=int, default=100, help="samples per device")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=10)
    p.add_argument("--workers", type=int, default=None, help="thread-pool workers (default: usable cores)")
    p.add_argument("--batches", default="auto,4,16,64", help="comma-separated --device-batch values (numbers or auto)")
    p.add_argument("--rounds", type=int, default=4, help="rounds per setting (the first is a warm-up)")
    p.add_argument("--compute-device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args(argv)
    session = Session("batched_devices")
    batches = [b.strip() for b in args.batches.split(",") if b.strip()]
    workers = args.workers or len(os.sched_getaffinity(0))
    print(
        f"{args.devices} devices x {args.samples} samples x {args.epochs} epoch(s), batch {args.batch_size}, "
        f"model {args.model}, {args.optimizer}, {args.compute_device}; "
        "torch threads per worker = usable cores / workers; "
        f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    base_rate, base_sum = measure(args, 1, workers)
    scale = max(float(np.abs(v).max()) for v in base_sum.values())
    table = [[f"thread pool, {workers} workers", f"{base_rate:.0f}", "1.00", "0", ""]]
    rows: list[dict[str, Any]] = [{"setting": "thread pool", "workers": workers, "samples_per_s": base_rate}]
    for value in batches:
        for pool in sorted({1, workers}):
            batch, note = resolve(args, value, pool)
            rate, delta_sum = measure(args, batch, pool)
            diff = max(float(np.abs(delta_sum[k] - base_sum[k]).max()) for k in base_sum) / scale
            label = f"device_batch {value}{f'={batch}' if value == 'auto' else ''}, {pool} worker(s)"
            table.append([label, f"{rate:.0f}", f"{rate / base_rate:.2f}", f"{diff:.2e}", note])
            rows.append(
                {"setting": value, "device_batch": batch, "workers": pool, "samples_per_s": rate}
                | {"speedup": rate / base_rate, "max_rel_diff": diff, "note": note}
            )
    print_table(["setting", "samples/s", "speed-up", "max rel diff vs pool", "auto's choice"], table)
    print(f"load average at end {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.json:
        payload = {"settings": vars(args), "rows": rows}
        session.write(payload, figures(args, rows, session))
    return 0


def figures(args, rows: list[dict[str, Any]], session: Session) -> list[dict[str, str]]:
    """``auto``'s speed-up over the thread pool, at the worker count where it is fastest."""
    auto = [row for row in rows if row["setting"] == "auto"]
    if not auto:
        return []
    best = max(auto, key=lambda row: row["speedup"])
    model = args.model.upper() if args.model == "cnn" else args.model
    return [
        session.figure(
            f"batched devices vs thread pool, one leaf, {args.devices} {model} devices",
            f"{best['speedup']:.2f}x ({best['workers']} worker{'s' if best['workers'] > 1 else ''})",
            "> 1",
        )
    ]


if __name__ == "__main__":
    sys.exit(main())
