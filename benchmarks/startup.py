"""Where a short run's start-up goes, with and without this project's start-up cuts, measured side by side.

Runs the job ``--runs`` times per arm, the arms in turn (``harness.alternate``), each arm in its own temporary
workspace and cache folder after one uncounted warm-up run (the shared digits file, the cached dataset splits, the
probe's verdict and the warm parent, as a user's first run leaves them; every warm parent is stopped at the end).
Jobs (``--job``): ``default`` (``jobs/pt_job_fedavg.py`` as it is: synthetic images), ``digits`` (the demo),
``penguins`` (``examples/penguins_task.py``, FedAvg, 20 rounds), ``fedbuff`` (``jobs/pt_job_fedbuff.py
--dataset digits``), ``api`` (the penguins run from a script through the Python API, ``benchmarks/tasks/api_run.py``;
``spawned`` is then the API without fork servers). Arms (``--arms``): ``project`` (this checkout), ``cold``
(``DEVSIM_WARM=0``: no warm parent, every command imports PyTorch and NVFlare itself), ``spawned``
(``DEVSIM_FORK_SERVER=0``), ``probe-off``
(``DEVSIM_CACHE_DIR=off``: no cache folder, so no warm parent either), ``nvflare-waits``
(``DEVSIM_RUNTIME_ENV_DEFAULTS=0``: NVFlare's polls, sleeps and streaming defaults kept), and ``baseline``
(``--baseline-commit REV``: the job from a temporary worktree, in the environment of ``--baseline-arm``).

Prints per arm the medians (seconds) of results.json's ``startup`` stages and of the command's wall, each arm's
command -> first round against ``project``'s, and every run's final metrics (the same in every arm); ``cpu_s`` is the
whole run's CPU seconds (comparable on a loaded machine where walls are not; a run that a warm parent forked
descends from the warm parent, so its ``cpu_s`` is the waiting command's alone). ``--json`` writes
``benchmarks/results/startup[-<job>]-<date>.json`` with the figure:

    .venv/bin/python benchmarks/startup.py --job digits --runs 5 --arms project,cold --baseline-commit REV --json
"""

from __future__ import annotations

import functools
import json
import os
import resource
import shlex
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.harness import (  # noqa: E402
    REPO,
    Session,
    alternate,
    arguments,
    baseline,
    items,
    print_table,
    read_results,
    run_command,
)
from benchmarks.tasks.api_run import PENGUINS  # noqa: E402
from benchmarks.tasks.api_run import SETTINGS as PENGUINS_SETTINGS  # noqa: E402
from devsim_flare.launch.warm_parent import stop_parents  # noqa: E402

PYTHON = os.path.join(REPO, ".venv", "bin", "python")
JOBS = {
    "default": ["jobs/pt_job_fedavg.py"],  # synthetic images, CNN: what the GPU suite's fedavg_e2e starts
    "digits": ["jobs/pt_job_fedavg.py", "--dataset", "digits"],
    "penguins": [
        *("jobs/pt_job_fedavg.py", "--task", PENGUINS),
        *(item for key, value in PENGUINS_SETTINGS.items() for item in (f"--{key.replace('_', '-')}", str(value))),
    ],
    "fedbuff": ["jobs/pt_job_fedbuff.py", "--dataset", "digits"],
    "api": ["benchmarks/tasks/api_run.py"],  # the penguins run through recipe.execute()
}
ARMS = {
    "project": {},
    "cold": {"DEVSIM_WARM": "0"},
    "spawned": {"DEVSIM_FORK_SERVER": "0"},
    "probe-off": {"DEVSIM_CACHE_DIR": "off"},
    "nvflare-waits": {"DEVSIM_RUNTIME_ENV_DEFAULTS": "0"},
}
"""Arm -> the environment variables it sets (over the caller's, without those any arm sets)."""
STAGES = ("command_to_server_process", "server_process_to_run", "run_to_ready")
STAGES += ("command_to_first_round", "last_round_to_exit")
FIGURE = "{job} start-up: command -> first round / last round -> exit"
LABELS = {
    "default": "default job (synthetic images, CNN)",
    "digits": "digits demo",
    "penguins": "tabular task (penguins)",
    "fedbuff": "digits FedBuff",
    "api": "Python API (penguins, recipe.execute())",
}
TARGET = "<= 5 s / <= 1 s"
RUN_TIMEOUT_S = 300.0


def run_once(tree: str, workspace: str, env: dict[str, str], job: list[str]) -> dict[str, float]:
    """One run of ``job`` from ``tree`` in ``workspace``: its start-up stages (seconds), its wall ``command_s``, the
    CPU seconds (user + system) of the command and the processes under it that were reaped (``cpu_s``: the whole
    run, less load-sensitive than the wall; a process that outlived its parent is not counted) and its final
    metrics (``final``: loss and metrics as one string)."""
    output = os.path.join(workspace, "run")
    cmd = [PYTHON, *job, "--workspace", workspace, "--output-dir", output]
    env = {**env, "DEVSIM_COMMAND_STARTED": repr(time.time())}
    env.setdefault("DEVSIM_CACHE_DIR", os.path.join(workspace, "cache"))
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall, _ = run_command(cmd, RUN_TIMEOUT_S, env, cwd=tree, name=f"{shlex.join(cmd)} (in {tree})")
    cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = sum(getattr(cpu_after, f) - getattr(cpu_before, f) for f in ("ru_utime", "ru_stime"))
    results = read_results(output)
    seconds = results["startup"]["seconds"]
    summary = results.get("summary") or {}
    final = f"loss {summary.get('final_loss')} {json.dumps(summary.get('final_metrics'), sort_keys=True)}"
    return {**{stage: float(seconds[stage]) for stage in STAGES}, "command_s": wall, "cpu_s": cpu, "final": final}


def arms(
    names: list[str], baseline_tree: str | None, baseline_arm: str = "project"
) -> dict[str, tuple[str, dict[str, str]]]:
    """Arm name -> (checkout to run the job from, environment); the baseline runs with ``baseline_arm``'s."""
    set_by_arms = {name for values in ARMS.values() for name in values} | {"DEVSIM_DIGITS_FILE"}
    base = {k: v for k, v in os.environ.items() if k not in set_by_arms}
    chosen = {name: (REPO, {**base, **ARMS[name]}) for name in names}
    if baseline_tree:
        chosen["baseline"] = (os.path.abspath(baseline_tree), {**base, **ARMS[baseline_arm]})
    return chosen


def measure(chosen: dict[str, tuple[str, dict[str, str]]], job: list[str], runs: int) -> dict[str, list[dict]]:
    """``runs`` runs of ``job`` per arm, the arms in turn, after one uncounted warm-up run each (the shared digits
    file, the probe's verdict): arm -> its runs' stages."""

    def done(index: int, name: str, sample: dict) -> None:
        print(f"run {index + 1}/{runs} {name}: {sample['command_to_first_round']:.1f} s to the first round")

    with tempfile.TemporaryDirectory(prefix="devsim-startup-") as root:
        chosen_runs = {
            name: functools.partial(run_once, tree, os.path.join(root, name), env, job)
            for name, (tree, env) in chosen.items()
        }
        try:
            for run in chosen_runs.values():
                run()
            return alternate(chosen_runs, runs, done)
        finally:
            for name in chosen_runs:
                stop_parents({"DEVSIM_CACHE_DIR": os.path.join(root, name, "cache")})


def main() -> int:
    parser = arguments(__doc__)
    parser.add_argument("--job", choices=sorted(JOBS), default="digits", help="the run to start (default digits)")
    parser.add_argument("--runs", type=int, default=5, help="counted runs per arm (default 5)")
    parser.add_argument("--arms", default="project,cold", help=f"comma-separated, of {', '.join(ARMS)}")
    parser.add_argument("--baseline-commit", help="a commit whose job script (in a temporary worktree) is one more arm")
    parser.add_argument("--baseline-arm", choices=tuple(ARMS), default="project", help="the baseline's environment")
    args = parser.parse_args()
    if args.runs < 1:
        parser.error(f"--runs: must be >= 1, got {args.runs}")
    names = items(parser, "--arms", args.arms, allowed=tuple(ARMS))
    if "project" not in names:
        parser.error(f"--arms: {args.arms} lacks project; allowed: 'project' and any of {', '.join(ARMS)}")
    job = JOBS[args.job]
    session = Session("startup" if args.job == "digits" else f"startup-{args.job}")
    with baseline(parser, args.baseline_commit) as (base_commit, baseline_tree):
        if baseline_tree and not os.path.isfile(os.path.join(baseline_tree, job[0])):
            parser.error(f"--baseline-commit: {base_commit} has no {job[0]}")
        chosen = arms(names, baseline_tree, args.baseline_arm)
        samples = measure(chosen, job, args.runs)
    numbers = (*STAGES, "command_s", "cpu_s")
    medians = {name: {k: statistics.median(s[k] for s in runs) for k in numbers} for name, runs in samples.items()}
    print(f"\n{args.job}, {session.where()}; medians, seconds:")
    print_table(["arm", *numbers], [[name, *(f"{row[k]:.2f}" for k in numbers)] for name, row in medians.items()])
    project = medians["project"]["command_to_first_round"]
    for name, row in medians.items():
        if name != "project":
            print(f"command -> first round: project / {name} = {project / row['command_to_first_round']:.2f}x")
    finals = {name: sorted({s["final"] for s in runs}) for name, runs in samples.items()}
    for name, seen in finals.items():
        print(f"final metrics, {name}: {' | '.join(seen)}")
    if args.json:
        p = medians["project"]
        others = "; ".join(
            f"{name}{f' ({base_commit})' if name == 'baseline' else ''}: "
            f"{row['command_to_first_round']:.1f} s / {row['last_round_to_exit']:.1f} s"
            for name, row in medians.items()
            if name != "project"
        )
        first, exit_s = p["command_to_first_round"], p["last_round_to_exit"]
        value = f"{first:.1f} s / {exit_s:.1f} s, whole command {p['command_s']:.1f} s (median of {args.runs}; "
        figures = [session.figure(FIGURE.format(job=LABELS[args.job]), value + f"{others})", TARGET)]
        env = {name: ARMS.get(args.baseline_arm if name == "baseline" else name, {}) for name in chosen}
        payload = dict(job=job, runs=args.runs, arms=env)
        payload.update(baseline_commit=base_commit, samples=samples, medians=medians, final_metrics=finals)
        session.write(payload, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
