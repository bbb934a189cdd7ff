"""The same FedAvg job in the simulator, in POC mode and on a provisioned deployment (mutual TLS) on this machine:
what the deployment's processes, TLS and admin API cost a round and a whole run.

    .venv/bin/python benchmarks/environment_rounds.py [--leaves 2] [--json] [-- JOB FLAGS]

Default job: the digits demo (``jobs/pt_job_fedavg.py --dataset digits``) with ``--leaves`` leaves. Runs sim, poc
and prod one after another (prod: provisions and starts a deployment with ``scripts/deployment.py`` in a temporary
workspace, runs the job, stops it), then prints, per environment, the median round time (the server's
``round_seconds``), the rounds' wall time, the whole command, and the final accuracy; and the ratios against sim.
``--json`` writes ``benchmarks/results/environment_rounds-<date>.json`` with the figures of benchmarks/README.md.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.harness import Session, arguments, print_table, read_results, run_command  # noqa: E402

TARGET_PROD_VS_SIM = 1.5


def measure(results_dir: str, command_seconds: float) -> dict:
    """Median and summed ``round_seconds``, the command's wall, final accuracy and rounds of a finished run."""
    results = read_results(results_dir)
    rounds = results["rounds"]
    return {
        "median_round_s": statistics.median(r["round_seconds"] for r in rounds),
        "rounds_wall_s": sum(r["round_seconds"] for r in rounds),
        "command_s": command_seconds,
        "final_accuracy": results["summary"]["final_accuracy"],
        "rounds": len(rounds),
    }


def main() -> int:
    argv = sys.argv[1:]
    job_flags = ["--dataset", "digits"]
    if "--" in argv:
        cut = argv.index("--")
        argv, job_flags = argv[:cut], argv[cut + 1 :]
    parser = arguments(__doc__)
    parser.add_argument("--leaves", type=int, default=2)
    args = parser.parse_args(argv)
    session = Session("environment_rounds")
    python = sys.executable
    measured: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="devsim-env-rounds-") as tmp:
        env = dict(os.environ, HOME=os.path.join(tmp, "home"), NVFLARE_POC_WORKSPACE=os.path.join(tmp, "poc"))
        os.makedirs(env["HOME"])
        leaves = ["--num-leaf-nodes", str(args.leaves)]
        for kind in ("sim", "poc"):
            out = os.path.join(tmp, f"results-{kind}")
            cmd = [python, "jobs/pt_job_fedavg.py", *job_flags, *leaves, "--env", kind]
            cmd += ["--workspace", os.path.join(tmp, f"ws-{kind}"), "--output-dir", out]
            seconds, _ = run_command(cmd, 900, env)
            measured[kind] = measure(out, seconds)
            print(f"{kind}: {measured[kind]}")
        deploy = [python, "scripts/deployment.py"]
        workspace = ["--workspace", os.path.join(tmp, "deployment")]
        run_command([*deploy, "provision", *workspace, "--leaves", str(args.leaves), "--port-base", "18900"], 120, env)
        try:
            run_command([*deploy, "start", *workspace], 240, env)
            seconds, _ = run_command([*deploy, "run", *workspace, "fedavg", "--", *job_flags], 900, env)
            measured["prod"] = measure(os.path.join(tmp, "deployment", "results"), seconds)
            print(f"prod: {measured['prod']}")
        finally:
            run_command([*deploy, "stop", *workspace], 120, env)
    sim = measured["sim"]
    table = [
        [kind, f"{m['median_round_s']:.3f}", f"{m['rounds_wall_s']:.2f}", f"{m['command_s']:.1f}"]
        + [f"{m['final_accuracy']:.4f}", f"{m['median_round_s'] / sim['median_round_s']:.2f}x"]
        for kind, m in measured.items()
    ]
    print_table(["env", "median round s", "rounds wall s", "command s", "accuracy", "round vs sim"], table)
    if args.json:
        figures = [
            session.figure(
                f"FedAvg digits demo ({args.leaves} leaves): {kind} median round time vs sim",
                f"{m['median_round_s'] / sim['median_round_s']:.2f}x ({m['median_round_s'] * 1000:.0f} ms vs "
                f"{sim['median_round_s'] * 1000:.0f} ms; command {m['command_s']:.1f} s vs {sim['command_s']:.1f} s)",
                f"<= {TARGET_PROD_VS_SIM}x" if kind == "prod" else "-",
            )
            for kind, m in measured.items()
            if kind != "sim"
        ]
        payload = {"leaves": args.leaves, "job_flags": job_flags, "environments": measured}
        session.write(payload, figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
