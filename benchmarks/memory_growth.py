"""Memory, open files and threads of the server and leaf processes over many sync rounds.

Runs ``jobs/pt_job_fedavg.py`` in NVFlare's simulator for ``--rounds`` rounds (2 leaves x 20 devices, 10 selected
a round, 20 samples a device, evaluation every 50 rounds, no checkpoints) while a sampler thread reads
``/proc/<pid>/status`` (``VmRSS`` in MB, its anonymous and file-backed parts, ``Threads``) and counts
``/proc/<pid>/fd`` of the server and each leaf every ``--interval`` seconds. The simulator runs the server in one
process that spawns one ``simulator_worker --client site-N`` process per leaf (naming its parent with
``--parent_pid``), which is how the roles are found. Round r's figure is the median of the samples taken from
round r-5 to round r+5 (``--window``), so that one round's transient buffers do not stand for the round.

The job runs with the project's runtime defaults (``devsim_flare.recipe.apply_runtime_env_defaults``; printed
first); ``--nvflare-defaults`` turns them off to measure NVFlare's and glibc's own defaults.

Printed: RSS (MB), open fds and threads of each process at round 10, after the first evaluation, at round 200,
halfway and at the last round; the growth in percent between them; the peak; with ``--trajectory N`` every N
rounds. ``--json`` writes the usage and the published figure (the server's RSS growth from round 10 to round 200
and to the last round) to ``benchmarks/results/memory_growth-<date>.json``:

    .venv/bin/python benchmarks/memory_growth.py --rounds 500 --trajectory 100 --json
"""

from __future__ import annotations

import os
import re
import statistics
import sys
import threading
import time
from typing import NamedTuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import harness  # noqa: E402
from benchmarks.harness import arguments, print_table  # noqa: E402
from devsim.population.devices import natural_sort  # noqa: E402
from devsim_flare.recipe import RUNTIME_ENV_DEFAULTS, apply_runtime_env_defaults  # noqa: E402
from devsim_flare.runtime_defaults import RUNTIME_ENV_DEFAULTS_SWITCH  # noqa: E402

ROUND_LINE = re.compile(r"^round (\d+)/(\d+)\b")
CLIENT_ARG = re.compile(r"--client\s+(\S+)")
PARENT_ARG = re.compile(r"--parent_pid\s+(\d+)")


class Usage(NamedTuple):
    """One process at one moment: resident memory (MB) and its anonymous and file-backed parts."""

    rss: float
    fds: int
    threads: int
    anon: float
    file: float


def find_roles(root: int) -> dict[str, int]:
    """Role -> pid for the descendants of ``root``: ``server`` and one ``site-N`` per leaf worker, found by their
    command lines (``simulator_worker --client site-N --parent_pid P``) or, for processes the fork server forked
    (which keep the job command's command line), by the names it gives them (``sim-site-N``, ``sim-simulator``)."""
    import psutil

    roles = {}
    try:
        children = psutil.Process(root).children(recursive=True)
    except psutil.Error:
        return roles
    for child in children:
        try:
            name, cmdline = child.name(), " ".join(child.cmdline())
        except psutil.Error:
            continue
        if name.startswith("sim-site-"):
            roles[name.removeprefix("sim-")] = child.pid
        elif name == "sim-simulator":
            roles["server"] = child.pid
        elif "simulator_worker" in cmdline:
            if client := CLIENT_ARG.search(cmdline):
                roles[client.group(1)] = child.pid
            if (parent := PARENT_ARG.search(cmdline)) and psutil.pid_exists(int(parent.group(1))):
                roles["server"] = int(parent.group(1))
    return roles


def read_usage(pid: int) -> Usage | None:
    """Resident memory, open fds and live threads of ``pid``, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/status", "rb") as stream:
            status = stream.read().decode("utf-8", "replace")
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None

    def field(name: str) -> int:
        match = re.search(rf"^{name}:\s+(\d+)", status, re.MULTILINE)
        return int(match.group(1)) if match else 0

    return Usage(field("VmRSS") / 1024.0, fds, field("Threads"), field("RssAnon") / 1024.0, field("RssFile") / 1024.0)


class Sampler(threading.Thread):
    """Samples (time, {role: Usage}) of the job's server and leaves every ``interval`` s."""

    def __init__(self, root: int, interval: float) -> None:
        super().__init__(daemon=True)
        self.root = root
        self.interval = interval
        self.samples: list[tuple[float, dict[str, Usage]]] = []
        self.pids: dict[str, int] = {}
        self.stop = threading.Event()
        self.started = time.monotonic()

    def run(self) -> None:
        while not self.stop.is_set():
            started = time.monotonic()
            roles = find_roles(self.root)
            for role, pid in roles.items():
                self.pids.setdefault(role, pid)
            usage = {role: u for role, pid in roles.items() if (u := read_usage(pid)) is not None}
            if usage:
                self.samples.append((started, usage))
            self.stop.wait(max(0.0, self.interval - (time.monotonic() - started)))


def run_job(args) -> tuple[Sampler, dict[int, float], float]:
    """Run the sim job under the sampler; returns the sampler, round -> time its line was printed, wall s."""
    flags = [
        *("--num-leaf-nodes", str(args.leaves), "--devices-per-leaf", str(args.devices_per_leaf)),
        *("--device-selection-size", str(args.selected), "--samples-per-device", str(args.samples)),
        *("--num-rounds", str(args.rounds), "--eval-frequency", str(args.eval_frequency)),
        *("--checkpoint-frequency", "0", "--log-every", "1"),
    ]
    env = {RUNTIME_ENV_DEFAULTS_SWITCH: "0"} if args.nvflare_defaults else {}
    effective = dict(os.environ, **env)
    apply_runtime_env_defaults(effective)  # what the job's build_env will do, on a copy
    runtime = {name: effective.get(name, "(unset)") for name in RUNTIME_ENV_DEFAULTS}
    print("runtime environment: " + ", ".join(f"{k}={v}" for k, v in runtime.items()))
    round_times: dict[int, float] = {}
    samplers: list[Sampler] = []

    def on_start(pid: int) -> None:
        samplers.append(Sampler(pid, args.interval))
        samplers[0].start()

    def watch(line: str, _seconds: float) -> None:
        if match := ROUND_LINE.match(line):
            round_times.setdefault(int(match.group(1)), time.monotonic())

    try:
        results = harness.run_job(
            "pt_job_fedavg.py", flags, env=env, timeout=args.timeout, watch=watch, on_start=on_start
        )
    finally:
        for sampler in samplers:
            sampler.stop.set()
            sampler.join()
    return samplers[0], round_times, results["wall"]


def sample_at(samples, when: float) -> tuple[float, dict[str, Usage]] | None:
    """The last sample taken at or before ``when`` (the first one after it when none was)."""
    before = [s for s in samples if s[0] <= when]
    if before:
        return before[-1]
    return samples[0] if samples else None


def window_samples(samples, round_times: dict[int, float], rnd: int, window: int) -> list:
    """Samples taken between the progress lines of rounds ``rnd - window`` and ``rnd + window`` (clamped);
    with ``window`` 0, the last sample taken at or before round ``rnd``'s line."""
    if window <= 0:
        sample = sample_at(samples, round_times[rnd])
        return [sample] if sample else []
    printed = sorted(round_times)
    begin = round_times[max((r for r in printed if r <= max(rnd - window, printed[0])), default=printed[0])]
    end = round_times[min((r for r in printed if r >= min(rnd + window, printed[-1])), default=printed[-1])]
    return [s for s in samples if begin <= s[0] <= end] or ([sample_at(samples, round_times[rnd])] if samples else [])


def median_usage(usages: list[Usage]) -> Usage | None:
    """Field-wise median of ``usages`` (None when empty)."""
    if not usages:
        return None
    return Usage(*(type(values[0])(statistics.median(values)) for values in zip(*usages, strict=True)))


def growth(begin: float, end: float) -> str:
    return f"{100.0 * (end - begin) / begin:+.1f}%" if begin else "-"


def part_rounds(args) -> dict:
    sampler, round_times, wall = run_job(args)
    if not round_times:
        raise SystemExit("no 'round N/M' progress lines were printed")
    last = max(round_times)
    first = min(10, last)
    after_eval = args.eval_frequency + 10
    marks = {first, max(first, last // 2), last} | {r for r in (after_eval, 200) if first < r < last}
    checkpoints = sorted(r for r in marks if r in round_times)
    leaves = natural_sort([role for role in sampler.pids if role != "server"])
    roles = (["server"] if "server" in sampler.pids else []) + leaves
    print(
        f"{args.leaves} leaves x {args.devices_per_leaf} devices, {args.selected} selected per round, "
        f"{args.samples} samples per device, {last} rounds, eval every {args.eval_frequency}, no checkpoints; "
        f"{len(sampler.samples)} samples every {args.interval} s over {wall:.1f} s wall "
        f"({wall / last:.2f} s per round); load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores"
    )
    usage_at: dict[str, dict[int, Usage | None]] = {role: {} for role in roles}
    for rnd in checkpoints:
        window = window_samples(sampler.samples, round_times, rnd, args.window)
        for role in roles:
            usage_at[role][rnd] = median_usage([u[role] for _, u in window if role in u])
    what = f"medians over rounds r-{args.window}..r+{args.window}" if args.window else "last sample before round r"
    print(f"RSS MB (anonymous MB) / open fds / threads, {what}:")
    table = [
        [role, *(f"{u.rss:.1f} ({u.anon:.1f}) / {u.fds} / {u.threads}" if u else "-" for u in usage_at[role].values())]
        for role in roles
    ]
    print_table(["process", *(f"round {r}" for r in checkpoints)], table)
    spans = [(first, r) for r in (200, last) if first < r <= last and r in round_times]
    spans = list(dict.fromkeys(spans + ([(after_eval, last)] if after_eval in checkpoints else [])))
    print("growth: RSS % (anonymous %), open fds and threads from -> to")
    for role in roles:
        parts = [
            f"{b}->{e} {growth(begin.rss, end.rss)} ({growth(begin.anon, end.anon)}), fds {begin.fds}->{end.fds}, "
            f"threads {begin.threads}->{end.threads}"
            for b, e in spans
            if (begin := usage_at[role].get(b)) and (end := usage_at[role].get(e))
        ]
        print(f"  {role:<8}" + "; ".join(parts))
    peak = {
        r: tuple(max((s[1][r][i] for s in sampler.samples if r in s[1]), default=0) for i in range(3)) for r in roles
    }
    print(
        "peak over the run: " + ", ".join(f"{r} {p[0]:.1f} MB / {p[1]} fds / {p[2]} threads" for r, p in peak.items())
    )
    if args.trajectory:
        print(f"RSS MB / open fds / threads every {args.trajectory} rounds (s: seconds since launch):")
        table = []
        for rnd in range(args.trajectory, last + 1, args.trajectory):
            sample = sample_at(sampler.samples, round_times[rnd]) if rnd in round_times else None
            usages = [sample[1].get(role) if sample else None for role in roles]
            when = f"{round_times[rnd] - sampler.started:.1f}" if rnd in round_times else "-"
            table.append([rnd, when, *(f"{u.rss:.1f} / {u.fds} / {u.threads}" if u else "-" for u in usages)])
        print_table(["round", "s", *roles], table)
    usage = {role: {str(rnd): (u._asdict() if u else None) for rnd, u in usage_at[role].items()} for role in roles}
    peaks = {role: dict(zip(("rss", "fds", "threads"), p, strict=True)) for role, p in peak.items()}
    return dict(rounds=last, wall_s=wall, samples=len(sampler.samples), usage=usage, peak=peaks)


def figures(args, rounds: dict, session: harness.Session) -> list[dict[str, str]]:
    """The server's RSS growth from round 10 to round 200 and to the last round (one span when that is 200)."""
    server = rounds["usage"].get("server", {})
    last, first = rounds["rounds"], min(10, rounds["rounds"])
    ends = [r for r in dict.fromkeys((200, last)) if first < r <= last and server.get(str(r))]
    if not server.get(str(first)) or not ends:
        return []
    begin = server[str(first)]["rss"]
    name = f"server RSS growth, rounds {first} -> {' / '.join(str(r) for r in ends)}"
    if args.nvflare_defaults:
        name += " (NVFlare defaults)"
    return [session.figure(name, " / ".join(growth(begin, server[str(r)]["rss"]) for r in ends), "< 5%")]


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--leaves", type=int, default=2)
    parser.add_argument("--devices-per-leaf", type=int, default=20)
    parser.add_argument("--selected", type=int, default=10, help="devices selected per round")
    parser.add_argument("--samples", type=int, default=20, help="samples per device in the job")
    parser.add_argument("--eval-frequency", type=int, default=50)
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between /proc samples")
    parser.add_argument("--window", type=int, default=5, help="round r: medians over rounds r-N..r+N (0: at r)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds before the job is abandoned")
    parser.add_argument("--trajectory", type=int, default=0, help="also print RSS every N rounds (0: off)")
    parser.add_argument("--nvflare-defaults", action="store_true", help=f"run with {RUNTIME_ENV_DEFAULTS_SWITCH}=0")
    args = parser.parse_args()
    session = harness.Session("memory_growth")
    payload = {"settings": vars(args), "rounds": part_rounds(args)}
    if args.json:
        session.write(payload, figures(args, payload["rounds"], session))


if __name__ == "__main__":
    main()
