#!/usr/bin/env bash
# The test suite, including the slow multi-process (POC) tests. Extra arguments go to pytest.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$root/scripts/bootstrap.sh"
cd "$root"
# Test modules run on parallel workers (pytest-xdist; tests/conftest.py makes a module one unit of work): most of a
# job test's time is NVFlare waiting, so two workers keep two cores busy. DEVSIM_TEST_WORKERS sets the count
# (0: one process); the default is the usable cores, from 2 to 4.
workers="${DEVSIM_TEST_WORKERS:-$(python3 -c 'import os; print(min(4, max(2, len(os.sched_getaffinity(0)))))')}"
exec "${DEVSIM_VENV:-$root/.venv}/bin/python" -m pytest -n "$workers" --dist loadscope "$@"
