"""Resident memory of a bare NVFlare Collab echo over many calls, without any of this project's code.

The server sends a 62k-parameter float32 NumPy dict (the small CNN's size; ``--params``) to each of 2
clients per round and the clients echo it back with a probe of their own process. Printed every ``--every``
rounds (and at the last): RSS (MB), live threads (``/proc/self/task``), NVFlare's receive-side
stream tasks still held in memory (``RxTask.rx_task_map``) and the full garbage collections run so far
(``gc2``) of the server and of each client. This
isolates growth that happens in NVFlare's messaging layer from growth in the project's own leaf and
server code (compare with benchmarks/memory_growth.py).

The script launches NVFlare's simulator directly (``SimEnv``), not through this project's
``build_env``, so the runtime defaults of ``devsim_flare.recipe.apply_runtime_env_defaults`` apply
only with ``--project-defaults``; without it the environment is used as given, which makes it the
place to compare settings:

    .venv/bin/python benchmarks/collab_echo_memory.py --rounds 500
    .venv/bin/python benchmarks/collab_echo_memory.py --rounds 500 --project-defaults
    NVFLARE_STREAMING_RETRY_TIMEOUT=2 .venv/bin/python benchmarks/collab_echo_memory.py --rounds 500
    .venv/bin/python benchmarks/collab_echo_memory.py --rounds 30 --every 10 --params 11200000  # 45 MB each way
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time

import numpy as np
from nvflare.collab import collab

PARAMS = 62006
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

    def __init__(self, rounds: int = 500, every: int = 50, params: int = PARAMS):
        self.rounds = rounds
        self.every = every
        self.params = params

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
                clients = "".join(f"  {fmt(r[1]):<36}" for r in replies)
                print(f"{round_num:>6} {time.monotonic() - started:>7.1f}  {fmt(probe()):<36}{clients}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=500)
    parser.add_argument("--every", type=int, default=50, help="print a probe every N rounds")
    parser.add_argument("--params", type=int, default=PARAMS, help="float32 parameters sent each way per call")
    parser.add_argument(
        "--project-defaults",
        action="store_true",
        help="apply devsim_flare.recipe.apply_runtime_env_defaults() before launching",
    )
    args = parser.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from nvflare.collab import CollabRecipe
    from nvflare.recipe import SimEnv

    from devsim_flare.recipe import RUNTIME_ENV_DEFAULTS, apply_runtime_env_defaults, console_log_config

    if args.project_defaults:
        apply_runtime_env_defaults()
    watched = [*RUNTIME_ENV_DEFAULTS, *MORE_WATCHED_ENV]
    print("environment: " + ", ".join(f"{k}={os.environ.get(k, '(unset)')}" for k in watched), flush=True)
    with tempfile.TemporaryDirectory(prefix="devsim-echo-") as workspace:
        recipe = CollabRecipe(
            job_name="collab_echo",
            server=EchoServer(rounds=args.rounds, every=args.every, params=args.params),
            client=EchoClient(),
            min_clients=2,
        )
        env = SimEnv(num_clients=2, workspace_root=workspace, log_config=console_log_config("WARNING", workspace))
        recipe.execute(env)


if __name__ == "__main__":
    main()
