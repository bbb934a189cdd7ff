"""What pinning glibc's mmap threshold costs a server's own work, pinned at 128 KiB against glibc's dynamic threshold.

Pinned (``mallopt(M_MMAP_THRESHOLD)``, what the servers did until 2026-11-26), every array of 128 KiB or more is a
fresh ``mmap`` that the kernel faults in and zeroes; with the dynamic threshold (up to 32 MiB) such arrays are
reused from the heap. Each arm runs every workload in a fresh process (one torch thread, the 62k-parameter CNN),
the arms in turn: ``fedbuff arrival`` (decoded copy, update check, buffer, a new version every second arrival; ms
per arrival), ``evaluation`` (2,000 inputs of 3x32x32 in batches of 500; ms per pass), ``fedrevive synthesis`` and
``fedrevive kd`` (the job's ``fedrevive_small_cpu`` defaults, driven as ``benchmarks/fedrevive_profile.py`` does; ms
per call). ``--json`` writes the runs and one figure per workload (pinned / dynamic) to
``benchmarks/results/server_allocator-<date>.json``:

    .venv/bin/python benchmarks/server_allocator.py --json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.harness import Session, alternate, arguments, run_child  # noqa: E402

PINNED_BYTES = 128 * 1024
WORKLOADS = ("fedbuff arrival", "evaluation", "fedrevive synthesis", "fedrevive kd")


def pin_threshold() -> None:
    """Fix glibc's mmap threshold at 128 KiB for this process (``M_MMAP_THRESHOLD`` is -3)."""
    import ctypes

    if ctypes.CDLL(None).mallopt(-3, PINNED_BYTES) != 1:
        raise RuntimeError("mallopt(M_MMAP_THRESHOLD) failed: not glibc?")


def per_call_ms(work, calls: int) -> float:
    """Milliseconds per call of ``work()`` over ``calls`` calls, after 3 warm-up calls."""
    for _ in range(3):
        work()
    started = time.perf_counter()
    for _ in range(calls):
        work()
    return 1000.0 * (time.perf_counter() - started) / calls


def fedbuff_arrival() -> float:
    import numpy as np

    from devsim.aggregation.fedbuff import FedBuff
    from devsim.aggregation.update_checks import UpdateValidator
    from devsim.codec import model_to_numpy
    from devsim.models import build_model

    weights = model_to_numpy(build_model("cnn"))
    rng = np.random.default_rng(0)
    deltas = [{k: rng.standard_normal(v.shape).astype(np.float32) * 1e-3 for k, v in weights.items()} for _ in range(4)]
    buffer, validator = FedBuff(2, 1.0), UpdateValidator(weights, max_norm=None)
    state = {"weights": weights, "arrival": 0}

    def arrive() -> None:
        delta = {k: v.copy() for k, v in deltas[state["arrival"] % 4].items()}
        state["arrival"] += 1
        validator.check_job_result(delta, 100, "device")
        buffer.add(delta, 1)
        if buffer.ready():
            state["weights"] = buffer.apply(state["weights"])
            state["snapshot"] = {k: v.copy() for k, v in state["weights"].items()}

    return per_call_ms(arrive, 2000)


def evaluation() -> float:
    import torch

    from devsim.models import build_model
    from devsim.training.evaluation import Evaluator

    inputs = torch.rand(2000, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    evaluator = Evaluator(inputs, torch.randint(0, 10, (2000,)), torch.device("cpu"), batch_size=500)
    model = build_model("cnn")
    return per_call_ms(lambda: evaluator.evaluate(model), 20)


def fedrevive() -> tuple[float, float]:
    """Milliseconds per synthesis and per distillation at ``fedrevive_small_cpu``'s DFKD settings (the job's
    defaults), both on every arrival, read from the reviver's own counters over 20 arrivals after the gates."""
    from benchmarks.fedrevive_profile import drive, load_preset, make_reviver

    preset = load_preset()
    reviver = make_reviver(preset, "synthesis", kd_interval=1, generation_interval=1)
    start = preset["warmup_version"] + 5
    drive(reviver, range(start), 0)
    before = reviver.state.synth_seconds, reviver.state.synth_steps, reviver.state.kd_seconds, reviver.state.kd_runs
    drive(reviver, range(start, start + 20), 1)
    state = reviver.state
    synthesis = (state.synth_seconds - before[0]) / (state.synth_steps - before[1])
    kd = (state.kd_seconds - before[2]) / (state.kd_runs - before[3])
    return 1000.0 * synthesis, 1000.0 * kd


def child(pinned: bool) -> None:
    """Run every workload in this process and print their ms per call as JSON."""
    if pinned:
        pin_threshold()
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    synthesis, kd = fedrevive()
    times = dict(zip(WORKLOADS, (fedbuff_arrival(), evaluation(), synthesis, kd), strict=True))
    print(json.dumps(times))


def arm_run(pinned: bool) -> dict[str, float]:
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_MMAP_THRESHOLD_"}
    return run_child(os.path.abspath(__file__), ["--child", "pinned" if pinned else "dynamic"], timeout=600, env=env)


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--alternations", type=int, default=2, help="pinned / dynamic pairs, run in turn")
    parser.add_argument("--child", choices=("pinned", "dynamic"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child == "pinned")
        return
    session = Session("server_allocator")
    runs = alternate({"pinned": lambda: arm_run(True), "dynamic": lambda: arm_run(False)}, args.alternations)
    print(f"{session.where()}; ms per call, {args.alternations} alternations (pinned 128 KiB / dynamic)")
    ratios = {}
    for name in WORKLOADS:
        pinned = [r[name] for r in runs["pinned"]]
        dynamic = [r[name] for r in runs["dynamic"]]
        ratios[name] = sum(pinned) / sum(dynamic)
        shown = " ".join(f"{p:.2f}/{d:.2f}" for p, d in zip(pinned, dynamic, strict=True))
        print(f"  {name:<20} {shown}   pinned / dynamic {ratios[name]:.2f}x")
    if args.json:
        published = [
            session.figure(
                f"{name}: time with the threshold pinned / dynamic",
                f"{ratio:.2f}x",
                "servers unpinned",
            )
            for name, ratio in ratios.items()
        ]
        session.write({"runs": runs, "ratios": ratios}, published)


if __name__ == "__main__":
    main()
