"""``benchmarks/startup.py --job api``: the penguins run of ``--job penguins`` (FedAvg, 20 rounds) started from a
Python script with the Python API (``FedAvgRecipe(...).execute(SimEnv(...))``) instead of the job command, so that
the API's start-up is measured the same way (the job command's ``--workspace`` and ``--output-dir``):

    .venv/bin/python benchmarks/tasks/api_run.py --workspace WS --output-dir RUN_DIR
"""

from __future__ import annotations

import argparse
import os
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)

PENGUINS = os.path.join(REPO, "examples", "penguins_task.py")
SETTINGS = dict(local_epochs=5, batch_size=4, device_selection_size=40, num_rounds=20)
"""The penguins run's settings, here and (as flags) in ``benchmarks/startup.py --job penguins``."""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workspace", required=True)
    parser.add_argument("--output-dir", required=True)
    args = parser.parse_args()
    from devsim_flare.api import FedAvgRecipe, SimEnv  # timed as part of the run, as the job command's imports

    recipe = FedAvgRecipe(task=PENGUINS, output_dir=args.output_dir, **SETTINGS)
    return recipe.execute(SimEnv(workspace=args.workspace)).exit_code


if __name__ == "__main__":
    sys.exit(main())
