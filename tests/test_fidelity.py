"""benchmarks/fidelity.py: the figures it derives from run results (the runs themselves: `--quick`)."""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest

from tests.conftest import REPO


@pytest.fixture(scope="module")
def fidelity():
    spec = importlib.util.spec_from_file_location("fidelity", os.path.join(REPO, "benchmarks", "fidelity.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules["fidelity"] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_server_seconds_per_arrival_sums_every_window(fidelity) -> None:
    results = {
        "rounds": [
            {"version": 0, "accuracy": 0.1},
            {"timing": {"parts": {"server_aggregate": 1.5}}},
            {"timing": {"parts": {"server_aggregate": 0.5}}},
        ],
        "summary": {"accepted_updates": 8},
    }
    assert fidelity.server_seconds_per_arrival(results) == pytest.approx(0.25)


def test_table_shows_mean_spread_and_missing_cells(fidelity, capsys) -> None:
    acc, versions = fidelity.Figures(), fidelity.Figures()
    for value in (0.9, 0.94):
        acc.add("FedBuff", value)
    acc.add("FedAvg", 0.5)
    versions.add("FedBuff", 12)
    versions.add("FedBuff", 14)
    lines = fidelity.print_table("t", {"final": acc, "versions": versions})
    assert "| FedBuff | 0.9200 ± 0.0283 (n=2) | 12 / 14 |" in lines
    assert "| FedAvg | 0.5000 | - |" in lines
    assert "0.9200" in capsys.readouterr().out
