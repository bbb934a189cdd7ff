"""Does cluster aggregation recover the hidden groups? Adjusted Rand index and per-leaf accuracy vs FedAvg.

For every dataset x group kind x number of groups x leaves per group x seed, runs the core-level cluster
simulation (devsim/training/cluster_sim.py: the cluster job's leaves, data, selection and training
without NVFlare) twice on identical data and devices: once with the cluster strategy (the cluster
job's defaults) and once as FedAvg (every leaf in one cluster). Printed per run:
the adjusted Rand index (ARI) of the final clusters against the true groups, the first round from
which the partition stays exact, and the mean per-leaf accuracy (each leaf's model on its group's
view of the test set) of both, side by side. Then one line per row (dataset, kind, groups, leaves per
group): the runs with ARI = 1 by the last round (exact from that round or earlier), the mean round from
which those were exact, mean per-leaf accuracy of both and the failed runs. ``--json`` writes the rows
and one figure per row to ``benchmarks/results/cluster_recovery-<date>.json`` (benchmarks/harness.py).
The full grid (issue #33: both kinds x 2-4 groups x 2-3 leaves per group x 5 seeds, synthetic and digits,
10 rounds) is the default:

    .venv/bin/python benchmarks/cluster_recovery.py --jobs 3 --json
    # a new cluster rule on the same data: FedAvg (half the time) taken from a committed --json file
    .venv/bin/python benchmarks/cluster_recovery.py --jobs 1 --json \\
        --fedavg-from benchmarks/results/cluster_recovery-2026-11-25.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.harness import Session, arguments, items, print_row, print_table  # noqa: E402
from devsim.aggregation.cluster import ClusterAggregation, config_settings  # noqa: E402
from devsim.aggregation.cluster.threshold import adjusted_rand_index  # noqa: E402
from devsim.config import ClusterConfig  # noqa: E402
from devsim.training.cluster_sim import initial_weights, simulate_clusters  # noqa: E402


def run_one(task: tuple) -> dict:
    """One (kind, groups, leaves per group, seed) cell: cluster strategy and FedAvg on the same setting."""
    import torch

    torch.set_num_threads(1)
    dataset, kind, groups, per_group, seed, args = task
    leaves = groups * per_group
    settings = dict(dataset=dataset, num_leaf_nodes=leaves, hidden_groups=groups, group_kind=kind, seed=seed)
    settings.update(devices_per_leaf=args.devices_per_leaf, device_selection_size=args.devices_per_round * leaves)
    settings.update(device_batch=args.devices_per_round if args.batched else 1, num_rounds=args.rounds, data_seed=seed)
    config = ClusterConfig(**settings).validate()
    reference, keys = initial_weights(config)
    started = time.time()
    strategy = ClusterAggregation(last_layer_keys=keys, reference=reference, **config_settings(config))
    clustered = simulate_clusters(config, strategy)
    cluster_seconds = time.time() - started
    reused = args.fedavg_runs.get((dataset, kind, groups, per_group, seed))
    if reused is not None:
        fedavg_accuracy = reused
    else:
        baseline = ClusterAggregation(tau=-1.0, similarity_on="last_layer_updates", last_layer_keys=keys)
        fedavg_accuracy = sum(simulate_clusters(config, baseline).leaf_accuracy) / leaves
    aris = [adjusted_rand_index(clustered.true_groups, r["labels"]) for r in clustered.rounds]
    exact_from = None
    for index in range(len(aris) - 1, -1, -1):
        if aris[index] != 1.0:
            break
        exact_from = index + 1
    last = clustered.rounds[-1] if clustered.rounds else {}
    row = dict(dataset=dataset, kind=kind, groups=groups, leaves_per_group=per_group, seed=seed)
    row.update(ari=aris[-1] if aris else None, exact_from_round=exact_from, final_labels=clustered.labels)
    row.update(true_groups=clustered.true_groups, cluster_accuracy=sum(clustered.leaf_accuracy) / leaves)
    keys = ("labels", "margin", "thresholds", "silhouette", "pending", "resplit", "lone")
    row.update(fedavg_accuracy=fedavg_accuracy, rounds=[{k: r.get(k) for k in keys} for r in clustered.rounds])
    return row | dict(margin=last.get("margin"), thresholds=last.get("thresholds"), cluster_seconds=cluster_seconds)


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--kinds", default="label_permutation,input_transform")
    parser.add_argument("--groups", default="2,3,4")
    parser.add_argument("--leaves-per-group", default="2,3")
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--dataset", default="synthetic,digits", help="one or more datasets, comma-separated")
    parser.add_argument("--devices-per-leaf", type=int, default=20)
    parser.add_argument("--devices-per-round", type=int, default=10, help="devices selected per leaf per round")
    parser.add_argument("--batched", action=argparse.BooleanOptionalAction, default=True, help="vmapped devices")
    parser.add_argument("--jobs", type=int, default=1, help="runs in parallel (one CPU thread each)")
    parser.add_argument("--fedavg-from", help="take FedAvg's runs from this earlier results file (same settings)")
    parser.add_argument("--out", default=None, help="write every run's record to this JSON file")
    args = parser.parse_args()
    session = Session("cluster_recovery")
    args.fedavg_runs = _fedavg_runs(args.fedavg_from, args) if args.fedavg_from else {}
    grid = itertools.product(
        items(parser, "--dataset", args.dataset),
        items(parser, "--kinds", args.kinds),
        items(parser, "--groups", args.groups, int),
        items(parser, "--leaves-per-group", args.leaves_per_group, int),
        items(parser, "--seeds", args.seeds, int),
    )
    # The largest cells first, so the pool does not end on one long run.
    tasks = sorted(((*cell, args) for cell in grid), key=lambda t: -t[2] * t[3])
    print(f"{len(tasks)} runs, {args.rounds} rounds, the cluster job's defaults; load average {os.getloadavg()[0]:.2f}")
    started = time.time()
    with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
        rows = []
        columns = ["dataset", "kind", "groups", "leaves/group", "seed", "ARI", "exact from round", "cluster acc"]
        print_table([*columns, "FedAvg acc", "ratio"], [])
        for row in pool.imap_unordered(run_one, tasks):
            rows.append(row)
            ari = f"{row['ari']:.2f}" if row["ari"] is not None else "-"
            cells = [row[k] for k in ("dataset", "kind", "groups", "leaves_per_group", "seed")]
            accuracy = [f"{row['cluster_accuracy']:.3f}", f"{row['fedavg_accuracy']:.3f}"]
            ratio = f"{row['cluster_accuracy'] / max(row['fedavg_accuracy'], 1e-9):.2f}"
            print_row([*cells, ari, row.get("exact_from_round") or "-", *accuracy, ratio])
    report(rows, args, session, time.time() - started)


def report(rows: list[dict], args: argparse.Namespace, session: Session, wall: float) -> None:
    """Print the per-row summary; with ``--out`` write the runs, with ``--json`` the summary and its figures."""
    summary = summarise(rows, args.rounds)
    table = [
        [row["dataset"], row["kind"], row["groups"], row["leaves_per_group"], f"{row['exact']}/{row['runs']}"]
        + [_fmt(row["mean_exact_round"], 1), _fmt(row["cluster_accuracy"], 3), _fmt(row["fedavg_accuracy"], 3)]
        + [", ".join(row["failures"]) or "-"]
        for row in summary
    ]
    columns = ["dataset", "kind", "groups", "leaves/group", f"ARI = 1 by round {args.rounds}", "mean exact round"]
    print()
    print_table([*columns, "per-leaf acc", "FedAvg acc", "failures"], table)
    print(f"wall {wall:.0f} s, load average {os.getloadavg()[0]:.2f}")
    if args.out:
        with open(args.out, "w") as stream:
            json.dump(rows, stream, indent=1)
    if args.json:
        figures = [
            session.figure(
                f"cluster recovery {row['dataset']} {row['kind']} {row['groups']}x{row['leaves_per_group']}",
                f"ARI = 1 by round {args.rounds} in {row['exact']}/{row['runs']} runs, mean round "
                f"{_fmt(row['mean_exact_round'], 1)}; per-leaf accuracy {_fmt(row['cluster_accuracy'], 3)} vs "
                f"FedAvg {_fmt(row['fedavg_accuracy'], 3)}"
                + (f"; failures: {', '.join(row['failures'])}" if row["failures"] else ""),
                f"ARI = 1 in >= 95% of runs within {args.rounds} rounds; per-leaf accuracy clearly above FedAvg",
            )
            for row in summary
        ]
        settings = {k: v for k, v in vars(args).items() if k not in ("json", "out", "fedavg_runs")}
        runs = [{k: v for k, v in r.items() if k != "rounds"} for r in rows]
        session.write(dict(settings=settings, wall_s=round(wall, 1), rows=summary, runs=runs), figures)


def exact_by(row: dict, rounds: int) -> bool:
    """Whether a run's partition was exact at its last round and had been from round ``rounds`` or earlier."""
    return row.get("ari") == 1.0 and row.get("exact_from_round") is not None and row["exact_from_round"] <= rounds


def summarise(rows: list[dict], rounds: int) -> list[dict]:
    """One entry per (dataset, kind, groups, leaves per group): runs, runs exact by ``rounds``, the mean round
    from which they were exact, mean per-leaf accuracy of the cluster strategy and of FedAvg, and the failed runs
    (``seed N: ARI x``)."""
    cells: dict[tuple, list[dict]] = {}
    for row in rows:
        cells.setdefault((row["dataset"], row["kind"], row["groups"], row["leaves_per_group"]), []).append(row)
    out = []
    for (dataset, kind, groups, per_group), mine in sorted(cells.items()):
        mine = sorted(mine, key=lambda r: r["seed"])
        good = [r for r in mine if exact_by(r, rounds)]
        failures = [f"seed {r['seed']}: ARI {_fmt(r.get('ari'), 2)}" for r in mine if not exact_by(r, rounds)]
        row = dict(dataset=dataset, kind=kind, groups=groups, leaves_per_group=per_group, runs=len(mine))
        row.update(exact=len(good), mean_exact_round=_mean([r["exact_from_round"] for r in good]))
        row["cluster_accuracy"] = _mean([r["cluster_accuracy"] for r in mine])
        out.append(row | dict(fedavg_accuracy=_mean([r["fedavg_accuracy"] for r in mine]), failures=failures))
    return out


def _fedavg_runs(path: str, args: argparse.Namespace) -> dict[tuple, float]:
    """FedAvg per-leaf accuracy of every run of an earlier results file, keyed by (dataset, kind, groups, leaves
    per group, seed); ValueError when that file's data, devices or rounds differ from ``args``."""
    with open(path) as stream:
        earlier = json.load(stream)
    for name in ("rounds", "devices_per_leaf", "devices_per_round", "batched"):
        if earlier["settings"].get(name) != getattr(args, name):
            raise ValueError(
                f"--fedavg-from {path}: its {name} is {earlier['settings'].get(name)!r}, not {getattr(args, name)!r}"
            )
    return {
        (r["dataset"], r["kind"], r["groups"], r["leaves_per_group"], r["seed"]): r["fedavg_accuracy"]
        for r in earlier["runs"]
        if r.get("fedavg_accuracy") == r.get("fedavg_accuracy")
    }


def _mean(values: list) -> float | None:
    values = [v for v in values if v is not None and v == v]
    return sum(values) / len(values) if values else None


def _fmt(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


if __name__ == "__main__":
    main()
