"""Every benchmark that publishes figures can write them as JSON: a ``--json`` flag whose output goes through
``benchmarks/harness.py``'s ``Session.write`` (so the README table can be rebuilt from ``benchmarks/results/``).

Read from the sources (no script is imported or run), so the checks take milliseconds."""

from __future__ import annotations

import ast
import glob
import json
import os
import re

import pytest

from tests.conftest import REPO

BENCHMARKS = os.path.join(REPO, "benchmarks")
# Entry scripts that may print research tables without a --json flag: none of them has a figure in the README's
# table (a figure in benchmarks/results/ needs the flag, see the first test).
NO_PUBLISHED_FIGURES = {"gpu_suite.py", "gpu_suite_check.py"}
SCRIPT_IN_COMMAND = re.compile(r"benchmarks/(\w+\.py)")


def _source(name: str) -> str:
    with open(os.path.join(BENCHMARKS, name), encoding="utf-8") as stream:
        return stream.read()


def entry_scripts() -> list[str]:
    """benchmarks/*.py files run as scripts (an ``if __name__ == "__main__":`` block)."""
    names = []
    for path in sorted(glob.glob(os.path.join(BENCHMARKS, "*.py"))):
        tree = ast.parse(_source(os.path.basename(path)))
        for node in tree.body:
            if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test):
                names.append(os.path.basename(path))
                break
    return names


def published_scripts(results_dir: str = os.path.join(BENCHMARKS, "results")) -> set[str]:
    """benchmarks/*.py scripts named in the command of a figure in benchmarks/results/*.json."""
    names = set()
    for path in glob.glob(os.path.join(results_dir, "*.json")):
        with open(path, encoding="utf-8") as stream:
            for entry in json.load(stream).get("figures", []):
                names.update(SCRIPT_IN_COMMAND.findall(entry.get("command", "")))
    return names


def defines_json_flag(source: str) -> bool:
    """Whether the source declares ``--json``: an ``add_argument("--json", ...)`` call, or its parser made by
    ``harness.arguments`` (which adds the flag)."""
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        if name == "arguments" or (
            name == "add_argument" and any(isinstance(a, ast.Constant) and a.value == "--json" for a in node.args)
        ):
            return True
    return False


def _writes(source: str) -> bool:
    """Whether a source writes through the harness: a ``Session`` and its ``write``."""
    return "Session(" in source and ".write(" in source


def writes_results(name: str) -> bool:
    """Whether the script writes its figures through the harness, itself or through a sibling benchmark it loads
    by file name."""
    source = _source(name)
    if _writes(source):
        return True
    siblings = set(re.findall(r"[\"'](\w+\.py)[\"']", source)) - {name}
    return any(os.path.exists(os.path.join(BENCHMARKS, s)) and _writes(_source(s)) for s in siblings)


def test_every_script_with_a_published_figure_exists_and_has_a_json_flag():
    published = published_scripts()
    assert "round_overhead.py" in published  # the check reads the commands
    missing = sorted(name for name in published if not os.path.exists(os.path.join(BENCHMARKS, name)))
    assert not missing, f"figures name scripts that do not exist: {missing}"
    without = sorted(name for name in published if not defines_json_flag(_source(name)))
    assert not without, f"these benchmarks publish figures but have no --json flag: {without}"


@pytest.mark.parametrize("name", entry_scripts())
def test_every_benchmark_script_writes_its_figures_with_json(name):
    source = _source(name)
    if not defines_json_flag(source):
        assert name in NO_PUBLISHED_FIGURES, f"benchmarks/{name} has no --json flag"
        return
    assert writes_results(name), f"benchmarks/{name} --json does not write through benchmarks/harness.py"


def test_the_scripts_without_figures_exist():
    assert NO_PUBLISHED_FIGURES <= set(entry_scripts()), "NO_PUBLISHED_FIGURES names a script that is gone"


def test_the_checks_fail_on_a_script_without_the_flag(tmp_path):
    assert not defines_json_flag('p.add_argument("--rounds")\nprint("--json")\n')
    assert defines_json_flag('p.add_argument("--json", action="store_true")\n')
    assert defines_json_flag("p = harness.arguments(__doc__)\n") and defines_json_flag("p = arguments(__doc__)\n")
    results = tmp_path / "results"
    results.mkdir()
    figure = {"figure": "x", "command": ".venv/bin/python benchmarks/no_such.py --sweep"}
    (results / "a.json").write_text(json.dumps({"figures": [figure]}))
    assert published_scripts(str(results)) == {"no_such.py"}
