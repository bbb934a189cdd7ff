"""Where FedRevive's server time goes: per-arrival cost of synthesis and KD, split by phase, side by side.

Runs the server-side reviver alone (no NVFlare) with the settings ``benchmarks/async_quality.py`` gives the server
(``fedrevive_small_cpu``, CNN, K = 50, B = 1): random client models arrive one per version; after the gates,
``--arrivals`` arrivals (whole synthesis / KD cycles) are timed (wall, and CPU seconds of the calling thread, which
the load does not inflate), then the same number under ``torch.profiler`` for the ``fedrevive.*`` phases (CPU ms
per arrival). Columns: ``paper-rate loop`` (teachers one by one, KD every arrival, synthesis every 5 versions),
``paper-rate vmap`` (vectorised teachers everywhere), ``paper-rate default`` (vectorised in synthesis only) and
``preset`` (what ``app_configs/presets/fedrevive_small_cpu.json`` sets). ``--json`` writes the columns and the
figure (the preset's thread-CPU seconds per arrival) to ``benchmarks/results/fedrevive_profile-<date>.json``:

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/fedrevive_profile.py --arrivals 10 --json
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import defaultdict

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.harness import REPO, Session, arguments, print_table  # noqa: E402
from devsim.aggregation.fedrevive import DFKDConfig, Reviver, ReviverConfig, scaled_s_max  # noqa: E402
from devsim.config import FedReviveConfig  # noqa: E402
from devsim.models import build_model  # noqa: E402
from devsim.sections import flatten_sections  # noqa: E402

PRESET = os.path.join(REPO, "app_configs", "presets", "fedrevive_small_cpu.json")


def load_preset() -> dict:
    """``fedrevive_small_cpu``'s settings, flat (the preset file groups them by section)."""
    with open(PRESET, encoding="utf-8") as stream:
        return flatten_sections(json.load(stream), FedReviveConfig)


def make_reviver(preset: dict, teacher_batching: str, kd_interval: int, generation_interval: int) -> Reviver:
    """The preset's reviver (CNN, K = 50, B = 1) with these teacher batching and synthesis / KD intervals."""
    dfkd = {k: preset[k] for k in ("generator_width", "synth_batch_size", "kd_iterations", "pool_capacity")}
    gates = {k: preset[k] for k in ("freeze_version", "warmup_version", "teacher_capacity")}
    intervals = dict(generation_interval=generation_interval, kd_interval=kd_interval)
    config = ReviverConfig(
        s_max=scaled_s_max(50, 1), dfkd=DFKDConfig(teacher_batching=teacher_batching, **dfkd), **gates, **intervals
    )
    torch.manual_seed(0)
    return Reviver(lambda: build_model("cnn", num_classes=10, track_features=True), config, seed=0)


def drive(reviver: Reviver, versions: range, seed: int) -> tuple[float, float]:
    """Feed one perturbed client model per version (staleness 50); return wall and thread-CPU seconds in
    ``on_arrival``."""
    rng = np.random.default_rng(seed)
    base = {k: v.numpy().copy() for k, v in build_model("cnn", track_features=True).state_dict().items()}
    seconds = cpu_seconds = 0.0
    for version in versions:
        client = {k: (x + 0.01 * rng.standard_normal(x.shape)).astype(np.float32) for k, x in base.items()}
        q = rng.dirichlet(np.full(10, 0.3))
        started, cpu_started = time.perf_counter(), time.thread_time()
        reviver.on_arrival(base, version, base, client, q, 50.0)
        seconds += time.perf_counter() - started
        cpu_seconds += time.thread_time() - cpu_started
    return seconds, cpu_seconds


def measure(preset: dict, arrivals: int, **settings) -> tuple[tuple[float, float], dict[str, float]]:
    """Wall and CPU seconds per arrival (unprofiled) and CPU ms per arrival for each ``fedrevive.*`` phase
    (profiled)."""
    reviver = make_reviver(preset, **settings)
    interval = settings["generation_interval"] * settings["kd_interval"]
    arrivals = -(-arrivals // interval) * interval  # whole synthesis and KD cycles, so their shares are exact
    start = preset["warmup_version"] + 20
    drive(reviver, range(start), 0)
    wall, cpu = drive(reviver, range(start, start + arrivals), 1)
    per_arrival = (wall / arrivals, cpu / arrivals)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        drive(reviver, range(start + arrivals, start + 2 * arrivals), 2)
    phases: dict[str, float] = defaultdict(float)
    for event in prof.key_averages():
        if event.key.startswith("fedrevive."):
            phases[event.key.removeprefix("fedrevive.")] += event.cpu_time_total / 1000.0 / arrivals
    return per_arrival, dict(phases)


def main() -> None:
    parser = arguments(__doc__)
    parser.add_argument("--arrivals", type=int, default=40, help="timed arrivals per column (after the gates)")
    args = parser.parse_args()
    session = Session("fedrevive_profile")
    preset = load_preset()
    columns = {
        f"paper-rate {name}": dict(teacher_batching=batching, kd_interval=1, generation_interval=5)
        for name, batching in (("loop", "off"), ("vmap", "all"), ("default", "synthesis"))
    }
    intervals = dict(kd_interval=preset.get("kd_interval", 1), generation_interval=preset["generation_interval"])
    columns["preset"] = dict(teacher_batching="synthesis", **intervals)
    results = {name: measure(preset, args.arrivals, **settings) for name, settings in columns.items()}
    print(f"torch threads {torch.get_num_threads()}, load average {os.getloadavg()[0]:.2f} (1 min)")
    for name, settings in columns.items():
        print(f"  {name}: {settings}")
    keys = sorted({key for _, phases in results.values() for key in phases})
    table = [[key, *(f"{phases.get(key, 0.0):.1f}" for _, phases in results.values())] for key in keys]
    table.append(["wall s / arrival", *(f"{wall:.3f}" for (wall, _), _ in results.values())])
    table.append(["CPU s / arrival (thread)", *(f"{cpu:.3f}" for (_, cpu), _ in results.values())])
    first = results["paper-rate loop"][0][1]
    table.append(["CPU speed-up vs first column", *(f"{first / cpu:.2f}x" for (_, cpu), _ in results.values())])
    print_table(["phase (CPU ms / arrival)", *columns], table)
    if args.json:
        settings = {"arrivals": args.arrivals, "torch_threads": torch.get_num_threads()}
        shown = {
            name: {"settings": columns[name], "wall_s": wall, "cpu_s": cpu, "phases_cpu_ms": phases}
            for name, ((wall, cpu), phases) in results.items()
        }
        cpu = f"{results['preset'][0][1]:.3f} s"
        figure = session.figure("FedRevive server thread-CPU per arrival (preset)", cpu, "<= 0.35 s wall")
        session.write({"settings": settings, "columns": shown}, [figure])


if __name__ == "__main__":
    main()
