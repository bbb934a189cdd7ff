#!/usr/bin/env bash
# The repeatable GPU run (issue #19), in two steps on two machines:
#
#   scripts/gpu_suite.sh fetch   # here (network to package registries): wheels into the git-ignored .whl/
#   scripts/gpu_suite.sh run     # on the GPU machine (torch installed, no network): install them, run the suite
#
# With the session's `device` tool the second step is one call, carrying .whl:
#   run(command="bash scripts/gpu_suite.sh run", carry=[".whl"])
# The figures land in $OUT/gpu_suite.json (or benchmarks/results/gpu_suite.json without $OUT);
# commit them under benchmarks/results/. Extra arguments of `run` go to benchmarks/gpu_suite.py,
# e.g. `scripts/gpu_suite.sh run --sections throughput,worker_sweep`. By default `run` takes the
# sections of the GPU issue in order of importance within a 360 s budget (--budget; a section starts
# only while half its own budget is left), writes the figures after each section and ends with
# `check`: every target of the issue beside its figure. `scripts/gpu_suite.sh check FILE` prints
# that table again for any suite JSON.
#
# The wheels are nvflare 2.9.0 and its dependencies plus numpy and psutil, for CPython 3.12 on
# x86-64 Linux, never torch (the GPU machine has its own CUDA build): about 45 MB, under the
# device tool's 64 MiB carry limit. scikit-learn and SciPy would not fit, so fetch also writes the
# real digits with their fixed split to .whl/digits.npz, which run points DEVSIM_DIGITS_FILE at when
# the GPU machine has no scikit-learn. On that machine `pip` and `python3` are different
# interpreters, so everything goes through `python3 -m pip`.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
wheels="$root/.whl"
target_python="${GPU_PYTHON_VERSION:-3.12}"

fetch() {
  local python="${DEVSIM_VENV:-$root/.venv}/bin/python"
  [ -x "$python" ] || python="python3"
  mkdir -p "$wheels"
  "$python" -m pip download -q -d "$wheels" --only-binary=:all: --python-version "$target_python" \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
    --platform any "nvflare==2.9.0" numpy psutil
  # the real digits for the async section, in case the GPU machine has no scikit-learn (~50 KB)
  (cd "$root" && "$python" -c "from devsim.data.digits import export_digits; export_digits('$wheels/digits.npz')")
  if ls "$wheels" | grep -qiE '^(torch|nvidia_|triton)'; then
    echo "[gpu_suite] error: a torch wheel reached $wheels; remove it (the GPU machine brings its own)" >&2
    exit 1
  fi
  echo "[gpu_suite] $(ls "$wheels" | wc -l) wheels, $(du -sh "$wheels" | cut -f1) in $wheels" >&2
}

run() {
  local python="${GPU_SUITE_PYTHON:-python3}"
  if ! "$python" -c "import nvflare" >/dev/null 2>&1; then
    [ -d "$wheels" ] || { echo "[gpu_suite] error: $wheels missing; run 'scripts/gpu_suite.sh fetch' first and carry .whl" >&2; exit 1; }
    echo "[gpu_suite] installing nvflare 2.9.0 offline from $wheels" >&2
    "$python" -m pip install -q --no-index --find-links "$wheels" "nvflare==2.9.0" numpy psutil
  fi
  if ! "$python" -c "import sklearn" >/dev/null 2>&1 && [ -f "$wheels/digits.npz" ]; then
    echo "[gpu_suite] no scikit-learn here: --dataset digits reads $wheels/digits.npz" >&2
    export DEVSIM_DIGITS_FILE="$wheels/digits.npz"
  fi
  "$python" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device visible'; print('[gpu_suite]', torch.cuda.get_device_name(0), 'torch', torch.__version__, 'cuda', torch.version.cuda)"
  local out="${OUT:-$root/benchmarks/results}/gpu_suite.json"
  cd "$root"
  local rc=0
  "$python" benchmarks/gpu_suite.py --device cuda --out "$out" "$@" || rc=$?
  [ -f "$out" ] && "$python" benchmarks/gpu_suite.py check "$out"
  return "$rc"
}

check() {
  local python="${DEVSIM_VENV:-$root/.venv}/bin/python"
  [ -x "$python" ] || python="python3"
  cd "$root"
  exec "$python" benchmarks/gpu_suite.py check "${1:-benchmarks/results/gpu_suite.json}"
}

case "${1:-}" in
  fetch) shift; fetch "$@" ;;
  run) shift; run "$@" ;;
  check) shift; check "$@" ;;
  *) echo "usage: scripts/gpu_suite.sh fetch | run [benchmarks/gpu_suite.py arguments] | check [FILE]" >&2; exit 2 ;;
esac
