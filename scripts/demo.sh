#!/usr/bin/env bash
# Offline demo: hierarchical FedAvg on the synthetic image set in NVFlare's simulator.
# Extra arguments go to jobs/pt_job_fedavg.py (see --help).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/bootstrap.sh"
cd "$root"
exec "${DEVSIM_VENV:-$root/.venv}/bin/python" jobs/pt_job_fedavg.py "$@"
