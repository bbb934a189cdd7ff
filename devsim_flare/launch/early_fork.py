"""The fork servers of a cold job command forked as early as it can: right after PyTorch's import.

:func:`devsim_flare.launch.fork_server.start_fork_server` forks them once the command has read its flags, after all
of its imports (NVFlare's job API, this project's modules): 1.3 s on the 2-core CPU, 4.8 s on the H200 host. Only
then did the leaves' fork server start importing ``torch._dynamo`` (0.9 s here, alone), and a leaf asked for before
that import ended waited for it: on this CPU the leaves were started 0.6 s after the simulator's server process
although it asked for them after 0.4 s. :func:`fork_early`, called by a job script once no warm parent took the
command, imports PyTorch and NumPy (what every simulator process shares with the command) and forks both fork
servers at once, when the command line may run a simulation here and the host has :data:`MIN_CORES` cores; they
import while the command imports the rest and checks the run. :func:`devsim_flare.cli.run_job` takes them
(:func:`take_early`) or, when the run turns out not to be a simulation here, closes them. A command that ends
before (``--help``, a refused flag) ends them by ending: a fork server stops when its command's end of the pipe
closes.
"""

from __future__ import annotations

import os
import threading

from devsim_flare.launch.fork_server import ForkServer, fork_servers
from devsim_flare.launch.forked_process import fork_server_enabled
from devsim_flare.launch.warm_parent import CHILD_ENV

MIN_CORES = 4
"""Usable cores from which the fork servers are forked early: the command and each fork server import on a core of
its own. On the 2-core CPU the three shared two cores: the command's own imports took 1.5-1.6 s instead of 1.3 s,
and command -> first round was 3.0-3.4 s against 3.0-3.1 s (2026-11-28), so there they are forked as before."""

SWITCH_ENV = "DEVSIM_EARLY_FORK"
"""``0``: never fork early; ``1``: fork early whatever the cores; unset: from :data:`MIN_CORES` usable cores."""

NOT_HERE = ("--export", "--check", "--help", "-h")
"""Flags with which the command never runs a simulation from fork servers."""

_early: list[ForkServer] = []


def simulates_here(argv: list[str]) -> bool:
    """Whether a job command line may run NVFlare's simulator here: no ``--env`` other than ``sim`` and none of
    :data:`NOT_HERE` (a wrong guess costs only the fork servers' imports on other cores)."""
    for index, item in enumerate(argv):
        name, _, value = item.partition("=")
        if name in NOT_HERE:
            return False
        if name == "--env":
            value = value or (argv[index + 1] if index + 1 < len(argv) else "")
            if value != "sim":
                return False
    return True


def fork_early(argv: list[str]) -> ForkServer | None:
    """Import PyTorch and fork the simulator's fork servers now, when ``argv`` (the command's flags) may run a
    simulation here, fork servers are on (``DEVSIM_FORK_SERVER``), no warm parent forked this command, this process
    runs no other thread and can fork, and it may run on :data:`MIN_CORES` cores (:data:`SWITCH_ENV` turns that
    rule off or on); the fork servers, kept for :func:`take_early`, or None."""
    if _early or os.environ.get(CHILD_ENV) or not simulates_here(argv) or not fork_server_enabled():
        return None  # in a command a warm parent forked, everything is imported: forking now gains nothing
    switch = os.environ.get(SWITCH_ENV, "").strip()
    if switch == "0":
        return None
    if switch != "1":
        from devsim.resources.workers import usable_cpu_cores  # imports PyTorch: after the warm parent's turn

        if usable_cpu_cores() < MIN_CORES:
            return None
    if threading.active_count() > 1 or not hasattr(os, "fork"):
        return None
    import numpy  # noqa: F401  (what the fork servers' children share with this command)
    import torch  # noqa: F401

    _early.append(fork_servers())
    return _early[0]


def take_early() -> ForkServer | None:
    """The fork servers :func:`fork_early` forked, handed over once (None: none)."""
    return _early.pop() if _early else None
