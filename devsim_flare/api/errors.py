"""The error every part of the Python API raises for bad input."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class RecipeError(ValueError):
    """A recipe's setting, task or environment is not allowed; the message names it (as the command line's flag)
    and what is allowed."""


class RaisingParser:
    """Stands in for the command line's ``argparse`` parser in the shared job code: ``error`` raises."""

    def error(self, message: str) -> None:
        raise RecipeError(message)


def check_setting_names(recipe: str, method: str, names: Iterable[str], allowed: Iterable[str]) -> None:
    """Raise RecipeError for the first of ``names`` that is not in ``allowed``, naming up to three close ones."""
    allowed = sorted(allowed)
    for name in names:
        if name not in allowed:
            close = difflib.get_close_matches(name, allowed, n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise RecipeError(f"{recipe}: no setting {name!r} for the {method} job{hint}")
