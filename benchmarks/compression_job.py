"""Uplink codecs inside the FedAvg job itself: what compression costs a user's round (digits, NVFlare's simulator).

Runs ``jobs/pt_job_fedavg.py --dataset digits`` (the job's defaults: 2 leaves x 50 devices, 20 a round, 100 samples
a device) once per codec and seed, after one untimed warm-up job (the invocation's first job ran 10-40% slower
whatever its codec), and reads each run's results.json: uplink bytes (device -> leaf) and their ratio to ``none``;
final test accuracy and the mean of the last 5 evaluated rounds', in points against ``none`` of the same seed; the
codec's seconds against the round's wall time, summed over both leaves (an upper bound) and on the critical leaf
(what the codec adds to a round whose leaves run side by side); the mean round wall time from round 3 on.

``--codecs`` (repeatable: each group runs with its own ``none`` on every seed, the baseline made next to it) takes
``none``, ``fp16``, ``int8``, or ``topk P%`` followed by ``fp16`` or ``int8``, ``warmup W`` and/or ``momentum B``.
``--json [PATH]`` writes the table, the horizon summary and the figures (each codec's points against float32 after
30 rounds, mean / worst over the seeds, and the critical leaf's codec share of top-k 10% and int8) to
``benchmarks/results/compression_job-<date>.json`` (or PATH):

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/compression_job.py --seeds 0,1,2,3,4 --rounds 100 \
        --codecs "none,topk 1%,topk 1% momentum 0.3,topk 1% warmup 4,topk 1% warmup 4 momentum 0.3" \
        --codecs "none,int8,topk 10%" --horizons 20,30,60,100 --json
    .venv/bin/python benchmarks/compression_job.py --quick                    # 3 rounds: checks the script
"""

from __future__ import annotations

import functools
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.harness import ONE_THREAD, Session, arguments, items, load, print_table, run_job  # noqa: E402
from devsim.compression import CodecSpec  # noqa: E402

DEFAULT_CODECS = "none,fp16,int8,topk 10%,topk 1%"
WARM_ROUNDS = 2  # rounds left out of the timing figures (start-up: first calls, page faults, caches)
LAST_ROUNDS = 5
TOPK_TARGET = "within 3 / worst within 5"  # issue 33's target for top-k 1% at 30 rounds
DENSE_TARGET = "within 1 point"
CODECS = {
    "none": CodecSpec("none"),
    "fp16": CodecSpec("fp16"),
    "int8": CodecSpec("int8"),
    "topk 10%": CodecSpec("topk", topk_fraction=0.1),
    "topk 1%": CodecSpec("topk", topk_fraction=0.01),
}


def codec_flags(name: str) -> list[str]:
    """The job flags for a ``--codecs`` item (see :func:`codec_from_name` for the forms)."""
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
    summary = results["summary"]
    out = dict(
        uplink_bytes=int(summary["bytes_total"]["device_to_leaf"]), final_accuracy=float(summary["final_accuracy"])
    )
    out.update(uplink_bytes_by_round=by_round if len(by_round) == len(rounds) else None, accuracies=accuracies)
    out.update(last5_accuracy=last_mean(accuracies), round_wall_mean=wall / len(timed), job_wall=float(results["wall"]))
    out["codec_share_sum"] = sum(t["info"].get("codec_seconds", 0.0) for t in timed) / wall
    out["codec_share_critical"] = sum(t["info"].get("critical_leaf_codec_seconds", 0.0) for t in timed) / wall
    return out


def main(argv: list[str] | None = None) -> int:
    parser = arguments(__doc__, "write the figures (to PATH if given)", "PATH")
    codecs_help = f"comma list with none (default {DEFAULT_CODECS}); repeat for groups each with its own none"
    parser.add_argument("--codecs", action="append", default=None, help=codecs_help.replace("%", "%%"))
    parser.add_argument("--seeds", default="0,1,2", help="comma list of job --seed values")
    parser.add_argument("--rounds", type=int, default=20, help="job --num-rounds")
    parser.add_argument("--horizons", help="comma list of round counts (<= --rounds) to compare accuracy at")
    parser.add_argument("--quick", action="store_true", help="3 rounds, one seed: checks the script")
    args = parser.parse_args(argv)
    session = Session("compression_job", __file__, argv)
    groups = [[n.strip() for n in text.split(",") if n.strip()] for text in args.codecs or [DEFAULT_CODECS]]
    flags: dict[str, list[str]] = {}
    for group in groups:
        if "none" not in group:
            parser.error(f"--codecs: {','.join(group)!r} lacks none; allowed: a comma list with none")
        for name in group:
            if name != "none" and name in flags:
                parser.error(f"--codecs: {name!r} is in two groups; allowed: each codec in one group")
            try:
                flags[name] = codec_flags(name)
            except ValueError as error:
                parser.error(f"--codecs: {name!r} is not allowed ({error})")
    names = list(flags)
    seeds = items(parser, "--seeds", args.seeds, int)
    rounds = 3 if args.quick else args.rounds
    seeds = seeds[:1] if args.quick else seeds
    if rounds <= WARM_ROUNDS:
        parser.error(f"--rounds must be more than {WARM_ROUNDS} (the warm rounds left out of the timing)")
    horizons = items(parser, "--horizons", args.horizons, int) if args.horizons is not None else []
    bad = [h for h in horizons if not 1 <= h <= rounds]
    if bad:
        parser.error(f"--horizons: {bad[0]} is not between 1 and the rounds run ({rounds})")
    figures: dict[str, dict[int, dict]] = {name: {} for name in names}
    bases: dict[str, dict[int, dict]] = {name: {} for name in names}  # each codec's none: its group's, same seed
    with tempfile.TemporaryDirectory(prefix="compression_job_") as workdir:
        job = functools.partial(run_job, "pt_job_fedavg.py", workdir=workdir, env=ONE_THREAD)
        if not args.quick:  # the invocation's first job ran its rounds 10-40% slower (cold files and libraries)
            job(["--dataset", "digits", "--num-rounds", str(WARM_ROUNDS + 1)], name="warm")
        for number, group in enumerate(groups):
            for seed in seeds:
                runs = {}
                for name in group:
                    job_flags = ["--dataset", "digits", *flags[name], "--seed", str(seed), "--num-rounds", str(rounds)]
                    results = job(job_flags, name=f"g{number}_s{seed}_{names.index(name)}")
                    runs[name] = job_figures(results)
                    print(f"  {name} seed {seed}: {results['wall']:.0f} s")
                figures["none"].setdefault(seed, runs["none"])
                for name in group:
                    if name != "none":
                        figures[name][seed], bases[name][seed] = runs[name], runs["none"]
    bases["none"] = figures["none"]
    report_runs(args, session, figures, names, seeds, rounds, horizons, bases)
    return 0


def report_runs(args, session: Session, figures: dict, names: list, seeds: list, rounds: int, horizons: list, bases):
    """Print the table (and the horizon summary) of the jobs' figures and write them with ``--json``; ``bases``: the
    ``none`` run each codec's run of a seed is compared with, by codec and seed."""
    print(
        f"\nFedAvg job on digits, job defaults, {rounds} rounds, seeds {','.join(map(str, seeds))}; timing over rounds "
        f"{WARM_ROUNDS + 1}-{rounds}; load average {session.load_start} before, {load()} after"
    )
    table, lines = {}, []
    for name in names:
        runs, base = [figures[name][s] for s in seeds], [bases[name][s] for s in seeds]
        row = table[name] = {k: [r[k] for r in runs] for k in ("codec_share_sum", "codec_share_critical")}
        row["fewer_bytes"] = _mean([b["uplink_bytes"] / r["uplink_bytes"] for r, b in zip(runs, base, strict=True)])
        row["final_vs_none_points"] = _points_against(runs, base, "final_accuracy")
        row["last5_vs_none_points"] = _points_against(runs, base, "last5_accuracy")
        row["round_wall_mean"] = _mean([r["round_wall_mean"] for r in runs])
        row["round_wall_vs_none"] = row["round_wall_mean"] / _mean([b["round_wall_mean"] for b in base])
        row["per_seed"] = {str(s): figures[name][s] for s in seeds}
        shares = [_range(row["codec_share_sum"]), _range(row["codec_share_critical"])]
        points = [_points(row["final_vs_none_points"]), _points(row["last5_vs_none_points"])]
        walls = [f"{row['round_wall_mean']:.3f}", f"{row['round_wall_vs_none']:.3f}"]
        lines.append([name, f"{row['fewer_bytes']:.2f}", *points, *shares, *walls])
    columns = ["codec", "x fewer", "final vs none (points, per seed)", "last-5 mean vs none", "codec/round (sum)"]
    print_table([*columns, "(critical leaf)", "round s", "vs none"], lines)
    summary = horizon_summary(figures, bases, names, seeds, horizons) if horizons else None
    if summary is not None:
        print_summary(summary, seeds, horizons)
        print("(codec share here: the critical leaf's codec seconds against the round's wall time)")
    if args.json is not None:
        report = {"rounds": rounds, "seeds": seeds, "codecs": table, "summary": summary, "command": session.command}
        horizon = figure_horizon(horizons, rounds)
        at = summary if horizon in horizons else horizon_summary(figures, bases, names, seeds, [horizon])
        published = accuracy_figures(session, at, "digits in the job", len(seeds), horizon)
        published += share_figures(session, table)
        session.write(report, published, args.json)


def share_figures(session: Session, table: dict) -> list[dict[str, str]]:
    """The codec's share of the round on the critical leaf, top-k 10% / int8, over the seeds (where both ran)."""
    if "topk 10%" not in table or "int8" not in table:
        return []
    shares = " / ".join(_range(table[name]["codec_share_critical"]) for name in ("topk 10%", "int8"))
    return [session.figure("codec share of the round, critical leaf, topk 10% / int8", shares, "<= 5%")]


def horizon_summary(figures: dict, bases: dict, names: list[str], seeds: list[int], horizons: list[int]) -> dict:
    """Each codec over the seeds, against its ``none`` of the same seed (``bases``): bytes ratio, the critical leaf's
    codec share (min, max) and, at each horizon H (rounds), the points after round H and of the mean of rounds
    H-4..H (each seed's, their mean and worst) and, where the runs give each round's uplink bytes, the bytes ratio
    over rounds 1..H (a warm-up's denser first rounds lower it at short horizons). Round H of a longer run is that
    of an H-round run: nothing in a synchronous round depends on how many rounds follow. ``figures`` and ``bases``:
    codec -> seed -> a run's :func:`job_figures`."""
    summary = {}
    for name in names:
        runs = [(figures[name][s], bases[name][s]) for s in seeds]
        shares = [run["codec_share_critical"] for run, _ in runs]
        fewer = _mean([base["uplink_bytes"] / run["uplink_bytes"] for run, base in runs])
        entry = dict(fewer_bytes=fewer, codec_share_min=min(shares), codec_share_max=max(shares), horizons={})
        for horizon in horizons:
            final = [100 * (run["accuracies"][horizon - 1] - base["accuracies"][horizon - 1]) for run, base in runs]
            settled = [
                100 * (last_mean(run["accuracies"][:horizon]) - last_mean(base["accuracies"][:horizon]))
                for run, base in runs
            ]
            at = dict(
                final_vs_none_points=final, final_vs_none_mean=_mean(final), final_vs_none_worst=float(min(final))
            )
            at.update(last5_vs_none_mean=_mean(settled), last5_vs_none_worst=float(min(settled)))
            entry["horizons"][str(horizon)] = at
            by_round = [(run.get("uplink_bytes_by_round"), base.get("uplink_bytes_by_round")) for run, base in runs]
            if all(mine and none for mine, none in by_round):
                at["fewer_bytes"] = _mean([sum(none[:horizon]) / sum(mine[:horizon]) for mine, none in by_round])
        summary[name] = entry
    return summary


def _mean(values: list[float]) -> float:
    return float(np.mean(values))


def _points_against(runs: list[dict], base: list[dict], key: str) -> list[float]:
    """Points of ``key`` of each seed's run against its ``none``."""
    return [100 * (run[key] - none[key]) for run, none in zip(runs, base, strict=True)]


def _points(points: list[float]) -> str:
    """Points per seed, ``a / b / c``."""
    return " / ".join(f"{p:+.2f}" for p in points)


def _range(shares: list[float]) -> str:
    """``a-b%`` over the seeds (one value: ``a%``)."""
    low, high = 100 * min(shares), 100 * max(shares)
    return f"{low:.2f}%" if len(shares) == 1 else f"{low:.2f}-{high:.2f}%"


def codec_from_name(name: str) -> CodecSpec:
    """A ``--codecs`` item: one of :data:`CODECS`, or ``topk P%`` then ``fp16`` or ``int8``, ``warmup W`` and/or
    ``momentum B``."""
    if name in CODECS:
        return CODECS[name]
    words = name.split()
    if len(words) < 2 or words[0] != "topk" or not words[1].endswith("%"):
        raise ValueError("not a known codec nor 'topk P%'")
    try:
        options = {"topk_fraction": float(words[1][:-1]) / 100}
    except ValueError:
        raise ValueError(f"{words[1]!r} is not a percentage") from None
    rest = words[2:]
    while rest:
        if rest[0] in ("fp16", "int8"):
            options["topk_values"], rest = {"fp16": "float16", "int8": "int8"}[rest[0]], rest[1:]
        elif rest[0] == "warmup" and len(rest) > 1 and rest[1].isdigit():
            options["topk_warmup_rounds"], rest = int(rest[1]), rest[2:]
        elif rest[0] == "momentum" and len(rest) > 1:
            try:
                options["topk_momentum"], rest = float(rest[1]), rest[2:]
            except ValueError:
                raise ValueError(f"momentum {rest[1]!r} is not a number") from None
        else:
            raise ValueError(f"unknown topk option {rest[0]!r}")
    return CodecSpec("topk", **options)


def last_mean(accuracies: list[float], count: int = LAST_ROUNDS) -> float:
    """Mean of the last ``count`` rounds' test accuracies: the final accuracy without one round's selection noise
    (which 20 devices a round happen to train moves a single round's accuracy by up to ~2 points on digits)."""
    return float(np.mean(accuracies[-count:]))


def codec_label(name: str) -> str:
    """A ``--codecs`` item as the published figures name it: ``int8``, ``top-k 1%``, ``top-k 1% warm-up 4``,
    ``top-k 1% leaf momentum 0.3``, ..."""
    spec = codec_from_name(name)
    if spec.name != "topk":
        return name
    words = [f"top-k {100 * spec.topk_fraction:g}%"]
    if spec.topk_values != "float32":
        words.append(f"{spec.topk_values} values")
    if spec.topk_warmup_rounds:
        words.append(f"warm-up {spec.topk_warmup_rounds}")
    if spec.topk_momentum:
        words.append(f"leaf momentum {spec.topk_momentum:g}")
    return " ".join(words)


def figure_horizon(horizons: list[int], rounds: int) -> int:
    """The round count the accuracy figures are published at: 30 (issue 33's) when among ``horizons``, else the last
    horizon, else the rounds run."""
    return 30 if 30 in horizons else (horizons[-1] if horizons else rounds)


def accuracy_figures(session: Session, summary: dict, where: str, seeds: int, horizon: int) -> list[dict[str, str]]:
    """One published figure per codec other than ``none``: points against float32 after ``horizon`` rounds, mean /
    worst over the seeds, named with the bytes ratio over those rounds (a warm-up's denser rounds counted), e.g.
    "top-k 1% uplink (66.6x fewer bytes) vs float32, digits in the job, 5 seeds, 30 rounds"."""
    published = []
    for name, entry in summary.items():
        if name == "none":
            continue
        at = entry["horizons"][str(horizon)]
        fewer = at.get("fewer_bytes", entry["fewer_bytes"])
        published.append(
            session.figure(
                f"{codec_label(name)} uplink ({fewer:.3g}x fewer bytes) vs float32, {where}, {seeds} seeds, "
                f"{horizon} rounds",
                f"{at['final_vs_none_mean']:+.2f} / {at['final_vs_none_worst']:+.2f} points (mean / worst)",
                TOPK_TARGET if name.startswith("topk") else DENSE_TARGET,
            )
        )
    return published


def print_summary(summary: dict, seeds: list[int], horizons: list[int]) -> None:
    """One line a codec: bytes ratio, codec share range and, per horizon, mean / worst points against none (and the
    bytes ratio over the rounds up to it, where known)."""
    print(
        f"\nover seeds {','.join(map(str, seeds))}: points against none of the same seed, mean / worst "
        "(final accuracy; last-5 mean) [x fewer bytes up to that round]"
    )
    table = []
    for name, entry in summary.items():
        share = f"{100 * entry['codec_share_min']:.2f}-{100 * entry['codec_share_max']:.2f}%"
        cells = [
            f"{h['final_vs_none_mean']:+.2f} / {h['final_vs_none_worst']:+.2f}; "
            f"{h['last5_vs_none_mean']:+.2f} / {h['last5_vs_none_worst']:+.2f}"
            + (f" [{h['fewer_bytes']:.1f}x]" if "fewer_bytes" in h else "")
            for h in (entry["horizons"][str(horizon)] for horizon in horizons)
        ]
        table.append([name, f"{entry['fewer_bytes']:.2f}", share, *cells])
    print_table(["codec", "x fewer", "codec share", *(f"after {h}" for h in horizons)], table)


if __name__ == "__main__":
    sys.exit(main())
