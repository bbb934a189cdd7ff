"""benchmarks/README.md's figures table is the one scripts/benchmark_table.py builds from benchmarks/results/*.json."""

from __future__ import annotations

import json

from tests.conftest import import_script


def _table_module():
    return import_script("scripts", "benchmark_table.py")


def test_readme_table_matches_the_results_files():
    table = _table_module()
    with open(table.README, encoding="utf-8") as stream:
        assert table.readme_table(stream.read()) == table.render(table.latest_figures())


def test_every_figure_names_value_target_command_date_and_machine():
    figures = _table_module().latest_figures()
    assert len(figures) >= 20
    for entry in figures:
        assert all(str(entry.get(c, "")).strip() for c in ("figure", "value", "target", "command", "date", "machine"))


def test_the_newest_file_wins_for_a_figure(tmp_path):
    table = _table_module()
    old = {"date": "2026-01-01", "figures": [{"figure": "x", "value": "1"}, {"figure": "y", "value": "2"}]}
    new = {"date": "2026-02-01", "figures": [{"figure": "x", "value": "3"}]}
    (tmp_path / "a.json").write_text(json.dumps(new))
    (tmp_path / "b.json").write_text(json.dumps(old))
    assert [(f["figure"], f["value"]) for f in table.latest_figures(str(tmp_path))] == [("x", "3"), ("y", "2")]


def test_a_later_run_of_the_same_day_wins(tmp_path):
    table = _table_module()
    first = {"date": "2026-01-01", "figures": [{"figure": "x", "value": "1"}]}  # before "written" existed
    morning = {"date": "2026-01-01", "written": "2026-01-01T09:00:00", "figures": [{"figure": "x", "value": "2"}]}
    evening = {"date": "2026-01-01", "written": "2026-01-01T21:00:00", "figures": [{"figure": "x", "value": "3"}]}
    (tmp_path / "b-2026-01-01.json").write_text(json.dumps(first))
    (tmp_path / "b-2026-01-01-3.json").write_text(json.dumps(evening))
    (tmp_path / "b-2026-01-01-2.json").write_text(json.dumps(morning))
    assert [f["value"] for f in table.latest_figures(str(tmp_path))] == ["3"]


def test_every_figure_command_is_one_command_a_reader_can_paste():
    """The environment's Python on a benchmark script: no chains through temporary files, no placeholders for a
    checkout the reader does not have."""
    for entry in _table_module().latest_figures():
        command = entry["command"]
        assert ".venv/bin/python benchmarks/" in command, f"{entry['figure']}: {command}"
        for mark in ("&&", "/tmp/", "git show", "DIR", "; "):
            assert mark not in command, f"{entry['figure']}: {command}"
