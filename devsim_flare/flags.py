"""The job command line's flags: one per field of the job's configuration (help and default shown, one ``--help``
group per settings section), plus the run flags (environment, workspace, startup kit, log level, NVFlare's own
``--export`` / ``--export-dir`` convention, consumed by NVFlare's recipe module at import and listed here so
``--help`` shows them)."""

from __future__ import annotations

import argparse
import dataclasses
import difflib

from devsim.config import AsyncConfig, SimulationConfig, flag_name
from devsim.sections import SECTIONS, section_fields
from devsim_flare.recipe import ENVIRONMENTS, LOG_LEVELS


def int_or_word(text: str) -> int | str:
    """An integer when ``text`` is all digits, else the word itself (fields typed ``int | str``)."""
    return int(text) if text.isdigit() else text


SHORT_USAGE = "%(prog)s [flags]   (--help lists every flag)"
"""The usage line: argparse's generated one lists all ~90 flags, which buried a bad flag's one-line error under a
screen of text."""

_PARSERS = {"int": int, "float": float, "str": str, "int | str": int_or_word}
_UNSET = ("none", "None", "null")


def _optional(parse):
    """Parser for a flag that may be unset: ``none`` gives None, anything else goes to ``parse``."""

    def parse_optional(text: str):
        return None if text in _UNSET else parse(text)

    parse_optional.__name__ = parse.__name__
    return parse_optional


class JobArgumentParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose error for an unknown flag names the close ones (``--dp-clip-norm``: "did you mean
    --dp-clip?") and says when a flag belongs to the synchronous jobs only (``not_here``: flag -> why)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.not_here: dict[str, str] = {}

    def error(self, message: str):
        if message.startswith("unrecognized arguments: "):
            hints = [self._hint(token) for token in message.split(": ", 1)[1].split(" ")]
            message += "".join(f"; {hint}" for hint in hints if hint)
        super().error(message)

    def _hint(self, token: str) -> str:
        """What an unknown ``--flag`` (or ``--flag=value``) probably meant; "" for anything else."""
        name = token.split("=", 1)[0]
        if not name.startswith("--"):
            return ""
        if name in self.not_here:
            return f"{name} is {self.not_here[name]}"
        known = {o[2:]: o for o in self._option_string_actions if o.startswith("--")}
        known.update({o[2:]: o for o in self.not_here})
        close = [known[c] for c in difflib.get_close_matches(name[2:], list(known), n=3, cutoff=0.7)]
        if close and close[0] in self.not_here:
            return f"{name}: did you mean {close[0]}? It is {self.not_here[close[0]]}"
        return f"{name}: did you mean {' or '.join(close)}?" if close else ""


def build_parser(description: str, defaults: SimulationConfig | None = None) -> argparse.ArgumentParser:
    """Parser with one flag per field of ``type(defaults)`` (default values from it), grouped by section
    (:data:`devsim.sections.SECTIONS`, one ``--help`` group each), and the run flags.

    Asynchronous configurations leave out the fields that only synchronous rounds use.
    """
    defaults = defaults or SimulationConfig()
    config_cls = type(defaults)
    asynchronous = issubclass(config_cls, AsyncConfig)
    parser = JobArgumentParser(
        description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter, usage=SHORT_USAGE
    )
    parser.set_defaults(config_cls=config_cls)
    fields = {f.name: f for f in dataclasses.fields(config_cls)}
    if asynchronous:
        parser.not_here = {
            flag_name(f.name): "for synchronous rounds only (pt_job_fedavg.py, pt_job_cluster.py)"
            for f in fields.values()
            if f.metadata.get("sync_only")
        }
    for section, names in section_fields(config_cls).items():
        shown = [
            fields[name]
            for name in names
            if not fields[name].metadata.get("internal")
            and not (asynchronous and fields[name].metadata.get("sync_only"))
        ]
        if not shown:
            continue
        group = parser.add_argument_group(SECTIONS[section])
        for f in shown:
            _add_flag(group, f, getattr(defaults, f.name))
    run = parser.add_argument_group("run")
    run.add_argument(
        "--env",
        choices=ENVIRONMENTS,
        default="sim",
        help="sim: NVFlare simulator on this machine; poc: real processes on this machine; "
        "prod: a provisioned deployment (needs --startup-kit)",
    )
    run.add_argument(
        "--gpus",
        default=None,
        metavar="IDS",
        help="sim only: GPU ids to spread the leaf processes over, e.g. 0,1 "
        "(leaf i sees only the (i mod n)-th listed GPU); default: every leaf and the server use the first visible GPU",
    )
    run.add_argument(
        "--leaves-per-host",
        type=int,
        default=None,
        metavar="N",
        help="how many leaf processes share one host's cores (and GPU), which sizes each leaf's worker pool; "
        "default: every leaf in sim and poc, 1 in prod (one leaf client per machine)",
    )
    run.add_argument("--workspace", default="workspace", help="folder for NVFlare workspaces and run outputs")
    run.add_argument("--startup-kit", default=None, help="admin startup kit folder for --env prod")
    run.add_argument(
        "--leave-job-running",
        action="store_true",
        help="prod: on Ctrl-C or SIGTERM stop following the submitted job and leave it running on the deployment "
        "(default: abort it; in sim and poc a signal always stops the run at a checkpoint)",
    )
    run.add_argument("--log-level", choices=LOG_LEVELS, default="WARNING", help="NVFlare console log level")
    run.add_argument(
        "--job-timeout",
        type=float,
        default=24 * 3600.0,
        help="seconds to wait for a poc/prod job before aborting it",
    )
    run.add_argument(
        "--preset",
        default=None,
        metavar="NAME",
        help="start from a preset in app_configs/presets (or a JSON file); explicit flags override it",
    )
    run.add_argument(
        "--resume",
        default=None,
        metavar="RUN_DIR",
        help="continue the run in RUN_DIR from its last checkpoint, with the configuration it was started with",
    )
    run.add_argument(
        "--export",
        action="store_true",
        help="write the job folder instead of running it (for `nvflare simulator DIR`)",
    )
    run.add_argument("--export-dir", default="fl_job", help="folder the job is exported to with --export")
    add_check_flag(run)
    return parser


def add_check_flag(group) -> None:
    """``--check``, on every job's parser (the Collab jobs' run group, the edge job's parser)."""
    group.add_argument(
        "--check",
        action="store_true",
        help="check the flags, the task and the data as a run would, print the settings that differ from the job's "
        "defaults (as fitted to the task), and exit without running (0: the run would start)",
    )


def checked_line(parser: argparse.ArgumentParser, values, what: str, skip: tuple[str, ...] = ()) -> str:
    """``--check``'s line: the settings among ``values`` (name -> value, after fitting to the task) that are flags of
    ``parser`` and differ from its defaults, as flags, ``skip`` left out; ``what`` names the run."""
    flags = {action.dest for action in parser._actions}
    changed = [
        f"{flag_name(name)} {'none' if value is None else value}"
        for name, value in values.items()
        if name in flags and name not in skip and value != parser.get_default(name)
    ]
    listed = ", ".join(changed) or "the job's defaults"
    return f"check: the flags, the task and the data pass; {what} would run with {listed}"


def add_config_flags(group, names: tuple[str, ...], defaults: SimulationConfig | None = None) -> None:
    """The Collab jobs' flags of the configuration fields ``names`` (their help, parsing and ``defaults``' values), on
    a parser or group that builds its own flags otherwise (the edge job)."""
    defaults = defaults or SimulationConfig()
    fields = {f.name: f for f in dataclasses.fields(type(defaults))}
    for name in names:
        _add_flag(group, fields[name], getattr(defaults, name))


def _add_flag(group: argparse._ArgumentGroup, f: dataclasses.Field, default: object) -> None:
    """The flag of configuration field ``f``: ``--name VALUE`` (``none`` unsets an optional one) or, for a bool,
    the pair ``--name`` / ``--no-name``."""
    optional = "None" in str(f.type)
    base = str(f.type).replace("| None", "").strip()
    if base == "bool":
        group.add_argument(
            flag_name(f.name), action=argparse.BooleanOptionalAction, default=default, help=f.metadata["help"]
        )
        return
    parse = _optional(_PARSERS[base]) if optional else _PARSERS[base]
    help_text = f.metadata["help"] + ("; 'none' unsets it" if optional else "")
    group.add_argument(flag_name(f.name), type=parse, default=default, help=help_text)
