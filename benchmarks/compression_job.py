"""Uplink codecs inside the FedAvg job itself: what compression costs a user's round (digits, NVFlare's simulator).

``benchmarks/compression.py`` compares the codecs in one process over the project's core, against the
leaf's compute alone. This script runs ``jobs/pt_job_fedavg.py --dataset digits`` through its own
command line (NVFlare's in-process simulator, the job's defaults: 2 leaves x 50 devices, 20 a round,
100 samples a device, 20 rounds) once per codec and seed, and reads each run's results.json:

- uplink bytes (device -> leaf) over the run and the ratio to ``none``;
- final test accuracy and the mean of the last 5 evaluated rounds' (one round's accuracy moves by up to ~2
  points with the devices it selected), each against ``none`` of the same seed, in points;
- the codec's cost against the round's wall time, two ways: ``codec_seconds`` (summed over both leaves,
  as if they ran one after the other; an upper bound) and ``critical_leaf_codec_seconds`` (the slowest
  leaf's, which is what the codec adds to a round whose leaves run side by side);
- the mean round wall time and its ratio to ``none`` (rounds 3 onwards: the first two pay start-up). One
  job's mean round moves by about 10% from run to run here, so this ratio needs several seeds to say
  more than that; an untimed 3-round job runs first, because the invocation's first job was 10-40%
  slower whatever its codec (2026-11-24).

    .venv/bin/python benchmarks/compression_job.py                            # seeds 0, 1, 2
    .venv/bin/python benchmarks/compression_job.py --seeds 0 --codecs "none,topk 10%"
    .venv/bin/python benchmarks/compression_job.py --quick                    # 3 rounds: checks the script
    .venv/bin/python benchmarks/compression_job.py --seeds 0,1,2,3,4 --rounds 100 --codecs "none,int8,topk 1%" \
        --horizons 20,30,60,100    # accuracy against none after 20, 30, 60 and 100 rounds, over 5 seeds

    .venv/bin/python benchmarks/compression_job.py --seeds 0,1,2,3,4 --rounds 100 --horizons 20,30,60,100 \
        --codecs "none,topk 1%,topk 1% momentum 0.3,topk 1% warmup 4" --json    # issue 33's mechanisms

Timings are measured in the same invocation, one job at a time; the load average is printed.

``--json`` writes the table, the summary and the published figures through ``benchmarks/figures.py`` to
``benchmarks/results/compression_job-<date>.json``: per codec other than ``none``, its points against float32
after 30 rounds (or the last horizon), mean / worst over the seeds, named with the bytes ratio over those rounds
(e.g. "top-k 1% uplink (66.6x fewer bytes) vs float32, digits in the job, 5 seeds, 30 rounds"), and with top-k
10% and int8 among the codecs the critical leaf's codec share. ``--json PATH`` writes the same to PATH. A sweep
too long for one sitting runs a few seeds (or codecs, each run with ``none``) at a time, each with ``--json PATH``,
and ``--merge A,B,... --horizons ... --json`` then summarises and publishes them together (the figures' command
lists every run; a codec's run of a seed found in two reports must have the same accuracies).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import tempfile
import time
from types import ModuleType

import numpy as np

BENCHMARKS = os.path.dirname(os.path.abspath(__file__))


def _sibling(file_name: str, module_name: str) -> ModuleType:
    """Another benchmark script as a module, under a name no installed package uses (Python 3.14's standard
    library has a ``compression`` package, which ``benchmarks/`` on ``sys.path`` would shadow)."""
    spec = importlib.util.spec_from_file_location(module_name, os.path.join(BENCHMARKS, file_name))
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


_compression = _sibling("compression.py", "devsim_benchmark_compression")
codec_from_name, int_list, last_mean = _compression.codec_from_name, _compression.int_list, _compression.last_mean
summarise, print_summary = _compression.summarise, _compression.print_summary
run_job = _sibling("fidelity.py", "devsim_benchmark_fidelity").run_job

DEFAULT_CODECS = "none,fp16,int8,topk 10%,topk 1%"
WARM_ROUNDS = 2  # rounds left out of the timing figures (start-up: first calls, page faults, caches)


def codec_flags(name: str) -> list[str]:
    """The job flags for a ``--codecs`` item (the forms ``benchmarks/compression.py`` takes)."""
    spec = codec_from_name(name)
    flags = ["--update-codec", spec.name]
    if spec.name == "int8" and spec.int8_block:
        flags += ["--int8-block", str(spec.int8_block)]
    if spec.name == "topk":
        flags += ["--topk-fraction", repr(spec.topk_fraction), "--topk-values", spec.topk_values]
        if spec.topk_warmup_rounds:
            flags += ["--topk-warmup-rounds", str(spec.topk_warmup_rounds)]
        if spec.topk_momentum:
            flags += ["--topk-momentum", repr(spec.topk_momentum)]
    return flags


def job_figures(results: dict) -> dict:
    """Bytes, accuracies (each evaluated round's, the final one, the last 5's mean) and codec / round seconds (rounds
    after the warm ones) of one job's results.json."""
    rounds = results["rounds"]
    accuracies = [r["accuracy"] for r in rounds if "accuracy" in r]
    by_round = [int(r["bytes"]["device_to_leaf"]) for r in rounds if "device_to_leaf" in r.get("bytes", {})]
    timed = [r["timing"] for r in rounds[WARM_ROUNDS:] if "timing" in r] or [r["timing"] for r in rounds]
    wall = sum(t["wall"] for t in timed)
    return {
        "uplink_bytes": int(results["summary"]["bytes_total"]["device_to_leaf"]),
        "uplink_bytes_by_round": by_round if len(by_round) == len(rounds) else None,
        "final_accuracy": float(results["summary"]["final_accuracy"]),
        "last5_accuracy": last_mean(accuracies),
        "accuracies": accuracies,
        "round_wall_mean": wall / len(timed),
        "codec_share_sum": sum(t["info"].get("codec_seconds", 0.0) for t in timed) / wall,
        "codec_share_critical": sum(t["info"].get("critical_leaf_codec_seconds", 0.0) for t in timed) / wall,
        "job_wall": float(results["wall"]),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    codecs_help = f"comma list (default {DEFAULT_CODECS})".replace("%", "%%")
    parser.add_argument("--codecs", default=DEFAULT_CODECS, help=codecs_help)
    parser.add_argument("--seeds", default="0,1,2", help="comma list of job --seed values")
    parser.add_argument("--rounds", type=int, default=20, help="job --num-rounds")
    parser.add_argument(
        "--horizons",
        default=None,
        help="comma list of round counts (each <= --rounds) at which a summary compares accuracy with none",
    )
    parser.add_argument("--quick", action="store_true", help="3 rounds, one seed: checks the script")
    parser.add_argument(
        "--json",
        nargs="?",
        const="",
        default=None,
        help="also write the figures: to benchmarks/results/compression_job-<date>.json (benchmarks/figures.py) "
        "without a path, to the path given otherwise",
    )
    parser.add_argument(
        "--merge",
        default=None,
        help="comma list of reports written by earlier --json PATH runs (same --rounds; other seeds, or other codecs "
        "with none): summarise them together instead of running jobs (a long sweep split into several runs)",
    )
    args = parser.parse_args(argv)
    if args.merge is not None:
        return merge_reports(parser, args)
    names = [n.strip() for n in args.codecs.split(",") if n.strip()]
    if "none" not in names:
        parser.error("--codecs: the comparison needs none among the codecs")
    flags = {}
    for name in names:
        try:
            flags[name] = codec_flags(name)
        except ValueError as error:
            parser.error(f"--codecs: {name!r} is not allowed ({error})")
    seeds = int_list(parser, "--seeds", args.seeds)
    rounds = 3 if args.quick else args.rounds
    seeds = seeds[:1] if args.quick else seeds
    if rounds <= WARM_ROUNDS:
        parser.error(f"--rounds must be more than {WARM_ROUNDS} (the warm rounds left out of the timing)")
    horizons = int_list(parser, "--horizons", args.horizons) if args.horizons is not None else []
    bad = [h for h in horizons if not 1 <= h <= rounds]
    if bad:
        parser.error(f"--horizons: {bad[0]} is not between 1 and the rounds run ({rounds})")
    load_before = os.getloadavg()
    figures: dict[str, dict[int, dict]] = {name: {} for name in names}
    with tempfile.TemporaryDirectory(prefix="compression_job_") as workdir:
        if not args.quick:  # the invocation's first job ran its rounds 10-40% slower (cold files and libraries)
            run_job("pt_job_fedavg.py", ["--num-rounds", str(WARM_ROUNDS + 1)], workdir, "warm_up_not_counted")
        for seed in seeds:
            for name in names:
                job_flags = [*flags[name], "--seed", str(seed), "--num-rounds", str(rounds)]
                tag = f"{name.replace(' ', '_').replace('%', 'pct')}_seed{seed}"
                figures[name][seed] = job_figures(run_job("pt_job_fedavg.py", job_flags, workdir, tag))
    load_after = os.getloadavg()
    report_runs(args, figures, names, seeds, rounds, horizons, [load_before[0], load_after[0]], [])
    return 0


def merge_reports(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """``--merge``: the seeds of earlier ``--json PATH`` reports summarised together, as one run over all of them."""
    paths = [p.strip() for p in args.merge.split(",") if p.strip()]
    reports = []
    for path in paths:
        try:
            with open(path, encoding="utf-8") as stream:
                reports.append(json.load(stream))
        except (OSError, ValueError) as error:
            parser.error(f"--merge: cannot read {path!r} ({error})")
    rounds = reports[0]["rounds"]
    figures: dict[str, dict[int, dict]] = {}
    bases: dict[str, dict[int, dict]] = {}  # each codec's run of a seed against none of the same report
    for path, report in zip(paths, reports, strict=True):
        if report["rounds"] != rounds or "none" not in report["codecs"]:
            parser.error(
                f"--merge: {path!r} ran other rounds than {paths[0]!r} or no none; allowed: the same, with none"
            )
        for name, row in report["codecs"].items():
            for seed, run in row["per_seed"].items():
                earlier = figures.setdefault(name, {}).get(int(seed))
                if name != "none" and earlier is not None and earlier["accuracies"] != run["accuracies"]:
                    parser.error(
                        f"--merge: {name} seed {seed} is in two reports with other accuracies; allowed: one run "
                        "of a codec and seed"
                    )
                figures[name].setdefault(int(seed), run)
                bases.setdefault(name, {})[int(seed)] = report["codecs"]["none"]["per_seed"][seed]
    names = list(figures)
    seeds = sorted(figures["none"])
    missing = [(name, seed) for name in names for seed in seeds if seed not in figures[name]]
    if missing:
        parser.error(f"--merge: {missing[0][0]} lacks seed {missing[0][1]}; allowed: every codec on every seed")
    horizons = int_list(parser, "--horizons", args.horizons) if args.horizons is not None else []
    bad = [h for h in horizons if not 1 <= h <= rounds]
    if bad:
        parser.error(f"--horizons: {bad[0]} is not between 1 and the rounds run ({rounds})")
    load = [min(r["load_average"][0] for r in reports), max(r["load_average"][1] for r in reports)]
    commands = [r.get("command", path) for path, r in zip(paths, reports, strict=True)]
    bases["none"] = figures["none"]
    report_runs(args, figures, names, seeds, rounds, horizons, load, commands, bases)
    return 0


def report_runs(
    args: argparse.Namespace,
    figures: dict[str, dict[int, dict]],
    names: list[str],
    seeds: list[int],
    rounds: int,
    horizons: list[int],
    load: list[float],
    merged: list[str],
    bases: dict[str, dict[int, dict]] | None = None,
) -> None:
    """Print the table (and the horizon summary) of the jobs' figures and write them with ``--json``; ``merged``:
    the commands of the runs a ``--merge`` combined (empty otherwise); ``bases``: the ``none`` run each codec's run
    of a seed is compared with (default: ``figures["none"]``)."""
    width = max(12, *(len(name) for name in names))
    print(
        f"\nFedAvg job on digits, job defaults, {rounds} rounds, seeds {','.join(map(str, seeds))}; timing over rounds "
        f"{WARM_ROUNDS + 1}-{rounds}; load average {load[0]:.1f} before, {load[1]:.1f} after"
    )
    print(
        f"{'codec':<{width}} {'x fewer':>8} {'final vs none (points, per seed)':>34} {'last-5 mean vs none':>34} "
        f"{'codec/round (sum)':>18} {'(critical leaf)':>16} {'round s':>8} {'vs none':>8}"
    )
    table = {}
    for name in names:
        base = bases[name] if bases else figures["none"]
        runs = [figures[name][s] for s in seeds]
        points = [100 * (figures[name][s]["final_accuracy"] - base[s]["final_accuracy"]) for s in seeds]
        last5 = [100 * (figures[name][s]["last5_accuracy"] - base[s]["last5_accuracy"]) for s in seeds]
        row = table[name] = {
            "fewer_bytes": float(np.mean([base[s]["uplink_bytes"] / figures[name][s]["uplink_bytes"] for s in seeds])),
            "final_vs_none_points": points,
            "last5_vs_none_points": last5,
            "codec_share_sum": [r["codec_share_sum"] for r in runs],
            "codec_share_critical": [r["codec_share_critical"] for r in runs],
            "round_wall_mean": float(np.mean([r["round_wall_mean"] for r in runs])),
            "per_seed": {str(s): figures[name][s] for s in seeds},
        }
        row["round_wall_vs_none"] = row["round_wall_mean"] / float(np.mean([base[s]["round_wall_mean"] for s in seeds]))
        print(
            f"{name:<{width}} {row['fewer_bytes']:8.2f} {_points(points):>34} {_points(last5):>34} "
            f"{_range(row['codec_share_sum']):>18} {_range(row['codec_share_critical']):>16} "
            f"{row['round_wall_mean']:8.3f} {row['round_wall_vs_none']:8.3f}"
        )
    summary = horizon_summary(figures, names, seeds, horizons, bases) if horizons else None
    if summary is not None:
        print_summary(summary, argparse.Namespace(seeds=seeds, horizons=horizons))
        print("(codec share here: the critical leaf's codec seconds against the round's wall time)")
    if args.json is not None:
        command = " && ".join([*merged, _compression.command_line()])
        report = {"rounds": rounds, "seeds": seeds, "load_average": load, "codecs": table, "summary": summary}
        report["command"] = command
        horizon = _compression.figure_horizon(horizons, rounds)
        at = summary if horizon in horizons else horizon_summary(figures, names, seeds, [horizon], bases)
        where = _compression.machine_load(load[0], load[1])
        published = _compression.accuracy_figures(at, "digits in the job", len(seeds), horizon, command, where)
        published += share_figures(table, command, where)
        print(f"wrote {_compression.publish('compression_job', report, published, args.json)}")


def share_figures(table: dict, command: str, where: str) -> list[dict[str, str]]:
    """The codec's share of the round on the critical leaf, top-k 10% / int8, over the seeds (where both ran)."""
    if "topk 10%" not in table or "int8" not in table:
        return []
    figures = _compression._figures_module()
    shares = " / ".join(_range(table[name]["codec_share_critical"]) for name in ("topk 10%", "int8"))
    return [
        figures.figure(
            "codec share of the round, critical leaf, topk 10% / int8",
            shares,
            "<= 5%",
            command,
            time.strftime("%Y-%m-%d"),
            where,
        )
    ]


def horizon_summary(
    figures: dict[str, dict[int, dict]],
    names: list[str],
    seeds: list[int],
    horizons: list[int],
    bases: dict[str, dict[int, dict]] | None = None,
) -> dict:
    """``benchmarks/compression.py``'s summary over the seeds (points against ``none`` after each horizon, mean and
    worst, final accuracy and last-5 mean) from the jobs' per-round accuracies; the codec share is the critical
    leaf's. ``bases``: the ``none`` run each codec is compared with, by codec and seed (default: ``figures["none"]``
    for every codec)."""
    if bases is not None:
        return {
            name: horizon_summary(
                {**figures, "none": bases[name]}, ["none", name] if name != "none" else ["none"], seeds, horizons
            )[name]
            for name in names
        }
    per_seed = {
        seed: {
            "rows": {
                name: {
                    "fewer_bytes": figures["none"][seed]["uplink_bytes"] / figures[name][seed]["uplink_bytes"],
                    "codec_share": figures[name][seed]["codec_share_critical"],
                }
                for name in names
            },
            "accuracies": {name: figures[name][seed]["accuracies"] for name in names},
            **_bytes_by_round(figures, names, seed),
        }
        for seed in seeds
    }
    return summarise(per_seed, names, horizons)


def _bytes_by_round(figures: dict[str, dict[int, dict]], names: list[str], seed: int) -> dict:
    """``{"uplink_bytes": {codec: bytes of each round}}`` of one seed, for the bytes ratio at each horizon (a
    warm-up's denser rounds count where they fall); empty where a run's records lack them."""
    rows = {name: figures[name][seed].get("uplink_bytes_by_round") for name in names}
    return {} if any(row is None for row in rows.values()) else {"uplink_bytes": rows}


def _points(points: list[float]) -> str:
    """Points per seed, ``a / b / c``."""
    return " / ".join(f"{p:+.2f}" for p in points)


def _range(shares: list[float]) -> str:
    """``a-b%`` over the seeds (one value: ``a%``)."""
    low, high = 100 * min(shares), 100 * max(shares)
    return f"{low:.2f}%" if len(shares) == 1 else f"{low:.2f}-{high:.2f}%"


if __name__ == "__main__":
    sys.exit(main())
