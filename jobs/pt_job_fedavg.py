"""Hierarchical synchronous FedAvg: a server, leaf nodes under it, many simulated devices per leaf.

python jobs/pt_job_fedavg.py                          # offline demo, NVFlare simulator
python jobs/pt_job_fedavg.py --dataset cifar10 --data-root data --download
python jobs/pt_job_fedavg.py --export --export-dir fl_job   # then: nvflare simulator fl_job/devsim_fedavg -n 2 -t 2
python jobs/pt_job_fedavg.py --env poc                 # real server + leaf processes on this machine
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from devsim_flare.cli import (  # noqa: E402  (the repo root must be importable first)
    build_parser,
    config_from_args,
    default_output_dir,
    export_requested,
    prepare_data,
    run_recipe,
)
from devsim_flare.recipe import build_fedavg_recipe  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = build_parser(__doc__.splitlines()[0])
    args = parser.parse_args(argv)
    if args.output_dir is None and args.env != "prod" and not export_requested() and not args.resume:
        args.output_dir = default_output_dir(args.workspace, "fedavg")
    config = config_from_args(parser, args)
    prepare_data(parser, config)
    leaves_on_host = config.num_leaf_nodes if args.env in ("sim", "poc") else 1
    recipe = build_fedavg_recipe(config, job_name="devsim_fedavg", leaves_on_host=leaves_on_host)
    return run_recipe(recipe, args, config)


if __name__ == "__main__":
    sys.exit(main())
