#!/usr/bin/env bash
# Offline demo: hierarchical FedAvg on real handwritten digits (scikit-learn's load_digits, shipped in
# its wheel: no download) in NVFlare's simulator. Extra arguments go to jobs/pt_job_fedavg.py (see
# --help); a later --dataset overrides the demo's (e.g. --dataset synthetic).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/bootstrap.sh"
cd "$root"
# the job's start-up breakdown counts from here, not from this script's start (set-up above)
export DEVSIM_COMMAND_STARTED="${DEVSIM_COMMAND_STARTED:-$(date +%s.%N)}"
exec "${DEVSIM_VENV:-$root/.venv}/bin/python" jobs/pt_job_fedavg.py --dataset digits "$@"
