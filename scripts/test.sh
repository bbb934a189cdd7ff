#!/usr/bin/env bash
# The test suite, including the slow multi-process (POC) tests. Extra arguments go to pytest.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/bootstrap.sh"
cd "$root"
exec "${DEVSIM_VENV:-$root/.venv}/bin/python" -m pytest "$@"
