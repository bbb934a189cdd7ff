"""This project's device processor in NVFlare 2.9's own edge hierarchy (EdgeJob and its device simulation).

python jobs/pt_job_edge.py                                   # 2 leaves x 16 devices, FedAvg, 5 versions
python jobs/pt_job_edge.py --mode fedbuff --buffer-size 4 --device-selection-size 8 --global-lr 0.5
python jobs/pt_job_edge.py --runner stock --payloads lists  # NVFlare's own device runner and list payloads
python jobs/pt_job_edge.py --export --export-dir fl_job      # then: nvflare simulator fl_job/devsim_edge -n 2 -t 2

Flat topology only (every NVFlare client is a leaf; simulator threads = clients). Needs no torchvision.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Importing the recipe module strips --export / --export-dir from sys.argv (NVFlare's convention).
from devsim_flare.edge_job import MODES, RUNNERS, DevsimEdgeRecipe, find_results, load_results  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.add_argument("--num-leaf-nodes", type=int, default=2)
    p.add_argument("--devices-per-leaf", type=int, default=16)
    p.add_argument(
        "--num-versions",
        "--num-rounds",
        dest="num_versions",
        type=int,
        default=5,
        help="trained global model versions (FedAvg: rounds)",
    )
    p.add_argument("--device-selection-size", type=int, default=None, help="default: every device")
    p.add_argument("--mode", choices=MODES, default="fedavg")
    p.add_argument("--buffer-size", type=int, default=None, help="fedbuff: updates per new version")
    p.add_argument("--global-lr", type=float, default=1.0)
    p.add_argument("--staleness-weight", action="store_true")
    p.add_argument(
        "--num-workers",
        type=int,
        default=None,
        help="device-training threads per leaf (default: sized from cores / free VRAM; stock runner: 4)",
    )
    p.add_argument(
        "--runner",
        choices=RUNNERS,
        default="fast",
        help="device runner on each leaf: fast (this project's) or stock (NVFlare's TPORunner)",
    )
    p.add_argument(
        "--payloads",
        choices=("numpy", "lists"),
        default="numpy",
        help="global model format sent to the leaves (lists: NVFlare's default, needed by real web devices)",
    )
    p.add_argument("--update-interval", type=float, default=1.0, help="seconds between a leaf's reports")
    p.add_argument("--update-timeout", type=float, default=60.0)
    p.add_argument("--eval-frequency", type=int, default=1)
    # processor settings
    p.add_argument("--dataset", default="synthetic")
    p.add_argument("--data-root", default=None)
    p.add_argument("--model", default="cnn")
    p.add_argument("--partition", default="dirichlet")
    p.add_argument("--alpha", type=float, default=0.5)
    p.add_argument("--samples-per-device", type=int, default=100)
    p.add_argument("--local-epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=10)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--synthetic-train-size", type=int, default=20000)
    p.add_argument("--synthetic-test-size", type=int, default=2000)
    # run
    p.add_argument("--workspace", default="workspace/edge", help="NVFlare simulator workspace root")
    p.add_argument("--output-dir", default=None, help="evaluator output folder (default: server run folder)")
    p.add_argument("--log-level", choices=("WARNING", "INFO", "DEBUG"), default="WARNING")
    return p


def settings_from(args: argparse.Namespace) -> dict:
    names = (
        "dataset",
        "data_root",
        "model",
        "partition",
        "alpha",
        "samples_per_device",
        "local_epochs",
        "batch_size",
        "lr",
        "seed",
        "synthetic_train_size",
        "synthetic_test_size",
    )
    settings = {n: getattr(args, n) for n in names}
    settings["data_seed"] = args.seed
    return settings


def build_recipe(args: argparse.Namespace, output_dir: str | None) -> DevsimEdgeRecipe:
    """The edge recipe for parsed flags; ValueError names the offending setting."""
    return DevsimEdgeRecipe(
        settings=settings_from(args),
        num_leaf_nodes=args.num_leaf_nodes,
        devices_per_leaf=args.devices_per_leaf,
        num_versions=args.num_versions,
        device_selection_size=args.device_selection_size,
        mode=args.mode,
        buffer_size=args.buffer_size,
        global_lr=args.global_lr,
        staleness_weight=args.staleness_weight,
        num_workers=args.num_workers,
        runner=args.runner,
        numpy_payloads=args.payloads == "numpy",
        leaves_on_host=args.num_leaf_nodes,
        update_interval=args.update_interval,
        update_timeout=args.update_timeout,
        eval_frequency=args.eval_frequency,
        output_dir=output_dir,
    )


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    output_dir = os.path.abspath(args.output_dir) if args.output_dir else None
    try:
        recipe = build_recipe(args, output_dir)
    except ValueError as error:
        parser.error(str(error))
    from nvflare.recipe import SimEnv

    from devsim_flare.recipe import apply_runtime_env_defaults, console_log_config

    apply_runtime_env_defaults()

    workspace = os.path.abspath(args.workspace)
    env = SimEnv(
        num_clients=args.num_leaf_nodes,
        num_threads=args.num_leaf_nodes,  # flat topology: every client a leaf, threads = clients
        workspace_root=workspace,
        log_config=console_log_config(args.log_level, workspace),
    )
    started = time.perf_counter()
    run = recipe.execute(env)  # exports and exits instead when --export was given
    status = run.get_status() or "finished"  # SimEnv has no status; a failed simulation raised above
    wall = time.perf_counter() - started
    path = find_results(output_dir or workspace)
    if not path:
        print(f"job status {status}; no results under {output_dir or workspace}", file=sys.stderr)
        return 1
    records = load_results(path)["records"]
    if not records:
        print(f"job status {status}; no evaluated versions in {path}", file=sys.stderr)
        return 1
    last = records[-1]
    gaps = [r["since_previous_s"] for r in records[1:]]
    per_version = sum(gaps) / len(gaps) if gaps else float("nan")
    print(
        f"job status {status}; final accuracy {last['accuracy']:.4f} at version {last['version']} "
        f"(initial {records[0]['accuracy']:.4f}); {per_version:.2f}s per version; {wall:.1f}s wall; results: {path}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
