"""Where the digits demo's start-up goes, with and without this project's start-up cuts, measured side by side.

    .venv/bin/python benchmarks/startup.py [--runs 4] [--baseline-commit REV] [--json]

Runs the digits demo (``jobs/pt_job_fedavg.py --dataset digits``) ``--runs`` times per arm, the arms in turn
(A B A B ...), each arm in its own temporary workspace after one uncounted warm-up run (which writes the
workspace's shared digits file, as a user's first run does). Arms:

- ``project``: this checkout with its defaults;
- ``nvflare-waits``: this checkout with ``DEVSIM_RUNTIME_ENV_DEFAULTS=0``, so NVFlare's simulator keeps its
  one-second polls (and NVFlare's streaming and glibc defaults);
- ``baseline`` (with ``--baseline-commit REV``): the same job script from a temporary git worktree of ``REV``, run
  with this checkout's virtual environment.

Prints, per arm, the medians of the stages in results.json ``startup`` (command -> server process, server
process -> run, run -> ready, command -> first round, last round -> exit) and of the command's wall, and each
arm's command -> first round against ``project``'s. ``--json`` writes ``benchmarks/results/startup-<date>.json``
with the figure of benchmarks/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.harness import REPO, Session, alternate, commit_of, worktree  # noqa: E402

PYTHON = os.path.join(REPO, ".venv", "bin", "python")
JOB = ["jobs/pt_job_fedavg.py", "--dataset", "digits"]
STAGES = (
    "command_to_server_process",
    "server_process_to_run",
    "run_to_ready",
    "command_to_first_round",
    "last_round_to_exit",
)
FIGURE = "digits demo start-up: command -> first round / last round -> exit"
TARGET = "<= 8 s / <= 2 s"
RUN_TIMEOUT_S = 300.0


def run_once(tree: str, workspace: str, env: dict[str, str]) -> dict[str, float]:
    """One demo run from ``tree`` in ``workspace``: its start-up stages (seconds) and its wall ``command_s``."""
    output = os.path.join(workspace, "run")
    cmd = [PYTHON, *JOB, "--workspace", workspace, "--output-dir", output]
    env = {**env, "DEVSIM_COMMAND_STARTED": repr(time.time())}
    started = time.perf_counter()
    proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} (in {tree}) exited {proc.returncode}:\n{proc.stdout[-2000:]}{proc.stderr}")
    with open(os.path.join(output, "results.json"), encoding="utf-8") as stream:
        seconds = json.load(stream)["startup"]["seconds"]
    return {**{stage: float(seconds[stage]) for stage in STAGES}, "command_s": wall}


def arms(baseline_tree: str | None) -> dict[str, tuple[str, dict[str, str]]]:
    """Arm name -> (checkout to run the job from, environment)."""
    base = {k: v for k, v in os.environ.items() if k not in ("DEVSIM_RUNTIME_ENV_DEFAULTS", "DEVSIM_DIGITS_FILE")}
    chosen = {"project": (REPO, base), "nvflare-waits": (REPO, {**base, "DEVSIM_RUNTIME_ENV_DEFAULTS": "0"})}
    if baseline_tree:
        chosen["baseline"] = (os.path.abspath(baseline_tree), base)
    return chosen


def measure(chosen: dict[str, tuple[str, dict[str, str]]], runs: int) -> dict[str, list[dict[str, float]]]:
    """``runs`` demo runs per arm, the arms in turn, after one warm-up run each: arm -> its runs' stages."""

    def done(index: int, name: str, sample: dict[str, float]) -> None:
        print(f"run {index + 1}/{runs} {name}: {sample['command_to_first_round']:.1f} s to the first round", flush=True)

    with tempfile.TemporaryDirectory(prefix="devsim-startup-") as root:
        arms = {
            name: functools.partial(run_once, tree, os.path.join(root, name), env)
            for name, (tree, env) in chosen.items()
        }
        for arm in arms.values():
            arm()  # warm-up: writes the workspace's shared digits file
        return alternate(arms, runs, done)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=4, help="counted runs per arm (default 4)")
    parser.add_argument("--baseline-commit", help="a commit whose job script (in a temporary worktree) is a third arm")
    parser.add_argument("--json", action="store_true", help="write benchmarks/results/startup-<date>.json")
    args = parser.parse_args()
    if args.runs < 1:
        parser.error(f"--runs: must be >= 1, got {args.runs}")
    base_commit = commit_of(args.baseline_commit) if args.baseline_commit else None
    if args.baseline_commit and base_commit is None:
        parser.error(f"--baseline-commit: {args.baseline_commit!r} names no commit of this repository")
    session = Session("startup")
    with contextlib.ExitStack() as stack:
        tree = stack.enter_context(worktree(base_commit)) if base_commit else None
        samples = measure(arms(tree), args.runs)
    medians = {name: {k: statistics.median(s[k] for s in runs) for k in runs[0]} for name, runs in samples.items()}
    print(f"\n{'arm':<14}" + "".join(f"{k:>27}" for k in (*STAGES, "command_s")))
    for name, row in medians.items():
        print(f"{name:<14}" + "".join(f"{row[k]:>27.2f}" for k in (*STAGES, "command_s")))
    project = medians["project"]["command_to_first_round"]
    for name, row in medians.items():
        if name != "project":
            print(f"command -> first round: project / {name} = {project / row['command_to_first_round']:.2f}x")
    if args.json:
        p = medians["project"]
        others = "; ".join(
            f"{name}{f' ({base_commit})' if name == 'baseline' else ''}: "
            f"{row['command_to_first_round']:.1f} s / {row['last_round_to_exit']:.1f} s"
            for name, row in medians.items()
            if name != "project"
        )
        first, exit_s = p["command_to_first_round"], p["last_round_to_exit"]
        value = f"{first:.1f} s / {exit_s:.1f} s (median of {args.runs}; {others})"
        payload = {
            "runs": args.runs,
            "job": JOB,
            "baseline_commit": base_commit,
            "samples": samples,
            "medians": medians,
        }
        session.write(payload, [session.figure(FIGURE, value, TARGET)])
    return 0


if __name__ == "__main__":
    sys.exit(main())
