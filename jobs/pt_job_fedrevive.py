"""FedRevive: asynchronous FedBuff-style aggregation revived by server-side data-free knowledge distillation.

python jobs/pt_job_fedrevive.py                                         # synthetic data, CPU-sized DFKD
python jobs/pt_job_fedrevive.py --dataset digits                        # real digits: 0.94-0.95 (seeds 0, 1)
python jobs/pt_job_fedrevive.py --preset fedrevive_small_cpu          # the stale `paper_shifted` setting, 200 devices
python jobs/pt_job_fedrevive.py --preset fedrevive_paper_cifar10 --data-root data --download   # GPU machine
python jobs/pt_job_fedrevive.py --preset fedrevive_paper_cifar10_shifted --data-root data
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

from devsim_flare.api import FedReviveRecipe  # noqa: E402  (the repo root must be importable first)

if __name__ == "__main__":
    sys.exit(FedReviveRecipe.command_line())
