"""Does cluster aggregation recover the hidden groups? Adjusted Rand index and per-leaf accuracy vs FedAvg.

For every group kind x number of groups x leaves per group x seed, runs the core-level cluster
simulation (devsim/training/cluster_sim.py: the cluster job's leaves, data, selection and training
without NVFlare) twice on identical data and devices: once with the cluster strategy (--similarity-on,
--tau; unset tau: chosen each round) and once as FedAvg (every leaf in one cluster). Printed per run:
the adjusted Rand index (ARI) of the final clusters against the true groups, the first round from
which the partition stays exact, and the mean per-leaf accuracy (each leaf's model on its group's
view of the test set) of both, side by side. Then the share of runs with ARI = 1 per group kind.

    .venv/bin/python benchmarks/cluster_recovery.py --groups 2,3 --leaves-per-group 2,3 --seeds 0,1,2 --jobs 2
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

from devsim.aggregation.cluster import ClusterAggregation  # noqa: E402
from devsim.aggregation.cluster_threshold import adjusted_rand_index  # noqa: E402
from devsim.config import ClusterConfig  # noqa: E402
from devsim.training.cluster_sim import initial_weights, simulate_clusters  # noqa: E402


def run_one(task: tuple) -> dict:
    """One (kind, groups, leaves per group, seed) cell: cluster strategy and FedAvg on the same setting."""
    import torch

    torch.set_num_threads(1)
    kind, groups, per_group, seed, args = task
    leaves = groups * per_group
    config = ClusterConfig(
        dataset=args.dataset,
        num_leaf_nodes=leaves,
        hidden_groups=groups,
        group_kind=kind,
        devices_per_leaf=args.devices_per_leaf,
        device_selection_size=args.devices_per_round * leaves,
        device_batch=args.devices_per_round if args.batched else 1,
        num_rounds=args.rounds,
        seed=seed,
        data_seed=seed,
        tau=args.tau,
        similarity_on=args.similarity_on,
        min_silhouette=args.min_silhouette,
        centre_similarity=args.centre_similarity,
        confirm_rounds=args.confirm_rounds,
        resplit_silhouette=args.resplit_silhouette,
    ).validate()
    reference, keys = initial_weights(config)
    started = time.time()
    strategy = ClusterAggregation(
        tau=config.tau,
        similarity_on=config.similarity_on,
        last_layer_keys=keys,
        reference=reference,
        min_silhouette=config.min_silhouette,
        centre=config.centre_similarity,
        confirm_rounds=config.confirm_rounds,
        resplit_silhouette=config.resplit_silhouette,
    )
    clustered = simulate_clusters(config, strategy) if args.cluster else None
    cluster_seconds = time.time() - started
    fedavg = None
    if args.fedavg:
        baseline = ClusterAggregation(tau=-1.0, similarity_on="last_layer_updates", last_layer_keys=keys)
        fedavg = simulate_clusters(config, baseline)
    if clustered is None:
        return {
            "kind": kind,
            "groups": groups,
            "leaves_per_group": per_group,
            "seed": seed,
            "ari": None,
            "cluster_accuracy": float("nan"),
            "fedavg_accuracy": sum(fedavg.leaf_accuracy) / leaves if fedavg else float("nan"),
        }
    aris = [adjusted_rand_index(clustered.true_groups, r["labels"]) for r in clustered.rounds]
    exact_from = None
    for index in range(len(aris) - 1, -1, -1):
        if aris[index] != 1.0:
            break
        exact_from = index + 1
    last = clustered.rounds[-1] if clustered.rounds else {}
    return {
        "kind": kind,
        "groups": groups,
        "leaves_per_group": per_group,
        "seed": seed,
        "ari": aris[-1] if aris else None,
        "exact_from_round": exact_from,
        "final_labels": clustered.labels,
        "true_groups": clustered.true_groups,
        "cluster_accuracy": sum(clustered.leaf_accuracy) / leaves,
        "fedavg_accuracy": sum(fedavg.leaf_accuracy) / leaves if fedavg else float("nan"),
        "rounds": [
            {k: r.get(k) for k in ("labels", "margin", "thresholds", "silhouette", "pending", "resplit")}
            for r in clustered.rounds
        ],
        "margin": last.get("margin"),
        "thresholds": last.get("thresholds"),
        "cluster_seconds": cluster_seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kinds", default="label_permutation,input_transform")
    parser.add_argument("--groups", default="2,3")
    parser.add_argument("--leaves-per-group", default="2,3")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--dataset", default="synthetic")
    parser.add_argument("--devices-per-leaf", type=int, default=20)
    parser.add_argument("--devices-per-round", type=int, default=10, help="devices selected per leaf per round")
    parser.add_argument("--similarity-on", default=ClusterConfig.similarity_on)
    parser.add_argument("--tau", type=float, default=None, help="fixed threshold; unset: chosen each round")
    parser.add_argument("--min-silhouette", type=float, default=ClusterConfig.min_silhouette)
    parser.add_argument(
        "--centre-similarity", action=argparse.BooleanOptionalAction, default=ClusterConfig.centre_similarity
    )
    parser.add_argument("--confirm-rounds", type=int, default=ClusterConfig.confirm_rounds)
    parser.add_argument(
        "--resplit-silhouette",
        type=lambda text: None if text.lower() == "none" else float(text),
        default=ClusterConfig.resplit_silhouette,
        help="bar of the re-split of clusters on their members' updates; 'none': never re-split",
    )
    parser.add_argument(
        "--batched",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="train a leaf's devices of a round as one vmapped batch (same maths, several times faster on a CPU)",
    )
    parser.add_argument(
        "--cluster", action=argparse.BooleanOptionalAction, default=True, help="run the cluster strategy"
    )
    parser.add_argument("--fedavg", action=argparse.BooleanOptionalAction, default=True, help="run the baseline")
    parser.add_argument("--jobs", type=int, default=1, help="runs in parallel (one CPU thread each)")
    parser.add_argument("--out", default=None, help="write every run's record to this JSON file")
    args = parser.parse_args()
    grid = itertools.product(
        args.kinds.split(","),
        [int(x) for x in args.groups.split(",")],
        [int(x) for x in args.leaves_per_group.split(",")],
        [int(x) for x in args.seeds.split(",")],
    )
    tasks = [(*cell, args) for cell in grid]
    print(
        f"{len(tasks)} runs, {args.rounds} rounds, similarity {args.similarity_on}, tau {args.tau or 'auto'}, "
        f"min silhouette {args.min_silhouette}, centred {args.centre_similarity}, confirm {args.confirm_rounds}, "
        f"re-split {args.resplit_silhouette}; "
        f"load average {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    started = time.time()
    with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
        rows = []
        header = "| kind | groups | leaves/group | seed | ARI | exact from round | cluster acc | FedAvg acc | ratio |"
        print(header + "\n|" + " --- |" * 9, flush=True)
        for row in pool.imap(run_one, tasks):
            rows.append(row)
            exact = row.get("exact_from_round") or "-"
            ari = f"{row['ari']:.2f}" if row["ari"] is not None else "-"
            print(
                f"| {row['kind']} | {row['groups']} | {row['leaves_per_group']} | {row['seed']} | {ari} "
                f"| {exact} | {row['cluster_accuracy']:.3f} | {row['fedavg_accuracy']:.3f} "
                f"| {row['cluster_accuracy'] / max(row['fedavg_accuracy'], 1e-9):.2f} |",
                flush=True,
            )
    for kind in args.kinds.split(","):
        mine = [r for r in rows if r["kind"] == kind]
        exact = sum(r["ari"] == 1.0 for r in mine) if args.cluster else "-"
        acc = sum(r["cluster_accuracy"] for r in mine) / len(mine)
        base = sum(r["fedavg_accuracy"] for r in mine) / len(mine)
        print(f"{kind}: ARI = 1 in {exact}/{len(mine)} runs; mean leaf accuracy {acc:.3f} vs FedAvg {base:.3f}")
    print(f"wall {time.time() - started:.0f} s, load average {os.getloadavg()[0]:.2f}")
    if args.out:
        with open(args.out, "w") as stream:
            json.dump(rows, stream, indent=1)


if __name__ == "__main__":
    main()
