"""Memory and selection time of a heterogeneous, intermittently available population of a million devices.

Each setting runs in a fresh child process so that its peak RSS is its own: ``always`` (``DevicePopulation``,
always online: selection only), ``diurnal`` (a ``PopulationModel`` with seeded diurnal sessions and lognormal
speeds) and ``trace`` (the same written once to an NPZ trace and loaded from it). For each: build seconds, RSS and
peak RSS (MB), bytes in per-device arrays, and median wall / CPU milliseconds over ``--repeats`` times spread over
a day of ``online``, one selection of ``--select`` online devices, the async ``select_online`` excluding ``--busy``
devices, and a whole ``plan_round``. ``--json`` writes the rows and the figure (one selection, diurnal / trace) to
``benchmarks/results/population_scale-<date>.json``:

    .venv/bin/python benchmarks/population_scale.py --json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.harness import Session, arguments, print_table, run_child  # noqa: E402


def rss_mb() -> float:
    with open("/proc/self/statm", encoding="ascii") as stream:
        return int(stream.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 1e6


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3


def median_ms(fn, times: list[float]) -> tuple[float, float]:
    """Median wall and CPU (this process) milliseconds of ``fn(t)`` over ``times``."""
    wall, cpu = [], []
    for t in times:
        started, started_cpu = time.perf_counter(), time.process_time()
        fn(t)
        wall.append((time.perf_counter() - started) * 1e3)
        cpu.append((time.process_time() - started_cpu) * 1e3)
    return statistics.median(wall), statistics.median(cpu)


def child(mode: str, devices: int, select: int, busy: int, repeats: int, trace_path: str) -> dict:
    """Build one setting and time it; returns the figures (run in a fresh process)."""
    from devsim.clock import load_schedule
    from devsim.population.availability import diurnal_availability
    from devsim.population.devices import DevicePopulation
    from devsim.population.heterogeneity import PopulationModel
    from devsim.population.traces import DeviceTrace, load_trace, save_trace_npz
    from devsim.seeding import derive_rng

    base_rss = rss_mb()
    schedule = load_schedule("paper_default")
    times = [float(t) for t in np.linspace(0, 86400, repeats, endpoint=False)]
    started = time.perf_counter()
    if mode == "always":
        population = DevicePopulation(1, devices, seed=0)
        population.select(0, select)
        built = time.perf_counter() - started
        select_ms = median_ms(lambda t: population.select(int(t), select), times)
        memory = dict(rss_mb=rss_mb(), base_rss_mb=base_rss, peak_mb=peak_mb())
        return dict(mode=mode, build_s=built, **memory, select_ms=select_ms)
    if mode in ("diurnal", "write"):
        availability = diurnal_availability(devices, seed=0)
        speed = derive_rng(0, "speed").lognormal(0.0, 0.5, size=devices).astype(np.float32)
        if mode == "write":
            save_trace_npz(trace_path, DeviceTrace(availability, speed, None))
            return {"mode": mode, "intervals": int(availability.starts.size), "bytes": os.path.getsize(trace_path)}
    else:
        trace = load_trace(trace_path)
        availability, speed = trace.availability, trace.speed
        del trace
    model = PopulationModel(devices, schedule, 0, availability, speed=speed, samples_per_second=10.0)
    del availability, speed
    built = time.perf_counter() - started
    model.online(0.0)
    built_with_index = time.perf_counter() - started
    rng = derive_rng(0, "bench")
    exclude = np.sort(rng.choice(devices, size=busy, replace=False)).astype(np.int64)
    out = {
        "online_ms": median_ms(model.online, times),
        "online_fraction": statistics.mean(model.online(t).size / devices for t in times),
        "select_ms": median_ms(lambda t: model.select_online(derive_rng(0, "s", int(t)), t, select), times),
        "select_busy_ms": median_ms(lambda t: model.select_online(rng, t, select, exclude=exclude), times),
        "plan_round_ms": median_ms(lambda t: model.plan_round(int(t), t, select, work=100.0), times),
    }
    sizes = dict(intervals=int(model.availability.starts.size), array_mb=model.nbytes / 1e6)
    memory = dict(rss_mb=rss_mb(), base_rss_mb=base_rss, peak_mb=peak_mb())
    return dict(mode=mode, build_s=built, index_s=built_with_index - built, **sizes, **memory, **out)


def child_run(args: argparse.Namespace, mode: str, trace_path: str) -> dict:
    flags = [
        item for flag in ("devices", "select", "busy", "repeats") for item in (f"--{flag}", str(getattr(args, flag)))
    ]
    return run_child(os.path.abspath(__file__), ["--child", mode, "--trace-path", trace_path, *flags])


def main() -> int:
    parser = arguments(__doc__)
    parser.add_argument("--devices", type=int, default=1_000_000, help="population size")
    parser.add_argument("--select", type=int, default=100, help="devices per selection")
    parser.add_argument("--busy", type=int, default=100, help="in-flight devices excluded in the async selection")
    parser.add_argument("--repeats", type=int, default=24, help="selection times, spread over one day")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--trace-path", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.devices, args.select, args.busy, args.repeats, args.trace_path)))
        return 0
    print(f"load average before: {os.getloadavg()}")
    session = Session("population_scale")
    with tempfile.TemporaryDirectory() as tmp:
        trace_path = os.path.join(tmp, "trace.npz")
        written = child_run(args, "write", trace_path)
        rows = [child_run(args, mode, trace_path) for mode in ("always", "diurnal", "trace")]
    print(f"load average after:  {os.getloadavg()}")
    print(
        f"{args.devices:,} devices; NPZ trace {written['intervals']:,} sessions, {written['bytes'] / 1e6:.1f} MB; "
        f"select {args.select} (async: {args.busy} busy excluded); median of {args.repeats} times over a day"
    )
    always = rows[0]["select_ms"]
    table = []
    for row in rows:
        seconds = [f"{row.get(k, 0):.2f}" for k in ("build_s", "index_s")]
        megabytes = [f"{row.get(k, 0):.1f}" for k in ("array_mb", "rss_mb", "peak_mb")]
        table.append([row["mode"], *seconds, *megabytes, f"{100 * row.get('online_fraction', 1):.1f}"])
    print_table(["setting", "build s", "index s", "arrays MB", "RSS MB", "peak MB", "online %"], table)
    print("median ms per call, wall / CPU of the child process:")
    table = []
    for row in rows:
        cells = [row.get(k) for k in ("online_ms", "select_ms", "select_busy_ms", "plan_round_ms")]
        text = [f"{c[0]:.2f} / {c[1]:.2f}" if c else "-" for c in cells]
        table.append([row["mode"], *text[:2], f"{row['select_ms'][0] / always[0]:.1f}", *text[2:]])
    print_table(["setting", "online", "select", "x always", "async select", "plan_round"], table)
    print(f"(RSS of an empty child with numpy imported: {rows[0]['base_rss_mb']:.1f} MB)")
    if args.json:
        settings = {flag: getattr(args, flag) for flag in ("devices", "select", "busy", "repeats")}
        payload = {"settings": settings, "trace": written, "rows": rows}
        session.write(payload, figures(args, rows, session))
    return 0


def figures(args: argparse.Namespace, rows: list[dict], session: Session) -> list[dict]:
    """One selection's median wall time, diurnal and trace."""
    select = {row["mode"]: row["select_ms"][0] for row in rows}
    return [
        session.figure(
            f"{args.devices:,}-device population: one selection of {args.select} online devices (diurnal / trace)",
            f"{select['diurnal']:.1f} / {select['trace']:.1f} ms",
            "fast at 1M",
        )
    ]


if __name__ == "__main__":
    sys.exit(main())
