"""Resident memory of a bare NVFlare Collab echo over many calls, without any of this project's code.

The server sends a 62k-parameter float32 NumPy dict (the small CNN's size; ``--params``) to each of 2 clients per
round and the clients echo it back with a probe of their own process. Printed every ``--every`` rounds: RSS (MB),
live threads, NVFlare's receive-side stream tasks still held (``RxTask.rx_task_map``) and the full garbage
collections so far, of the server and each client: growth in NVFlare's messaging layer apart from the project's
code (compare ``benchmarks/memory_growth.py``). It launches ``SimEnv`` directly, so the project's runtime defaults
apply only with ``--project-defaults``; otherwise the environment is used as given.

``--compare`` runs the echo once per setting as a child process (``harness.run_isolated``): ``defaults`` NVFlare's
defaults then ``--project-defaults``; ``chunk`` ``NVFLARE_STREAMING_CHUNK_SIZE`` 1 MiB and 256 KiB, alternated
``--pairs`` times. ``--json`` writes the probes and the comparison's figure (server threads at the last round; s per
round after round 10, 256 KiB over 1 MiB) to ``benchmarks/results/collab_echo_memory[-chunk]-<date>.json``:

    .venv/bin/python benchmarks/collab_echo_memory.py --rounds 500 --compare defaults --json
    .venv/bin/python benchmarks/collab_echo_memory.py --rounds 30 --every 10 --params 11200000 --compare chunk --json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time

import numpy as np
from nvflare.collab import collab

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.harness import Session, arguments, run_isolated  # noqa: E402

PARAMS = 62006
CHUNK_ENV = "NVFLARE_STREAMING_CHUNK_SIZE"
CHUNKS = {"1 MiB": "1048576", "256 KiB": "262144"}
# The settings a comparison's command line names when they are set in its environment.
COMMAND_ENV = (CHUNK_ENV, "NVFLARE_STREAMING_RETRY_TIMEOUT", "NVFLARE_STREAMING_RETRY_WAIT", "MALLOC_ARENA_MAX")
MORE_WATCHED_ENV = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_")


def probe() -> tuple[float, int, int, int]:
    """(RSS in MB, live threads, NVFlare receive tasks held, full garbage collections so far) of this process."""
    rss = float("nan")
    with open("/proc/self/status", encoding="utf-8") as stream:
        for line in stream:
            if line.startswith("VmRSS"):
                rss = int(line.split()[1]) / 1024
                break
    threads = len(os.listdir("/proc/self/task"))
    try:
        from nvflare.fuel.f3.streaming.byte_receiver import RxTask

        held = len(RxTask.rx_task_map)
    except Exception:  # noqa: BLE001 - a diagnostic, absent in other NVFlare versions
        held = -1
    return rss, threads, held, gc.get_stats()[2]["collections"]


def fmt(p) -> str:
    return f"{p[0]:6.1f} MB {p[1]:>4} thr {p[2]:>4} rx {p[3]:>3} gc2"


class EchoClient:
    """Returns what it receives, plus a probe of its own process."""

    def __init__(self, scale: float = 1.0):
        self.scale = scale

    @collab.publish
    def echo(self, round_num: int, weights: dict) -> tuple[dict, tuple]:
        return {k: v * self.scale for k, v in weights.items()}, probe()


class EchoServer:
    """Calls every client once per round and prints probes every ``every`` rounds."""

    def __init__(self, rounds: int = 500, every: int = 50, params: int = PARAMS, probes_file: str = ""):
        self.rounds = rounds
        self.every = every
        self.params = params
        self.probes_file = probes_file

    @collab.main
    def run(self) -> None:
        weights = {f"w{i}": np.ones(self.params // 8, np.float32) for i in range(8)}
        marks = {10, self.rounds} | set(range(self.every, self.rounds + 1, self.every))
        names = sorted(c.name for c in collab.clients)
        started = time.monotonic()
        print(f"{'round':>6} {'s':>7}  {'server':<36}" + "".join(f"  {n:<36}" for n in names), flush=True)
        for round_num in range(1, self.rounds + 1):
            replies = [
                reply
                for name in names
                for _, reply in collab.get_clients([name])(timeout=60).echo(round_num=round_num, weights=weights)
            ]
            if round_num in marks:
                seconds, server = time.monotonic() - started, probe()
                clients = "".join(f"  {fmt(r[1]):<36}" for r in replies)
                print(f"{round_num:>6} {seconds:>7.1f}  {fmt(server):<36}{clients}", flush=True)
                if self.probes_file:
                    mark = {"round": round_num, "s": seconds, "server": server}
                    mark["clients"] = {name: list(r[1]) for name, r in zip(names, replies, strict=True)}
                    with open(self.probes_file, "a", encoding="utf-8") as stream:
                        stream.write(json.dumps(mark) + "\n")


def read_probes(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as stream:
        return [json.loads(line) for line in stream if line.strip()]


def run_child(args: argparse.Namespace, label: str, flags: list[str], env: dict[str, str]) -> dict:
    """One echo run as a child process of this script, isolated; its probes, wall and exit status."""
    with tempfile.TemporaryDirectory(prefix="devsim-echo-compare-") as workdir:
        probes_file = os.path.join(workdir, "probes.jsonl")
        cmd = [sys.executable, os.path.abspath(__file__), "--rounds", str(args.rounds), "--every", str(args.every)]
        cmd += ["--params", str(args.params), "--probes-file", probes_file, *flags]
        rc, wall, tail = run_isolated(cmd, workdir, args.timeout, log_name="echo.log", env=env)
        probes = read_probes(probes_file)
    status = "timed out" if rc is None else f"exit {rc}"
    print(f"[{label}] {status} after {wall:.1f} s wall; log tail:\n{tail[-2500:]}", flush=True)
    return {"setting": label, "flags": flags, "env": env, "status": status, "wall": wall, "probes": probes}


def per_round(run: dict) -> float | None:
    """Seconds per round after the round-10 probe (None without two probes)."""
    probes = [p for p in run["probes"] if p["round"] >= 10]
    if len(probes) < 2 or probes[-1]["round"] == probes[0]["round"]:
        return None
    return (probes[-1]["s"] - probes[0]["s"]) / (probes[-1]["round"] - probes[0]["round"])


def compare(args: argparse.Namespace) -> list[dict]:
    """Every run of ``--compare``, in the order run."""
    if args.compare == "defaults":
        settings = [("NVFlare defaults", [], {}), ("project defaults", ["--project-defaults"], {})]
    else:
        extra = ["--project-defaults"] if args.project_defaults else []
        settings = [(chunk, extra, {CHUNK_ENV: size}) for chunk, size in CHUNKS.items()] * args.pairs
    return [run_child(args, label, flags, env) for label, flags, env in settings]


def figures(args: argparse.Namespace, runs: list[dict], session) -> list[dict[str, str]]:
    """The comparison's figure: server threads at the last round, or the 256 KiB chunk's cost per round."""
    if any(run["status"] != "exit 0" or not run["probes"] for run in runs):
        return []
    if args.compare == "defaults":
        threads = [run["probes"][-1]["server"][1] for run in runs]
        name = f"Collab echo server threads after {args.rounds} rounds, NVFlare defaults / project defaults"
        value = " / ".join(f"{t:,}" for t in threads)
        target = "bounded"
    else:
        seconds = {chunk: [per_round(run) for run in runs if run["setting"] == chunk] for chunk in CHUNKS}
        if any(s is None for values in seconds.values() for s in values):
            return []
        small, large = statistics.mean(seconds["256 KiB"]), statistics.mean(seconds["1 MiB"])
        name = f"streaming chunk 256 KiB vs 1 MiB, {4 * args.params / 1e6:.0f} MB payloads"
        value = f"{100 * (small / large - 1):+.0f}% per round"
        target = "documented cost"
    return [session.figure(name, value, target)]


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--rounds", type=int, default=500)
    parser.add_argument("--every", type=int, default=50, help="print a probe every N rounds")
    parser.add_argument("--params", type=int, default=PARAMS, help="float32 parameters sent each way per call")
    parser.add_argument("--project-defaults", action="store_true", help="the project's runtime defaults")
    parser.add_argument("--compare", choices=("none", "defaults", "chunk"), default="none", help="settings to compare")
    parser.add_argument("--pairs", type=int, default=1, help="--compare chunk: alternations of the two chunk sizes")
    parser.add_argument("--timeout", type=float, default=3600.0, help="--compare: seconds per run before it is killed")
    parser.add_argument("--probes-file", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    name = "collab_echo_memory" if args.compare in ("none", "defaults") else f"collab_echo_memory-{args.compare}"
    session = Session(name, env=(*COMMAND_ENV, *MORE_WATCHED_ENV))
    if args.compare != "none":
        runs = compare(args)
        for run in runs:
            last = run["probes"][-1] if run["probes"] else None
            seconds = per_round(run)
            print(
                f"{run['setting']:<18} {run['status']:<10} last probe: "
                + (f"round {last['round']}, server {fmt(last['server'])}" if last else "none")
                + (f", {seconds:.3f} s per round after round 10" if seconds is not None else "")
            )
    else:
        with tempfile.TemporaryDirectory(prefix="devsim-echo-probes-") as folder:
            probes_file = args.probes_file or os.path.join(folder, "probes.jsonl")
            echo(args, probes_file)
            runs = [{"setting": "this run", "status": "exit 0", "probes": read_probes(probes_file)}]
    if args.json:
        published = figures(args, runs, session) if args.compare != "none" else []
        session.write({"settings": vars(args), "runs": runs}, published)


def echo(args: argparse.Namespace, probes_file: str) -> None:
    """One Collab echo in NVFlare's simulator (a temporary workspace), probes appended to ``probes_file``."""
    from nvflare.collab import CollabRecipe
    from nvflare.recipe import SimEnv

    from devsim_flare.recipe import RUNTIME_ENV_DEFAULTS, apply_runtime_env_defaults, console_log_config

    if args.project_defaults:
        apply_runtime_env_defaults()
    watched = [*RUNTIME_ENV_DEFAULTS, *MORE_WATCHED_ENV]
    print("environment: " + ", ".join(f"{k}={os.environ.get(k, '(unset)')}" for k in watched), flush=True)
    with tempfile.TemporaryDirectory(prefix="devsim-echo-") as workspace:
        server = EchoServer(rounds=args.rounds, every=args.every, params=args.params, probes_file=probes_file)
        recipe = CollabRecipe(job_name="collab_echo", server=server, client=EchoClient(), min_clients=2)
        env = SimEnv(num_clients=2, workspace_root=workspace, log_config=console_log_config("WARNING", workspace))
        recipe.execute(env)


if __name__ == "__main__":
    main()
