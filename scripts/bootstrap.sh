#!/usr/bin/env bash
# Create and fill the project's virtual environment (.venv) when it is missing or stale.
# torch is pinned first (2.13.0) so that pip never pulls a multi-GB CUDA build as a side effect
# of an unpinned dependency; on a GPU machine the same pin is a normal CUDA release.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="${DEVSIM_VENV:-$root/.venv}"
python="${PYTHON:-python3}"

if [ ! -x "$venv/bin/python" ]; then
  echo "[bootstrap] creating virtual environment $venv" >&2
  "$python" -m venv "$venv"
fi
if ! "$venv/bin/python" -c "import torch" >/dev/null 2>&1; then
  echo "[bootstrap] installing torch==2.13.0" >&2
  "$venv/bin/python" -m pip install -qq "torch==2.13.0"
fi
stamp="$venv/.devsim-install-stamp"
want="$(cat "$root/pyproject.toml" | sha256sum | cut -d' ' -f1)"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "[bootstrap] installing the project and its dependencies" >&2
  "$venv/bin/python" -m pip install -qq -e "$root[dev]"
  echo "$want" > "$stamp"
fi
