"""The current-figures table of benchmarks/README.md, built from the ``figures`` lists in benchmarks/results/*.json.

.venv/bin/python scripts/benchmark_table.py            # print the table
.venv/bin/python scripts/benchmark_table.py --write    # rewrite it in benchmarks/README.md
.venv/bin/python scripts/benchmark_table.py --check    # exit 1 when the README's table differs

One row per figure name: the one from the newest file (by its ``date``, then the time it was ``written``, then file
name) wins, so re-running a benchmark replaces its row.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
README = os.path.join(ROOT, "benchmarks", "README.md")
START, END = "<!-- figures:start -->", "<!-- figures:end -->"
COLUMNS = ("figure", "value", "target", "command", "date", "machine")


def latest_figures(results_dir: str = os.path.join(ROOT, "benchmarks", "results")) -> list[dict[str, str]]:
    """Every figure's newest entry, in the order figures first appear (oldest file first)."""
    documents = []
    for path in glob.glob(os.path.join(results_dir, "*.json")):
        with open(path, encoding="utf-8") as stream:
            document = json.load(stream)
        if document.get("figures"):
            when = (str(document.get("date", "")), str(document.get("written", "")), os.path.basename(path))
            documents.append((*when, document["figures"]))
    chosen: dict[str, dict[str, str]] = {}
    for *_, figures in sorted(documents, key=lambda entry: entry[:3]):
        for entry in figures:
            chosen[entry["figure"]] = entry
    return list(chosen.values())


def render(figures: list[dict[str, str]]) -> str:
    """The Markdown table (commands in code spans; ``|`` escaped)."""
    lines = [f"| {' | '.join(COLUMNS)} |", f"| {' | '.join('---' for _ in COLUMNS)} |"]
    for entry in figures:
        cells = [str(entry.get(c, "")).replace("|", "\\|") for c in COLUMNS]
        cells[3] = f"`{cells[3]}`"
        lines.append(f"| {' | '.join(cells)} |")
    return "\n".join(lines)


def readme_table(text: str) -> str:
    """The table between the markers in the README text."""
    if START not in text or END not in text:
        raise ValueError(f"benchmarks/README.md has no {START} ... {END} section")
    return text.split(START, 1)[1].split(END, 1)[0].strip()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write", action="store_true")
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    table = render(latest_figures())
    with open(README, encoding="utf-8") as stream:
        text = stream.read()
    if args.check:
        if readme_table(text) != table:
            print("benchmarks/README.md's figures table is out of date: run scripts/benchmark_table.py --write")
            return 1
        return 0
    if args.write:
        before, rest = text.split(START, 1)
        after = rest.split(END, 1)[1]
        with open(README, "w", encoding="utf-8") as stream:
            stream.write(f"{before}{START}\n{table}\n{END}{after}")
        return 0
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
