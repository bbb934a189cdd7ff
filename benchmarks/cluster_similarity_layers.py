"""Why clusters merge: pairwise leaf similarity per round, per layer and per similarity source, for both group kinds.

Runs the core-level cluster simulation (devsim/training/cluster_sim.py, the cluster job's leaves and
training without NVFlare) once per group kind, with the strategy given by --similarity-on / --tau, and
after every round compares the leaves that trained by absolute cosine similarity of

* each layer's update (``update/<layer>``) and drift from the initial model (``drift/<layer>``),
* the strategy sources ``layer_drift``, ``layer_updates``, ``last_layer_drift``.

Printed per round and source: the true groups' separation ``margin = within-group minimum -
between-group maximum`` (> 0: some threshold recovers the groups exactly). Written to --out: the
matrices (``similarity_<kind>.json``) and one heat-map figure per kind (``similarity_<kind>.png``,
rows: sources, columns: rounds).

    .venv/bin/python benchmarks/cluster_similarity_layers.py --rounds 12 --out /tmp/cluster_layers
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from devsim.aggregation.cluster import ClusterAggregation, cosine_similarity_abs  # noqa: E402
from devsim.aggregation.cluster.similarity import layer_blocks, leaf_vector  # noqa: E402
from devsim.config import ClusterConfig  # noqa: E402
from devsim.training.cluster_sim import initial_weights, simulate_clusters  # noqa: E402

STRATEGY_SOURCES = ("layer_drift", "layer_updates", "last_layer_drift")


def separation(similarity: np.ndarray, groups: list[int]) -> tuple[float, float]:
    """(within-group minimum, between-group maximum) of an (L, L) similarity for true ``groups``."""
    g = np.asarray(groups)
    same = (g[:, None] == g[None, :]) & ~np.eye(len(g), dtype=bool)
    return float(similarity[same].min()), float(similarity[g[:, None] != g[None, :]].max())


def run_kind(args: argparse.Namespace, kind: str) -> dict:
    config = ClusterConfig(
        num_leaf_nodes=args.groups * args.leaves_per_group,
        hidden_groups=args.groups,
        group_kind=kind,
        devices_per_leaf=20,
        device_selection_size=10 * args.groups * args.leaves_per_group,
        num_rounds=args.rounds,
        seed=args.seed,
        similarity_on=args.similarity_on,
    )
    reference, keys = initial_weights(config)
    layers = [block[0].rpartition(".")[0] for block in layer_blocks(list(reference))]
    strategy = ClusterAggregation(
        tau=args.tau, similarity_on=config.similarity_on, last_layer_keys=keys, reference=reference
    )
    rounds: list[dict] = []

    def hook(round_num, models, updates, result) -> None:
        order = [u.leaf for u in updates]
        groups = [(int(leaf.split("-")[1]) - 1) % args.groups for leaf in order]
        record = {"round": round_num, "leaves": order, "groups": groups, "labels": [result.labels[x] for x in order]}
        matrices = {}
        for layer in layers:
            for source in ("layer_updates", "layer_drift"):
                vectors = []
                for u in updates:
                    model = {k: v for k, v in models[u.leaf].items() if k.rpartition(".")[0] == layer}
                    vectors.append(leaf_vector(source, model, u, last_layer_keys=keys, reference=reference))
                matrices[f"{source.split('_')[1].rstrip('s')}/{layer}"] = cosine_similarity_abs(np.stack(vectors))
        for source in STRATEGY_SOURCES:
            vectors = [
                leaf_vector(source, models[u.leaf], u, last_layer_keys=keys, reference=reference) for u in updates
            ]
            matrices[source] = cosine_similarity_abs(np.stack(vectors))
        record["similarity"] = {name: np.round(m, 4).tolist() for name, m in matrices.items()}
        record["margin"] = {name: round(float(np.subtract(*separation(m, groups))), 4) for name, m in matrices.items()}
        rounds.append(record)

    started = time.time()
    result = simulate_clusters(config, strategy, on_round=hook)
    return {
        "kind": kind,
        "config": {"groups": args.groups, "leaves_per_group": args.leaves_per_group, "seed": args.seed},
        "strategy": {"similarity_on": config.similarity_on, "tau": config.tau},
        "rounds": rounds,
        "final_labels": result.labels,
        "leaf_accuracy": result.leaf_accuracy,
        "seconds": time.time() - started,
    }


def plot(data: dict, path: str, sources: list[str], every: int) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rounds = [r for r in data["rounds"] if r["round"] % every == 0 or r["round"] == 1]
    fig, axes = plt.subplots(len(sources), len(rounds), figsize=(1.6 * len(rounds), 1.6 * len(sources)), squeeze=False)
    for i, source in enumerate(sources):
        for j, record in enumerate(rounds):
            ax = axes[i][j]
            order = np.argsort(record["groups"], kind="stable")
            matrix = np.asarray(record["similarity"][source])[np.ix_(order, order)]
            ax.imshow(matrix, vmin=0, vmax=1, cmap="viridis")
            ax.set_xticks([])
            ax.set_yticks([])
            ax.set_title(f"r{record['round']} m={record['margin'][source]:+.2f}", fontsize=7)
            if j == 0:
                ax.set_ylabel(source, fontsize=7)
    fig.suptitle(f"{data['kind']}: |cos| between leaves (sorted by true group); m = within min - between max")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kinds", default="input_transform,label_permutation")
    parser.add_argument("--groups", type=int, default=3)
    parser.add_argument("--leaves-per-group", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--similarity-on", default="last_layer_drift", help="the strategy's source during the run")
    parser.add_argument(
        "--tau", type=float, default=None, help="fixed threshold (-1: FedAvg, all linked); unset: automatic"
    )
    parser.add_argument("--plot-every", type=int, default=2, help="plot round 1 and every N-th round")
    parser.add_argument("--out", default="cluster_layers")
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    print(f"load average {os.getloadavg()[0]:.2f}", flush=True)
    for kind in args.kinds.split(","):
        data = run_kind(args, kind)
        with open(os.path.join(args.out, f"similarity_{kind}.json"), "w") as stream:
            json.dump(data, stream)
        names = list(data["rounds"][0]["margin"])
        print(f"\n{kind}: margin (within-group min - between-group max) per round; > 0 separates exactly")
        print(f"{'source':22s}" + "".join(f"{r['round']:>7d}" for r in data["rounds"]))
        for name in names:
            print(f"{name:22s}" + "".join(f"{r['margin'][name]:+7.2f}" for r in data["rounds"]))
        print(f"final labels {data['final_labels']}  leaf accuracy {np.round(data['leaf_accuracy'], 3).tolist()}")
        print(f"{data['seconds']:.0f} s, load average {os.getloadavg()[0]:.2f}", flush=True)
        plot(data, os.path.join(args.out, f"similarity_{kind}.png"), names, args.plot_every)


if __name__ == "__main__":
    main()
