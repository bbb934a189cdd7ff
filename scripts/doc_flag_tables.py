"""Print the Markdown flag tables of docs/jobs.md from the jobs' own parsers (the same ones --help uses).

.venv/bin/python scripts/doc_flag_tables.py combined   # simulation flags by section: one column of defaults per job
.venv/bin/python scripts/doc_flag_tables.py run        # run flags shared by every job
.venv/bin/python scripts/doc_flag_tables.py privacy    # the --dp-* flags (docs/privacy.md)
"""

from __future__ import annotations

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from devsim.sections import SECTIONS  # noqa: E402
from devsim_flare.api import RECIPES  # noqa: E402
from devsim_flare.cli import build_parser  # noqa: E402


def shown(action: argparse.Action) -> str:
    value = action.default
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return "on" if value else "off"
    return f"`{value}`" if value != "" else '`""`'


def flag(action: argparse.Action) -> str:
    return " / ".join(f"`{option}`" for option in action.option_strings)


def actions(parser: argparse.ArgumentParser, title: str) -> dict[str, argparse.Action]:
    """The flags of ``parser``'s ``--help`` group ``title`` (none when the job has no such group)."""
    group = next((g for g in parser._action_groups if g.title == title), None)
    return {a.option_strings[0]: a for a in group._group_actions} if group else {}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "mode",
        nargs="?",
        default="combined",
        choices=("combined", "run", "privacy"),
        help="which table (default: combined)",
    )
    mode = parser.parse_args().mode
    if mode in ("run", "privacy"):
        print("| flag | default | meaning |\n| --- | --- | --- |")
        for action in actions(build_parser(""), mode).values():
            print(f"| {flag(action)} | {shown(action)} | {(action.help or '').replace('|', '/')} |")
        return
    parsers = {name: build_parser("", recipe.defaults) for name, recipe in RECIPES.items()}
    for key, title in SECTIONS.items():
        if key == "privacy":
            continue  # its own table: `privacy`
        tables = {name: actions(parser, title) for name, parser in parsers.items()}
        order = list(dict.fromkeys(option for table in tables.values() for option in table))
        if not order:
            continue
        print(f"\n### {title} (`{key}`)\n")
        print("| flag | " + " | ".join(RECIPES) + " | meaning |")
        print("| --- | " + " | ".join("---" for _ in RECIPES) + " | --- |")
        for option in order:
            first = next(t[option] for t in tables.values() if option in t)
            defaults = " | ".join(shown(t[option]) if option in t else "—" for t in tables.values())
            print(f"| {flag(first)} | {defaults} | {(first.help or '').replace('|', '/')} |")


if __name__ == "__main__":
    main()
