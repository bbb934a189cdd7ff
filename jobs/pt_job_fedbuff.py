"""Asynchronous buffered FedBuff on a seeded virtual clock: K jobs in flight, a version every B updates.

python jobs/pt_job_fedbuff.py                                   # synthetic data, NVFlare simulator
python jobs/pt_job_fedbuff.py --dataset digits                  # real digits: 0.96-0.98 test accuracy (seeds 0, 1)
python jobs/pt_job_fedbuff.py --buffer-size 2 --global-lr 0.3 --max-versions 300   # the paper's B=2 (noisier)
python jobs/pt_job_fedbuff.py --delay-schedule paper_shifted --concurrency 50 --buffer-size 1
python jobs/pt_job_fedbuff.py --concurrency 20 --buffer-size 20 --min-open-slots 20   # synchronous FedAvg waves
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

from devsim_flare.api import FedBuffRecipe  # noqa: E402  (the repo root must be importable first)

if __name__ == "__main__":
    sys.exit(FedBuffRecipe.command_line())
