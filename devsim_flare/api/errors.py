"""The error every part of the Python API raises for bad input."""

from __future__ import annotations


class RecipeError(ValueError):
    """A recipe's setting, task or environment is not allowed; the message names it (as the command line's flag)
    and what is allowed."""


class RaisingParser:
    """Stands in for the command line's ``argparse`` parser in the shared job code: ``error`` raises."""

    def error(self, message: str) -> None:
        raise RecipeError(message)
