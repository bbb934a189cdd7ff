"""Every command-line script answers ``--help``: argparse formats help strings with ``%``, so a stray
``%`` (e.g. "topk 1%") only fails when a user asks for help. Run in-process with runpy: the heavy
imports are shared, so the whole sweep costs seconds."""

from __future__ import annotations

import contextlib
import io
import runpy
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(
    path
    for folder in ("benchmarks", "jobs", "scripts")
    for path in (ROOT / folder).glob("*.py")
    if "__main__" in path.read_text()
    and any(mark in path.read_text() for mark in ("argparse", "command_line()", "cli import main", "arguments(__doc__"))
)


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda path: f"{path.parent.name}/{path.name}")
def test_script_answers_help(script: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", [str(script), "--help"])
    monkeypatch.setattr(sys, "path", list(sys.path))
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exited:
        runpy.run_path(str(script), run_name="__main__")
    assert exited.value.code in (0, None)
    assert "usage:" in out.getvalue()
