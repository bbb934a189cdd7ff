"""The async throughput benchmark's rounds (``--repeats``): each round's ratio against FedAvg's same round, the
median round kept, the spread printed."""

from __future__ import annotations

from benchmarks.async_throughput import median_round, spread


def _row(rate: float, accuracy: float = 0.9) -> dict:
    return {"updates_per_s": rate, "final_accuracy": accuracy, "wall": 1.0}


def test_ratios_pair_rounds_and_the_median_round_is_kept():
    fedavg = [_row(200.0), _row(300.0), _row(250.0)]
    fedbuff = [_row(150.0, 0.91), _row(180.0, 0.92), _row(200.0, 0.93)]
    row = median_round(fedbuff, fedavg, loop_per_update=0.01)
    assert [r["ratio_to_fedavg"] for r in row["rounds"]] == [0.75, 0.6, 0.8]
    assert row["ratio_to_fedavg"] == 0.75 and row["updates_per_s"] == 150.0 and row["final_accuracy"] == 0.91
    assert row["ratio_to_tight_loop"] == 1 / 150.0 / 0.01
    assert spread(row) == " (median of 3 rounds, 0.60-0.80x)"


def test_one_round_or_no_fedavg():
    alone = median_round([_row(120.0)], None, loop_per_update=0.01)
    assert alone["ratio_to_fedavg"] is None and spread(alone) == ""
    once = median_round([_row(120.0)], [_row(240.0)], loop_per_update=0.01)
    assert once["ratio_to_fedavg"] == 0.5 and spread(once) == ""
    even = median_round([_row(100.0), _row(140.0)], None, loop_per_update=0.01)
    assert even["updates_per_s"] == 100.0
    fedavg = [_row(260.0), _row(250.0), _row(270.0)]
    assert median_round(fedavg, fedavg, loop_per_update=0.01)["updates_per_s"] == 260.0


def test_without_fedavg_the_fedrevive_command_ratio_is_the_figure_with_the_baseline_beside_it():
    from benchmarks.async_throughput import figures

    class Stamp:
        def figure(self, name: str, value: str, target: str) -> dict:
            return {"figure": name, "value": value, "target": target}

    def row(setting: str, ratios: list[float] | None, wall: float) -> dict:
        out = {"dataset": "digits", "setting": setting, "ratio_to_fedavg": None, "command_wall": wall}
        return out if ratios is None else {**out, "command_ratio_to_fedbuff_paper": ratios}

    rows = [
        row("fedbuff paper", None, 17.0),
        row("fedrevive paper", [2.0, 2.5], 40.0),
        row("fedbuff paper @ abc1234", None, 17.0),
        row("fedrevive paper @ abc1234", [3.0, 3.5], 55.0),
    ]
    (only,) = figures(rows, Stamp())
    assert only["figure"].endswith("fedrevive paper (digits)")
    assert only["value"] == (
        "command 2.00x / 2.50x fedbuff paper's (40.0 s); at abc1234, side by side: 3.00x / 3.50x (55.0 s)"
    )
    assert only["target"] == "command <= 1.5x fedbuff paper's"


def test_a_sync_rounds_rate_counts_the_servers_work_between_rounds():
    """A sync round's wall ends at its evaluation; the server's bookkeeping before the next round
    (``between_rounds``) counts too, as it does inside an async window. The first window is left out."""
    from benchmarks.async_throughput import steady_rate

    def record(wall: float, between: float, evaluation: float = 0.0) -> dict:
        parts = {"dispatch": wall - evaluation, "evaluation": evaluation}
        return {"answered_devices": 10, "timing": {"wall": wall, "parts": parts, "info": {"between_rounds": between}}}

    rate = steady_rate([record(9.0, 0.0), record(0.1, 0.02, 0.01), record(0.1, 0.03, 0.01)], False, leaves=2)
    assert rate["updates"] == 20 and abs(rate["wall"] - (0.2 + 0.05 - 0.02)) < 1e-12
    assert abs(rate["parts_per_update"]["between_rounds"] - 0.05 / 20) < 1e-15
    windows = [{"accepted_updates": 0, "timing": {"wall": 9.0, "parts": {}, "info": {"between_rounds": 5.0}}}]
    windows.append({"accepted_updates": 20, "timing": {"wall": 0.2, "parts": {}, "info": {}}})
    assert abs(steady_rate(windows, True, leaves=2)["wall"] - 0.2) < 1e-12  # async windows hold it already
