"""This project's device processor in NVFlare 2.9's own edge hierarchy (EdgeJob and its device simulation).

python jobs/pt_job_edge.py                                   # 2 leaves x 16 devices, FedAvg, 20 versions
python jobs/pt_job_edge.py --mode fedbuff --buffer-size 4 --device-selection-size 8 --global-lr 0.5
python jobs/pt_job_edge.py --runner stock --payloads lists  # NVFlare's own device runner and list payloads
python jobs/pt_job_edge.py --export --export-dir fl_job      # then: nvflare simulator fl_job/devsim_edge -n 2 -t 2
python jobs/pt_job_edge.py --env prod --startup-kit KITS/admin@devsim.org --username admin@devsim.org \
    --num-leaf-nodes 4                                       # a running deployment (scripts/edge_system.py)

In `sim`, a flat topology (every NVFlare client is a leaf; simulator threads = clients). In `prod`, the
deployment's own hierarchy (relays, leaf clients). Needs no torchvision.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from devsim.resources.collection import pause_for_imports  # noqa: E402
from devsim_flare.launch.warm_parent import run_in_warm_parent  # noqa: E402
from devsim_flare.run_signals import stop_quietly_until_the_run  # noqa: E402

if __name__ == "__main__":
    run_in_warm_parent()  # runs the command in a warm parent (PyTorch already imported) when one answers
    pause_for_imports()  # no garbage collection while the command imports (on again once it reads its flags)
    stop_quietly_until_the_run()  # Ctrl-C from here: one line, exit 130, no traceback from inside an import

# Importing the edge CLI strips --export / --export-dir from sys.argv (NVFlare's convention).
from devsim_flare.edge.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
