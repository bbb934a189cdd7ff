"""Replay cluster decision rules on trajectories of leaves that train alone, to choose them by measurement.

Until the first merge, a leaf under a drift source trains alone, so its drift does not depend on the
rule: one run with no links (``--tau 1``) gives every rule's similarities up to its first merge. This
script runs (or reads back, ``--from``) such trajectories of the core simulation
(devsim/training/cluster_sim.py, the cluster job's defaults otherwise) and stores each round's Gram
matrix of the leaves' ``model_drift`` vectors. Each rule (centred or absolute cosine, silhouette bar,
confirmation rounds) is then replayed through the real :class:`ClusterAggregation` on vectors with that
Gram matrix, and the first partition it puts in force is printed: ``E`` exact, ``p`` partial (no wrong
link, not all groups joined yet), ``W`` wrong (two groups linked), ``-`` none within the rounds, with
the round. A wrong first merge is the failure that stays (members then share a model).

    .venv/bin/python benchmarks/cluster_replay.py --groups 2,3 --leaves-per-group 2 --seeds 0,1,2 \\
        --jobs 2 --out /tmp/alone --figure docs/cluster_replay_input_2x2.png
    .venv/bin/python benchmarks/cluster_replay.py --from /tmp/alone --bars 0.2,0.25,0.3 --confirm 1,2,3
"""

from __future__ import annotations

import argparse
import glob
import itertools
import json
import multiprocessing
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from devsim.aggregation.base import LeafUpdate  # noqa: E402
from devsim.aggregation.cluster import ClusterAggregation, cosine_similarity_centred  # noqa: E402
from devsim.aggregation.cluster.threshold import (  # noqa: E402
    canonical_labels,
    components_above,
    silhouette_threshold,
    split_summary,
)


def trajectory(task: tuple) -> dict:
    """One all-alone run: per round, the Gram matrix of the leaves' model_drift vectors."""
    import torch

    from devsim.config import ClusterConfig
    from devsim.training.cluster_sim import initial_weights, simulate_clusters

    torch.set_num_threads(1)
    kind, groups, per_group, seed, rounds, out = task
    leaves = groups * per_group
    config = ClusterConfig(
        num_leaf_nodes=leaves,
        hidden_groups=groups,
        group_kind=kind,
        devices_per_leaf=20,
        device_selection_size=10 * leaves,
        device_batch=10,
        num_rounds=rounds,
        seed=seed,
        data_seed=seed,
        tau=1.0,
    ).validate()
    reference, keys = initial_weights(config)
    strategy = ClusterAggregation(tau=1.0, similarity_on="model_drift", last_layer_keys=keys, reference=reference)
    grams: list[list[list[float]]] = []

    def hook(round_num, trained_from, updates, result) -> None:
        by_leaf = {u.leaf: u for u in updates}
        rows = []
        for leaf in result.leaf_order:
            u = by_leaf[leaf]
            rows.append(
                np.concatenate(
                    [
                        (trained_from[leaf][k] + u.delta_sum[k] / u.total_weight - reference[k]).ravel()
                        for k in reference
                    ]
                ).astype(np.float64)
            )
        vectors = np.stack(rows)
        grams.append((vectors @ vectors.T).tolist())

    result = simulate_clusters(config, strategy, on_round=hook)
    record = {"kind": kind, "groups": groups, "per": per_group, "seed": seed, "true": result.true_groups}
    record.update(gram=grams, acc=result.leaf_accuracy)
    if out:
        with open(os.path.join(out, f"alone_{kind}_{groups}x{per_group}_s{seed}.json"), "w") as stream:
            json.dump(record, stream)
    return record


def load(record: dict) -> list[np.ndarray]:
    """Per-round Gram matrices (also reads files holding per-layer ``grams``, summed over layers)."""
    if "gram" in record:
        return [np.asarray(g) for g in record["gram"]]
    return [sum(np.asarray(layer["drift"]) for layer in g.values()) for g in record["grams"]]


def vectors_of(gram: np.ndarray) -> np.ndarray:
    """Rows whose Gram matrix is ``gram`` (so every cosine, centred or not, is the original's)."""
    values, basis = np.linalg.eigh((gram + gram.T) / 2)
    return basis * np.sqrt(np.clip(values, 0, None))[None, :]


def replay(record: dict, centre: bool, bar: float, confirm: int) -> tuple[str, int | None]:
    """First partition the rule puts in force: (``E``/``p``/``W``/``-``, round)."""
    true = np.asarray(record["true"])
    leaves = [f"site-{i + 1:02d}" for i in range(len(true))]
    zero = {"w.weight": np.zeros(len(true), np.float32)}
    strategy = ClusterAggregation(
        tau=None,
        similarity_on="model_drift",
        last_layer_keys=["w.weight"],
        reference=zero,
        min_silhouette=bar,
        centre=centre,
        confirm_rounds=confirm,
    )
    for number, gram in enumerate(load(record), start=1):
        vectors = vectors_of(gram)
        updates = [
            LeafUpdate(leaf, {"w.weight": v.astype(np.float32)}, 1.0, 1)
            for leaf, v in zip(leaves, vectors, strict=True)
        ]
        result = strategy.aggregate_clusters({leaf: zero for leaf in leaves}, updates)
        labels = np.asarray([result.labels[leaf] for leaf in leaves])
        if result.num_clusters < len(leaves):
            same, same_true = labels[:, None] == labels[None, :], true[:, None] == true[None, :]
            if np.any(same & ~same_true):
                return "W", number
            return ("E" if np.array_equal(canonical_labels(labels), canonical_labels(true)) else "p"), number
    return "-", None


def figure(records: list[dict], path: str) -> None:
    """Per round, the true partition's margin and silhouette on absolute and on centred cosines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from devsim.aggregation.cluster import cosine_similarity_abs

    fig, axes = plt.subplots(1, len(records), figsize=(4.2 * len(records), 3.4), squeeze=False)
    for ax, record in zip(axes[0], records, strict=True):
        true = record["true"]
        for name, similarity, style in (
            ("absolute", cosine_similarity_abs, "-"),
            ("centred", cosine_similarity_centred, "--"),
        ):
            summaries = [split_summary(similarity(vectors_of(g)), true, [0]) for g in load(record)]
            rounds = range(1, len(summaries) + 1)
            ax.plot(rounds, [s["margin"] for s in summaries], "C0" + style, label=f"margin, {name}")
            ax.plot(rounds, [s["silhouette"] for s in summaries], "C1" + style, label=f"silhouette, {name}")
        # The best split the automatic threshold finds on centred cosines (what the rule proposes when it
        # reaches the bar): o = the true partition, x = another one.
        for number, gram in enumerate(load(record), start=1):
            similarity = cosine_similarity_centred(vectors_of(gram))
            labels = components_above(similarity, silhouette_threshold(similarity, min_silhouette=-1.0))
            score = split_summary(similarity, labels, [0])["silhouette"]
            right = np.array_equal(canonical_labels(labels), canonical_labels(true))
            ax.plot([number], [score], "o" if right else "x", color="k", ms=3, label=None)
        ax.plot([], [], "kx", ms=3, label="best split, centred (o: true)")
        ax.axhline(0, color="grey", lw=0.5)
        ax.axhline(0.4, color="C3", lw=0.5, ls=":", label="old bar 0.4")
        ax.axhline(0.25, color="C2", lw=0.5, ls=":", label="bar 0.25")
        ax.set_title(f"{record['kind']} {record['groups']}x{record['per']} seed {record['seed']}", fontsize=9)
        ax.set_xlabel("round (leaves alone)")
    axes[0][0].set_ylabel("true partition")
    axes[0][-1].legend(fontsize=6, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kinds", default="label_permutation,input_transform")
    parser.add_argument("--groups", default="2,3")
    parser.add_argument("--leaves-per-group", default="2")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--jobs", type=int, default=1, help="trajectories in parallel (one CPU thread each)")
    parser.add_argument("--out", default=None, help="folder to write each trajectory's JSON to")
    parser.add_argument("--from", dest="source", default=None, help="read trajectories (alone_*.json) from here")
    parser.add_argument("--bars", default="0.2,0.25,0.3,0.4")
    parser.add_argument("--confirm", default="1,2,3")
    parser.add_argument("--figure", default=None, help="plot the 2 x 2 input_transform trajectories to this PNG")
    args = parser.parse_args()
    if args.source:
        records = [json.load(open(path)) for path in sorted(glob.glob(os.path.join(args.source, "alone_*.json")))]
    else:
        if args.out:
            os.makedirs(args.out, exist_ok=True)
        grid = itertools.product(
            args.kinds.split(","),
            [int(x) for x in args.groups.split(",")],
            [int(x) for x in args.leaves_per_group.split(",")],
            [int(x) for x in args.seeds.split(",")],
        )
        tasks = [(*cell, args.rounds, args.out) for cell in grid]
        with multiprocessing.get_context("fork").Pool(args.jobs) as pool:
            records = pool.map(trajectory, tasks)
    names = [f"{r['kind'][:5]} {r['groups']}x{r['per']} s{r['seed']}" for r in records]
    print("| centred | bar | confirm | exact first merge | " + " | ".join(names) + " |")
    print("| --- " * (4 + len(names)) + "|")
    for centre, bar, confirm in itertools.product(
        (False, True), [float(x) for x in args.bars.split(",")], [int(x) for x in args.confirm.split(",")]
    ):
        outcomes = [replay(r, centre, bar, confirm) for r in records]
        exact = sum(o[0] == "E" for o in outcomes)
        cells = " | ".join(f"{o[0]}{o[1] or ''}" for o in outcomes)
        print(f"| {'yes' if centre else 'no'} | {bar} | {confirm} | {exact}/{len(records)} | {cells} |", flush=True)
    if args.figure:
        chosen = [r for r in records if r["kind"] == "input_transform" and r["groups"] == 2 and r["per"] == 2]
        figure(chosen or records[:3], args.figure)


if __name__ == "__main__":
    main()
