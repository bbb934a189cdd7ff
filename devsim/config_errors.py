"""The error a bad setting raises, and the command-line flag of a setting: shared by the run configuration
(:mod:`devsim.config`) and the settings sections defined beside the code that uses them (e.g.
:mod:`devsim.privacy.settings`)."""

from __future__ import annotations


class ConfigError(ValueError):
    """A configuration value is not allowed; the message names the flag and what is allowed."""

    def __init__(self, field_name: str, message: str):
        self.field_name = field_name
        super().__init__(f"{flag_name(field_name)}: {message}")


def flag_name(field_name: str) -> str:
    """Command-line flag of a configuration field, e.g. ``num_rounds`` -> ``--num-rounds``."""
    return "--" + field_name.replace("_", "-")
