"""Fidelity on real data: does the simulator reproduce what federated learning is known to do? (digits)

One command, four comparisons on scikit-learn's real handwritten digits (``--dataset digits``), each
run through the jobs' own command lines (``jobs/pt_job_*.py``, NVFlare's simulator), printed side by side:

1. **Data heterogeneity.** Centralized training (one model on the whole training split, in-process
   with the project's local trainer) vs FedAvg on IID shards vs FedAvg on Dirichlet(0.1) shards:
   final test accuracy, mean and spread over ``--seeds``.
2. **Staleness.** FedAvg (synchronous waves K = B = O), FedBuff and FedRevive (K concurrent jobs, a
   new version every B arrivals) on the ``paper_shifted`` delay schedule for the same simulated time,
   (FedRevive under the ``fedrevive_small_cpu`` preset): final and best accuracy, versions, and server seconds per
   arrival (the server's aggregation time, FedRevive's distillation included, over accepted updates).
3. (Hidden groups, cluster aggregation against FedAvg: ``benchmarks/cluster_recovery.py`` measures them.)
4. **FedRevive's job defaults.** ``jobs/pt_job_fedrevive.py --dataset digits`` with nothing else set (its
   recipe's CPU-sized schedule, the background distillation included), per ``--job-seeds``: final and best
   accuracy and the whole command's wall time.
5. **Availability.** FedBuff on a seeded trace of 100,000 devices (diurnal sessions, lognormal speeds, two
   network classes) against the same devices always online with the schedule's delays, same data, model and
   version budget, per ``--trace-seeds``: final and best accuracy, the share of jobs lost when a session ended.

    .venv/bin/python benchmarks/fidelity.py                       # the default table (sections 1 and 2)
    .venv/bin/python benchmarks/fidelity.py --quick               # tiny sizes: checks the script itself
    .venv/bin/python benchmarks/fidelity.py --sections 2,4 --stale-seeds 0,1,2 --job-seeds 0 --json
    .venv/bin/python benchmarks/fidelity.py --sections 5 --json

``--json`` writes the per-seed figures of every section run and the published figures (section 1's mean final
accuracies, section 2's FedRevive minus FedBuff, section 4's final accuracies, section 5's always-on / trace) to
``benchmarks/results/fidelity-<date>.json`` (``fidelity-<sections>-<date>.json`` for other sections than 1, 2,
e.g. ``fidelity-5-<date>.json``); ``--json FILE`` also writes the per-seed figures to FILE after each
section.

The test split is only ever used for the reported figures; the centralized recipe (SGD lr 0.01,
momentum 0.9, batch 32, 10 epochs) was chosen on a validation split carved from the training split.
Methods take their settings from the public job flags, so the script measures whatever the jobs do.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import harness  # noqa: E402

HETEROGENEITY = "1. heterogeneity (final test accuracy)"
STALENESS = "2. staleness (equal simulated time)"
JOB_DEFAULTS = "4. FedRevive's job defaults (pt_job_fedrevive.py --dataset digits)"
AVAILABILITY = "5. availability (FedBuff, always-on devices vs a device trace)"
AVAILABILITY_SETTINGS = {
    "FedBuff always-on": ["--availability", "always", "--speed-distribution", "profile"],
    "FedBuff on the trace": ["--availability", "trace", "--speed-distribution", "trace"],
}


@dataclass(frozen=True)
class Sizes:
    """Run sizes of the sections (full table or ``--quick``)."""

    sync: list[str]
    central_epochs: int
    stale: list[str]
    concurrency: int
    sim_time: float
    eval_every: int
    availability: list[str]


def _population(leaves: int, per_leaf: int, samples: int, *more: str) -> list[str]:
    flags = ["--num-leaf-nodes", str(leaves), "--devices-per-leaf", str(per_leaf), "--samples-per-device", str(samples)]
    return [*flags, *more]


# Sized for a 2-core CPU: every job pays NVFlare's start-up (about 30 s on a quiet machine), so the table
# holds few, modest runs. Section 1 uses the FedAvg job's own population (2 x 50 devices, 20 per round);
# section 2 K = 20 concurrent jobs on the shifted schedule for 1 simulated second (~100 arrivals); section 5
# 2 x 50,000 devices, K = 20, B = 2, 150 versions (a speed-1 device's job takes 320 simulated seconds).
_AVAILABILITY = [
    *("--partition", "dirichlet", "--alpha", "0.5", "--concurrency", "20", "--buffer-size", "2"),
    *("--min-open-slots", "1", "--samples-per-second", "1.0", "--optimizer", "adam", "--lr", "0.001"),
    *("--local-iterations", "10", "--batch-size", "32", "--global-lr", "0.3", "--log-every", "100"),
]
FULL = Sizes(
    _population(2, 50, 100, "--device-selection-size", "20", "--num-rounds", "20"),
    10,
    _population(2, 50, 100),
    20,
    1.0,
    10,
    _population(2, 50_000, 50, "--max-versions", "150", "--eval-frequency", "25", *_AVAILABILITY),
)
QUICK = Sizes(
    _population(2, 5, 20, "--device-selection-size", "4", "--num-rounds", "2"),
    1,
    _population(2, 10, 20),
    4,
    0.3,
    2,
    _population(2, 200, 20, "--max-versions", "10", "--eval-frequency", "5", *_AVAILABILITY),
)


@dataclass
class Figures:
    """Per-seed figures of one method: name -> list over seeds."""

    values: dict[str, list[float]] = field(default_factory=dict)

    def add(self, name: str, value: float) -> None:
        self.values.setdefault(name, []).append(float(value))


def mean_spread(values: list[float]) -> str:
    """``mean ± sample std (n)``; just the value for one seed."""
    if len(values) == 1:
        return f"{values[0]:.4f}"
    return f"{statistics.fmean(values):.4f} ± {statistics.stdev(values):.4f} (n={len(values)})"


def server_seconds_per_arrival(results: dict) -> float:
    """Server aggregation seconds (revision/distillation, buffering, applying) per accepted update."""
    seconds = sum(r.get("timing", {}).get("parts", {}).get("server_aggregate", 0.0) for r in results["rounds"])
    return seconds / max(int(results["summary"]["accepted_updates"]), 1)


def run_job(script: str, flags: list[str], workdir: str, name: str, env: dict | None = harness.ONE_THREAD) -> dict:
    """Run ``jobs/<script> --dataset digits`` with ``flags`` (default one thread a process); its results.json plus
    ``wall``."""
    results = harness.run_job(script, ["--dataset", "digits", *flags], workdir, name, env=env)
    print(f"  {name}: {results['wall']:.0f}s wall, final accuracy {_final(results):.4f}")
    return results


def _final(results: dict) -> float:
    summary = results.get("summary") or {}
    return float(summary.get("final_accuracy", results["rounds"][-1]["accuracy"]))


def centralized_accuracy(seed: int, epochs: int) -> float:
    """Test accuracy of the CNN trained on the whole digits training split (SGD lr 0.01, momentum 0.9, batch 32)."""
    import torch

    from devsim.tasks import task_from_settings
    from devsim.training.evaluation import Evaluator
    from devsim.training.local import LocalTrainer, LocalTrainingSpec

    torch.set_num_threads(1)
    torch.manual_seed(seed)
    task = task_from_settings({"dataset": "digits", "model": "cnn"})
    images, labels = task.prepare(torch.from_numpy(task.x_train)), torch.from_numpy(task.y_train)
    trainer = LocalTrainer(task.build_model(), LocalTrainingSpec(epochs=epochs, batch_size=32, lr=0.01), "cpu")
    start = [t.clone() for t in trainer.state_tensors]
    trainer.train(0, start, images, labels, torch.Generator().manual_seed(seed))
    return Evaluator.for_task(task, torch.device("cpu")).evaluate(trainer.model).accuracy


def section_heterogeneity(sizes: Sizes, seeds: list[int], workdir: str) -> dict[str, Figures]:
    figures = {"final": Figures()}
    for seed in seeds:
        started = time.perf_counter()
        figures["final"].add("centralized", centralized_accuracy(seed, sizes.central_epochs))
        print(f"  centralized seed {seed}: {time.perf_counter() - started:.0f}s")
        for name, partition in (("FedAvg IID", ["--partition", "iid"]), ("FedAvg Dir 0.1", ["--alpha", "0.1"])):
            flags = [*sizes.sync, *partition, "--seed", str(seed)]
            results = run_job("pt_job_fedavg.py", flags, workdir, f"s1-{name.replace(' ', '_')}-{seed}")
            figures["final"].add(name, _final(results))
    return figures


def section_staleness(sizes: Sizes, seeds: list[int], workdir: str) -> dict[str, Figures]:
    common = [
        *sizes.stale,
        *("--partition", "dirichlet", "--alpha", "0.3", "--delay-schedule", "paper_shifted"),
        *("--max-sim-time", str(sizes.sim_time), "--max-versions", "100000"),
        *("--optimizer", "adam", "--lr", "0.001", "--local-iterations", "10", "--batch-size", "32", "--no-augment"),
    ]
    k = str(sizes.concurrency)
    asynchronous = [*("--concurrency", k, "--buffer-size", "1", "--min-open-slots", "1")]
    asynchronous += [*("--global-lr", "0.1", "--eval-frequency", str(sizes.eval_every))]
    waves = [*("--concurrency", k, "--buffer-size", k, "--min-open-slots", k)]
    waves += [*("--global-lr", "1.0", "--eval-frequency", "1")]
    methods = {
        "FedAvg (waves)": ("pt_job_fedbuff.py", waves),
        "FedBuff": ("pt_job_fedbuff.py", asynchronous),
        "FedRevive": ("pt_job_fedrevive.py", ["--preset", "fedrevive_small_cpu", *asynchronous]),
    }
    figures = {key: Figures() for key in ("final", "best", "versions", "server s/arrival", "wall s")}
    for seed in seeds:
        for name, (script, extra) in methods.items():
            flags = [*extra, *common, "--seed", str(seed)]
            results = run_job(script, flags, workdir, f"s2-{name.split()[0]}-{seed}")
            figures["final"].add(name, _final(results))
            figures["best"].add(name, harness.best_accuracy(results))
            figures["versions"].add(name, results["summary"]["versions"])
            figures["server s/arrival"].add(name, server_seconds_per_arrival(results))
            figures["wall s"].add(name, results["wall"])
    return figures


def section_job_defaults(sizes: Sizes, seeds: list[int], workdir: str) -> dict[str, Figures]:
    """FedRevive's job as a user runs it on digits (``--quick``: 20 versions instead of its 150)."""
    figures = {key: Figures() for key in ("final", "best", "wall s")}
    quick = ["--max-versions", "20"] if sizes is QUICK else []
    for seed in seeds:
        results = run_job("pt_job_fedrevive.py", [*quick, "--seed", str(seed)], workdir, f"s4-FedRevive-{seed}", None)
        figures["final"].add("FedRevive", _final(results))
        figures["best"].add("FedRevive", harness.best_accuracy(results))
        figures["wall s"].add("FedRevive", results["wall"])
    return figures


def write_trace(path: str, devices: int, seed: int) -> str:
    """An NPZ trace of the population the jobs draw for ``devices`` devices and ``seed`` with ``--availability
    diurnal --speed-distribution lognormal --speed-sigma 0.5``: sessions, speeds and network classes."""
    from devsim.config import SimulationConfig
    from devsim.population.heterogeneity import build_population_model
    from devsim.population.traces import DeviceTrace, save_trace_npz

    drawn = dict(availability="diurnal", speed_distribution="lognormal", speed_sigma=0.5, seed=seed)
    model = build_population_model(SimulationConfig(num_leaf_nodes=1, devices_per_leaf=devices, **drawn))
    save_trace_npz(path, DeviceTrace(model.availability, model.speed, model.network_class))
    return path


def section_availability(sizes: Sizes, seeds: list[int], workdir: str) -> dict[str, Figures]:
    """FedBuff always online against the same devices on a trace (the trace's sessions, speeds and networks)."""
    devices = 2 * int(sizes.availability[sizes.availability.index("--devices-per-leaf") + 1])
    figures = {key: Figures() for key in ("final", "best", "jobs lost to session end %", "wall s")}
    for seed in seeds:
        trace = write_trace(os.path.join(workdir, f"trace-{seed}.npz"), devices, seed)
        for name, setting in AVAILABILITY_SETTINGS.items():
            flags = [*sizes.availability, *setting, "--seed", str(seed)]
            flags += ["--trace-file", trace] if "trace" in name else []
            results = run_job("pt_job_fedbuff.py", flags, workdir, f"s5-{name.split()[-1]}-{seed}", None)
            dropped = results["summary"]["dropouts_by_cause"]
            finished = results["summary"]["accepted_updates"] + sum(dropped.values())
            figures["final"].add(name, _final(results))
            figures["best"].add(name, harness.best_accuracy(results))
            figures["jobs lost to session end %"].add(name, 100 * dropped.get("session_end", 0) / max(finished, 1))
            figures["wall s"].add(name, results["wall"])
    return figures


def print_table(title: str, figures: dict[str, Figures]) -> list[str]:
    """Markdown table: one row per method, one column per figure; returns the lines printed."""
    columns = list(figures)
    methods = list(dict.fromkeys(name for f in figures.values() for name in f.values))
    lines = [f"\n{title}", "", "| method | " + " | ".join(columns) + " |", "|---" * (len(columns) + 1) + "|"]
    for method in methods:
        cells = []
        for column in columns:
            values = figures[column].values.get(method)
            if values is None:
                cells.append("-")
            elif column in ("versions", "wall s"):
                cells.append(" / ".join(f"{v:.0f}" for v in values))
            else:
                cells.append(mean_spread(values))
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    print("\n".join(lines))
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = harness.arguments(__doc__, "write the figures (and to FILE)", "FILE")
    parser.add_argument("--quick", action="store_true", help="tiny sizes: a check of the script, not figures")
    parser.add_argument("--sections", default="1,2", help="comma list of sections to run (1, 2, 4, 5)")
    parser.add_argument("--seeds", default="0,1,2", help="seeds of section 1")
    parser.add_argument("--stale-seeds", default="0", help="seeds of section 2 (FedRevive is the slow part)")
    parser.add_argument("--job-seeds", default="0", help="seeds of section 4 (FedRevive's job defaults)")
    parser.add_argument("--trace-seeds", default="0", help="seeds of section 5 (availability)")
    parser.add_argument("--workdir", default=None, help="keep the run folders here (default: a temporary folder)")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    seeds = harness.items(parser, "--seeds", args.seeds, int)
    sections = set(harness.items(parser, "--sections", args.sections, int, allowed=(1, 2, 4, 5)))
    # a run of other sections than the default writes its own file, so that it replaces no other run's figures
    session = harness.Session("fidelity" + ("" if sections == {1, 2} else "-" + "".join(map(str, sorted(sections)))))
    tables: dict[str, dict[str, Figures]] = {}
    with tempfile.TemporaryDirectory(prefix="devsim-fidelity-") as scratch:
        workdir = os.path.abspath(args.workdir) if args.workdir else scratch
        os.makedirs(workdir, exist_ok=True)
        runs = {
            1: (HETEROGENEITY, section_heterogeneity, seeds),
            2: (STALENESS, section_staleness, harness.items(parser, "--stale-seeds", args.stale_seeds, int)),
            4: (JOB_DEFAULTS, section_job_defaults, harness.items(parser, "--job-seeds", args.job_seeds, int)),
            5: (AVAILABILITY, section_availability, harness.items(parser, "--trace-seeds", args.trace_seeds, int)),
        }
        for number in sorted(sections):
            title, section, section_seeds = runs[number]
            print(f"section {title}")
            tables[title] = section(sizes, section_seeds, workdir)
            print_table(title, tables[title])
            if args.json:
                with open(args.json, "w", encoding="utf-8") as stream:
                    json.dump(per_seed(tables), stream, indent=1)
    print(
        f"\n=== digits, {'quick' if args.quick else 'full'} sizes; seeds {seeds} (section 2: {args.stale_seeds}, "
        f"section 4: {args.job_seeds}, section 5: {args.trace_seeds})"
    )
    for title, figures in tables.items():
        print_table(title, figures)
    print(f"\n{time.perf_counter() - session.started:.0f}s wall; {session.where()}")
    if args.json is not None:
        session.write({"settings": vars(args), "tables": per_seed(tables)}, readme_figures(tables, args.quick, session))
    return 0


def per_seed(tables: dict[str, dict[str, Figures]]) -> dict:
    """Section title -> figure -> method -> its value per seed."""
    return {title: {key: figures.values for key, figures in table.items()} for title, table in tables.items()}


def readme_figures(tables: dict[str, dict[str, Figures]], quick: bool, session: harness.Session) -> list[dict]:
    """Section 1's mean final accuracies: centralized / FedAvg IID / FedAvg Dirichlet 0.1; section 2's FedRevive
    minus FedBuff (mean final accuracy, points); section 4's FedRevive final accuracy per seed; section 5's FedBuff
    mean final accuracy always-on / on the trace."""
    size = " (--quick sizes)" if quick else ""
    published = []
    if HETEROGENEITY in tables:
        final = tables[HETEROGENEITY]["final"].values
        means = [statistics.fmean(final[name]) for name in ("centralized", "FedAvg IID", "FedAvg Dir 0.1")]
        name = "fidelity on digits: centralized / FedAvg IID / FedAvg Dirichlet 0.1" + size
        published.append(session.figure(name, " / ".join(f"{m:.3f}" for m in means), "close to centralized"))
    if STALENESS in tables:
        final = tables[STALENESS]["final"].values
        revive, buff = statistics.fmean(final["FedRevive"]), statistics.fmean(final["FedBuff"])
        seeds = " / ".join(f"{100 * (r - b):+.1f}" for r, b in zip(final["FedRevive"], final["FedBuff"], strict=True))
        name = "fidelity on digits, stale schedule: FedRevive minus FedBuff, final accuracy" + size
        value = f"{100 * (revive - buff):+.1f} points ({revive:.4f} vs {buff:.4f}; per seed {seeds})"
        published.append(session.figure(name, value, ">= +15 points"))
    if JOB_DEFAULTS in tables:
        final = tables[JOB_DEFAULTS]["final"].values["FedRevive"]
        name = "FedRevive job defaults on digits: final accuracy" + size
        published.append(session.figure(name, " / ".join(f"{v:.4f}" for v in final), ">= 0.94"))
    if AVAILABILITY in tables:
        final = tables[AVAILABILITY]["final"].values
        always, trace = (statistics.fmean(final[name]) for name in AVAILABILITY_SETTINGS)
        name = "availability: FedBuff final accuracy always-on / trace" + size
        published.append(session.figure(name, f"{always:.3f} / {trace:.3f}", "learns on traces"))
    return published


if __name__ == "__main__":
    sys.exit(main())
