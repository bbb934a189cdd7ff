"""Memory and open-file growth of the server and leaf processes over many sync rounds; population cost.

Part 1 runs ``jobs/pt_job_fedavg.py`` in NVFlare's simulator for ``--rounds`` rounds (small setting:
2 leaves x 20 devices, 10 selected per round, 20 samples per device, evaluation every 50 rounds, no
checkpoints) while a sampler thread reads ``VmRSS`` from ``/proc/<pid>/status`` and counts the
entries of ``/proc/<pid>/fd`` for the server and each leaf process every ``--interval`` seconds.
The processes are found by walking ``/proc`` for descendants of the job subprocess: the simulator
runs the server app (in a thread) in one process that spawns one ``simulator_worker --client
site-N`` process per leaf, naming its parent with ``--parent_pid``. Samples are mapped to rounds by
the time the server prints each ``round N/M`` progress line (the last sample taken at or before it).
Printed: RSS (MB) and open fds of each process at round 10, at round ``eval_frequency + 10``
(after the first evaluation allocated its buffers), halfway and at the last round, and the growth
in percent from round 10 and from the post-evaluation round to the last round.

Part 2 measures, in this process, the memory added (tracemalloc: Python and NumPy allocations)
by a registered device population: ``DevicePopulation`` with ``--population`` devices, IID and
Dirichlet partitioners over a 50,000-label array, and selecting ``--shards`` devices and deriving
(and holding) their shards from both partitioners.

    .venv/bin/python benchmarks/memory_growth.py                 # 200 rounds, then the population part
    .venv/bin/python benchmarks/memory_growth.py --rounds 600 --trajectory 50 --skip-population
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from devsim.data.partition import make_partitioner  # noqa: E402
from devsim.population import DevicePopulation  # noqa: E402

ROUND_LINE = re.compile(r"^round (\d+)/(\d+)\b")
CLIENT_ARG = re.compile(r"--client\s+(\S+)")
PARENT_ARG = re.compile(r"--parent_pid\s+(\d+)")


def _read(path: str) -> str | None:
    try:
        with open(path, "rb") as stream:
            return stream.read().decode("utf-8", "replace")
    except OSError:
        return None


def process_table() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line with spaces) for every process visible in /proc."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        stat = _read(f"/proc/{entry}/stat")
        cmdline = _read(f"/proc/{entry}/cmdline")
        if stat is None or cmdline is None:
            continue
        # /proc/<pid>/stat: "pid (comm) state ppid ..."; comm may hold spaces or parentheses
        ppid = int(stat[stat.rindex(")") + 2 :].split()[1])
        table[int(entry)] = (ppid, cmdline.replace("\0", " ").strip())
    return table


def find_roles(root: int) -> dict[str, int]:
    """Role -> pid for the descendants of ``root``: ``server`` and one ``site-N`` per leaf worker."""
    table = process_table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    descendants, stack = [], [root]
    while stack:
        for child in children.get(stack.pop(), []):
            descendants.append(child)
            stack.append(child)
    roles = {}
    for pid in descendants:
        cmdline = table[pid][1]
        if "simulator_worker" in cmdline:
            client = CLIENT_ARG.search(cmdline)
            parent = PARENT_ARG.search(cmdline)
            if client:
                roles[client.group(1)] = pid
            if parent and int(parent.group(1)) in table:
                roles["server"] = int(parent.group(1))
    return roles


def read_usage(pid: int) -> tuple[float, int] | None:
    """(VmRSS in MB, open fds) of ``pid``, or None when it is gone."""
    status = _read(f"/proc/{pid}/status")
    if status is None:
        return None
    match = re.search(r"^VmRSS:\s+(\d+)\s+kB", status, re.MULTILINE)
    try:
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None
    return (int(match.group(1)) / 1024.0 if match else 0.0), fds


class Sampler(threading.Thread):
    """Samples (time, {role: (rss_mb, fds)}) of the job's server and leaves every ``interval`` s."""

    def __init__(self, root: int, interval: float) -> None:
        super().__init__(daemon=True)
        self.root = root
        self.interval = interval
        self.samples: list[tuple[float, dict[str, tuple[float, int]]]] = []
        self.pids: dict[str, int] = {}
        self.stop = threading.Event()

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


def run_job(args, workdir: str) -> tuple[Sampler, dict[int, float], float]:
    """Run the sim job under the sampler; returns the sampler, round -> time its line was printed, wall s."""
    cmd = [
        sys.executable,
        os.path.join(REPO, "jobs", "pt_job_fedavg.py"),
        *("--num-leaf-nodes", str(args.leaves), "--devices-per-leaf", str(args.devices_per_leaf)),
        *("--device-selection-size", str(args.selected), "--samples-per-device", str(args.samples)),
        *("--num-rounds", str(args.rounds), "--eval-frequency", str(args.eval_frequency)),
        *("--checkpoint-frequency", "0", "--log-every", "1"),
        *("--workspace", os.path.join(workdir, "ws"), "--output-dir", os.path.join(workdir, "run")),
    ]
    env = dict(os.environ, HOME=os.path.join(workdir, "home"), PYTHONUNBUFFERED="1")
    started = time.monotonic()
    round_times: dict[int, float] = {}
    tail: list[str] = []
    with open(os.path.join(workdir, "stderr.txt"), "w+", encoding="utf-8") as stderr:
        proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True, bufsize=1)
        sampler = Sampler(proc.pid, args.interval)
        sampler.start()
        try:
            for line in proc.stdout:
                match = ROUND_LINE.match(line)
                if match:
                    round_times.setdefault(int(match.group(1)), time.monotonic())
                tail = (tail + [line])[-40:]
            code = proc.wait(timeout=args.timeout)
        finally:
            sampler.stop.set()
            sampler.join()
            if proc.poll() is None:
                proc.kill()
        if code != 0:
            stderr.seek(0)
            raise SystemExit(f"simulation failed (exit {code}):\n{''.join(tail)}\n{stderr.read()[-3000:]}")
    return sampler, round_times, time.monotonic() - started


def sample_at(samples, when: float) -> tuple[float, dict[str, tuple[float, int]]] | None:
    """The last sample taken at or before ``when`` (the first one after it when none was)."""
    before = [s for s in samples if s[0] <= when]
    if before:
        return before[-1]
    return samples[0] if samples else None


def natural_key(name: str) -> list[object]:
    return [int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name)]


def part_rounds(args) -> None:
    with tempfile.TemporaryDirectory(prefix="devsim-bench-") as workdir:
        sampler, round_times, wall = run_job(args, workdir)
    if not round_times:
        raise SystemExit("no 'round N/M' progress lines were printed")
    last = max(round_times)
    first = min(10, last)
    after_eval = args.eval_frequency + 10
    checkpoints = sorted({first, max(first, last // 2), last} | ({after_eval} if first < after_eval < last else set()))
    roles = sorted(sampler.pids, key=lambda r: (r != "server", natural_key(r)))
    print(
        f"part 1: {args.leaves} leaves x {args.devices_per_leaf} devices, {args.selected} selected per round, "
        f"{args.samples} samples per device, {last} rounds, eval every {args.eval_frequency}, no checkpoints; "
        f"{len(sampler.samples)} samples every {args.interval} s over {wall:.1f} s wall; "
        f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores"
    )
    print("processes: " + ", ".join(f"{r} pid {sampler.pids[r]}" for r in roles))
    picked = {}
    for rnd in checkpoints:
        sample = sample_at(sampler.samples, round_times[rnd])
        picked[rnd] = sample
        offset = (sample[0] - round_times[rnd]) if sample else float("nan")
        print(f"  round {rnd:>4}: sample taken {offset:+.2f} s from its progress line")
    header = f"{'process':<8}" + "".join(f"{'round ' + str(r) + ' MB':>15}{'fds':>6}" for r in checkpoints)
    starts = [first] + ([after_eval] if after_eval in checkpoints else [])
    for start in starts:
        header += f"{f'RSS {start}->{last}':>14}{f'fds {start}->{last}':>14}"
    print(header)
    for role in roles:
        cells, usage_at = "", {}
        for rnd in checkpoints:
            usage = picked[rnd][1].get(role) if picked[rnd] else None
            usage_at[rnd] = usage
            cells += f"{usage[0]:>15.1f}{usage[1]:>6d}" if usage else f"{'-':>15}{'-':>6}"
        for start in starts:
            begin, end = usage_at[start], usage_at[last]
            if begin and end:
                rss_growth = 100.0 * (end[0] - begin[0]) / begin[0]
                fd_growth = 100.0 * (end[1] - begin[1]) / begin[1]
                cells += f"{rss_growth:>+13.1f}%{fd_growth:>+13.1f}%"
            else:
                cells += f"{'-':>14}{'-':>14}"
        print(f"{role:<8}{cells}")
    peak = {r: max((s[1][r][0] for s in sampler.samples if r in s[1]), default=0.0) for r in roles}
    fds = {r: max((s[1][r][1] for s in sampler.samples if r in s[1]), default=0) for r in roles}
    print("peak over the run: " + ", ".join(f"{r} {peak[r]:.1f} MB / {fds[r]} fds" for r in roles))
    if args.trajectory:
        print(f"RSS MB / fds every {args.trajectory} rounds:")
        print(f"{'round':>7}" + "".join(f"{role:>16}" for role in roles))
        for rnd in range(args.trajectory, last + 1, args.trajectory):
            sample = sample_at(sampler.samples, round_times[rnd]) if rnd in round_times else None
            cells = ""
            for role in roles:
                usage = sample[1].get(role) if sample else None
                cells += f"{usage[0]:>11.1f} / {usage[1]:>2d}" if usage else f"{'-':>16}"
            print(f"{rnd:>7}{cells}")


def part_population(args) -> None:
    labels = np.random.default_rng(0).integers(0, 10, size=args.labels).astype(np.int64)
    leaves = args.population_leaves
    rss_before = read_usage(os.getpid())[0]
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    steps = []

    def mark(name: str) -> None:
        steps.append((name, tracemalloc.get_traced_memory()[0]))

    population = DevicePopulation(num_leaf_nodes=leaves, devices_per_leaf=args.population // leaves, seed=0)
    mark(f"DevicePopulation({leaves} leaves x {args.population // leaves:,} = {population.size:,} devices)")
    iid = make_partitioner("iid", labels, 10, args.samples_per_device, seed=0)
    mark(f"iid partitioner ({args.labels:,} labels)")
    dirichlet = make_partitioner("dirichlet", labels, 10, args.samples_per_device, seed=0, alpha=0.5)
    mark(f"dirichlet partitioner ({args.labels:,} labels, alpha 0.5)")
    selected = population.select(1, args.shards)
    groups = population.group_by_leaf(selected)
    mark(f"select {args.shards:,} devices + group by leaf ({len(groups)} leaves)")
    started = time.perf_counter()
    iid_shards = [iid.device_indices(int(d)) for d in selected]
    iid_seconds = time.perf_counter() - started
    mark(f"derive and hold {args.shards:,} iid shards")
    started = time.perf_counter()
    dirichlet_shards = [dirichlet.device_indices(int(d)) for d in selected]
    dirichlet_seconds = time.perf_counter() - started
    mark(f"derive and hold {args.shards:,} dirichlet shards")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    rss_after = read_usage(os.getpid())[0]
    assert len(iid_shards) == len(dirichlet_shards) == args.shards

    print()
    print(
        f"part 2: in-process memory of a device population (tracemalloc; {args.samples_per_device} samples "
        f"per device; the {args.labels:,}-label int64 input array itself, {labels.nbytes / 2**20:.2f} MB, not counted)"
    )
    previous = base
    for name, current in steps:
        print(f"  {name:<62} +{(current - previous) / 2**20:8.3f} MB")
        previous = current
    print(f"  {'total added':<62} +{(steps[-1][1] - base) / 2**20:8.3f} MB (peak +{(peak - base) / 2**20:.3f} MB)")
    print(f"  {'process RSS delta over the same steps (tracemalloc on)':<62} +{rss_after - rss_before:8.3f} MB")
    print(
        f"  shard derivation: iid {1e6 * iid_seconds / args.shards:.1f} us/device, "
        f"dirichlet {1e6 * dirichlet_seconds / args.shards:.1f} us/device"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--leaves", type=int, default=2)
    parser.add_argument("--devices-per-leaf", type=int, default=20)
    parser.add_argument("--selected", type=int, default=10, help="devices selected per round")
    parser.add_argument("--samples", type=int, default=20, help="samples per device in the job")
    parser.add_argument("--eval-frequency", type=int, default=50)
    parser.add_argument("--interval", type=float, default=0.5, help="seconds between /proc samples")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds before the job is abandoned")
    parser.add_argument("--population", type=int, default=100_000, help="devices in the part-2 population")
    parser.add_argument("--population-leaves", type=int, default=100)
    parser.add_argument("--labels", type=int, default=50_000, help="training labels partitioned in part 2")
    parser.add_argument("--samples-per-device", type=int, default=100, help="shard size in part 2")
    parser.add_argument("--shards", type=int, default=1000, help="devices selected and sharded in part 2")
    parser.add_argument("--trajectory", type=int, default=0, help="also print RSS every N rounds (0: off)")
    parser.add_argument("--skip-rounds", action="store_true", help="only run part 2")
    parser.add_argument("--skip-population", action="store_true", help="only run part 1")
    args = parser.parse_args()
    if not args.skip_rounds:
        part_rounds(args)
    if not args.skip_population:
        part_population(args)


if __name__ == "__main__":
    main()
