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

from devsim.resources.collection import pause_for_imports  # noqa: E402
from devsim_flare.launch.early_fork import fork_early  # noqa: E402
from devsim_flare.launch.warm_parent import run_in_warm_parent  # noqa: E402
from devsim_flare.run_signals import stop_quietly_until_the_run  # noqa: E402

if __name__ == "__main__":
    run_in_warm_parent()  # runs the command in a warm parent (PyTorch already imported) when one answers
    pause_for_imports()  # no garbage collection while the command imports (on again once it reads its flags)
    stop_quietly_until_the_run()  # Ctrl-C from here: one line, exit 130, no traceback from inside an import
    fork_early(sys.argv[1:])  # cold: the simulator's fork servers forked right after PyTorch's import

from devsim_flare.api import FedAvgRecipe  # noqa: E402  (the repo root must be importable first)

if __name__ == "__main__":
    sys.exit(FedAvgRecipe.command_line())
