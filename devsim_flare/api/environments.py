"""Where a recipe runs: the simulator, POC mode or a provisioned deployment (the command line's ``--env``)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar


@dataclasses.dataclass(frozen=True)
class SimEnv:
    """NVFlare's simulator on this machine (``--env sim``): a server process and one process per leaf.

    ``workspace`` holds NVFlare's workspaces and, unless ``output_dir`` is set, the run folder
    (``<workspace>/runs/<method>-...``). ``gpus``: host GPU ids to spread the leaves over (``"0,1"``)."""

    workspace: str = "workspace"
    log_level: str = "WARNING"
    gpus: str | None = None
    leaves_per_host: int | None = None
    name: ClassVar[str] = "sim"


@dataclasses.dataclass(frozen=True)
class PocEnv:
    """Real server and leaf processes on this machine (NVFlare's POC mode, ``--env poc``); ``job_timeout`` in
    seconds bounds the wait for the job."""

    workspace: str = "workspace"
    log_level: str = "WARNING"
    job_timeout: float = 24 * 3600.0
    leaves_per_host: int | None = None
    name: ClassVar[str] = "poc"


@dataclasses.dataclass(frozen=True)
class ProdEnv:
    """A provisioned deployment (``--env prod``): the job is submitted with the admin's ``startup_kit`` and its run
    folder downloaded into ``output_dir`` (or ``<workspace>/runs/...``) when it ends. A signal to this process aborts
    the job, or with ``leave_job_running`` stops following it and leaves it running."""

    startup_kit: str
    workspace: str = "workspace"
    job_timeout: float = 24 * 3600.0
    log_level: str = "WARNING"
    leave_job_running: bool = False
    name: ClassVar[str] = "prod"


Environment = SimEnv | PocEnv | ProdEnv
