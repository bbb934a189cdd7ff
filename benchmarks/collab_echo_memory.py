"""Resident memory of a bare NVFlare Collab echo over many calls, without any of this project's code.

The server sends a 62k-parameter float32 NumPy dict (the small CNN's size) to each of 2 clients per
round and the clients echo it back with their resident size. Printed: server and client RSS (MB) at
rounds 10, 100, 250 and the last. This isolates growth that happens in NVFlare's messaging layer
from growth in the project's own leaf and server code (compare with benchmarks/memory_growth.py).

    .venv/bin/python benchmarks/collab_echo_memory.py --rounds 500
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

import numpy as np
from nvflare.collab import collab

PARAMS = 62006


def rss_mb() -> float:
    """This process's resident set size in MB."""
    with open("/proc/self/status", encoding="utf-8") as stream:
        for line in stream:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1024
    return float("nan")


class EchoClient:
    """Returns what it receives, plus its own resident size."""

    def __init__(self, scale: float = 1.0):
        self.scale = scale

    @collab.publish
    def echo(self, round_num: int, weights: dict) -> tuple[dict, float]:
        return {k: v * self.scale for k, v in weights.items()}, rss_mb()


class EchoServer:
    """Calls every client once per round and prints resident sizes at a few rounds."""

    def __init__(self, rounds: int = 500):
        self.rounds = rounds

    @collab.main
    def run(self) -> None:
        weights = {f"w{i}": np.ones(PARAMS // 8, np.float32) for i in range(8)}
        marks = {10, 100, 250, self.rounds - 1}
        for round_num in range(self.rounds):
            replies = [
                reply
                for name in sorted(c.name for c in collab.clients)
                for _, reply in collab.get_clients([name])(timeout=60).echo(round_num=round_num, weights=weights)
            ]
            if round_num in marks:
                clients = ", ".join(f"{r[1]:.1f}" for r in replies)
                print(f"round {round_num + 1:>4}: server {rss_mb():.1f} MB, clients {clients} MB", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=500)
    args = parser.parse_args()
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from nvflare.collab import CollabRecipe
    from nvflare.recipe import SimEnv

    from devsim_flare.recipe import console_log_config

    with tempfile.TemporaryDirectory(prefix="devsim-echo-") as workspace:
        recipe = CollabRecipe(
            job_name="collab_echo", server=EchoServer(rounds=args.rounds), client=EchoClient(), min_clients=2
        )
        env = SimEnv(num_clients=2, workspace_root=workspace, log_config=console_log_config("WARNING", workspace))
        recipe.execute(env)


if __name__ == "__main__":
    main()
