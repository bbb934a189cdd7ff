"""Build the NVFlare job for a run (a Collab recipe) and the environment to run it in.

A recipe puts :class:`~devsim_flare.servers.sync_server.FedAvgServer` on the server and one
:class:`~devsim_flare.leaf.LeafNode` on every client site. Environments: ``sim`` (NVFlare's
simulator, one process per leaf on this machine), ``poc`` (real server and client processes on
this machine), ``prod`` (a provisioned deployment, given its admin startup kit).
"""

from __future__ import annotations

import copy
import json
import os

from nvflare.apis.job_def import ALL_SITES
from nvflare.collab import CollabRecipe
from nvflare.recipe import PocEnv, SimEnv

from devsim.config import ConfigError, SimulationConfig
from devsim.observe.checkpoint import CARRIED_RUN_FOLDER
from devsim.observe.results import RECORDS_LOG
from devsim.observe.round_timeout import RoundTimeout
from devsim.tasks.contract import SHIPPED_FOLDER, source_file
from devsim_flare.launch.cuda_warmup import CudaWarmup
from devsim_flare.leaf import LeafNode
from devsim_flare.runtime_defaults import runtime_defaults_enabled

ENVIRONMENTS = ("sim", "poc", "prod")
SHIPPED_PACKAGES = ("devsim", "devsim_flare", "processors")
SHIPPED_DATA = ("app_configs",)
# Seconds NVFlare's server tells a client to wait before asking for its next task (NVFlare: 2). The Collab
# runtime starts each client with two pulled tasks (sync, setup), so the default costs ~2 s of idle start-up
# per job; device jobs themselves travel as Collab calls, not pulled tasks.
TASK_REQUEST_INTERVAL = 0.2
DEAD_CLIENT_GRACE_SECONDS = 1e9
"""NVFlare's ``dead_client_grace_period`` for the job's server: seconds after a client's death is reported before
its controller counts the client disconnected and aborts the job when fewer than the job's ``min_clients`` (every
leaf) remain (60 s by default). The run's own rule, ``--min-leaves``, decides about lost leaves instead."""
CUDA_WARMUP_ID = "devsim_cuda_warmup"
"""The component id of :class:`~devsim_flare.launch.cuda_warmup.CudaWarmup` in the server's and each leaf's app."""
_REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class DevsimRecipe(CollabRecipe):
    """A Collab recipe whose job folder carries this project's packages whole, and the run's task file.

    NVFlare copies only the modules it finds by scanning imports, without package ``__init__``
    files, which would shadow an installed copy with a partial one. Shipping every source file
    of the packages keeps the job self-contained: a site needs only NVFlare, PyTorch and NumPy (and
    what the task file itself imports). A user's task file goes to ``custom/devsim_user_task/``, where every
    site loads it from (:func:`devsim.tasks.contract.locate`).
    """

    task_file: str | None = None
    app_params: dict | None = None
    """Top-level values written into the server's and every leaf's app config (NVFlare reads its config vars there
    first, so they hold in the simulator, POC and production alike): see :func:`tensor_transfer_params`."""
    carried_checkpoint: str | None = None
    """A checkpoint.pt the server app carries in ``custom/devsim_resume/``, with the ``records.jsonl`` beside it (a job
    resubmitted to continue from it)."""

    def finalize(self):
        if self._finalized:
            return self._job
        job = super().finalize()
        # every file of these packages is shipped below: NVFlare need not parse the server's and the leaf's modules
        # and all they import to find what to copy (~0.6 s of the command's CPU before the simulator starts)
        job.set_app_packages(list(SHIPPED_PACKAGES))
        job.to_server({"server": {"task_request_interval": TASK_REQUEST_INTERVAL}})
        job.to_server({"dead_client_grace_period": DEAD_CLIENT_GRACE_SECONDS})
        targets = self.configured_sites() or [ALL_SITES]
        job.to_server(CudaWarmup(), id=CUDA_WARMUP_ID)  # CUDA's start while NVFlare starts the other processes
        for target in targets:
            job.to(CudaWarmup(), target, id=CUDA_WARMUP_ID)
        if self.app_params:
            job.to_server(dict(self.app_params))
            for target in targets:
                job.to(dict(self.app_params), target)
        sources = package_sources()
        if self.task_file:
            sources.append((self.task_file, SHIPPED_FOLDER))
        for source, dest_dir in sources:
            job.add_file_to_server(source, dest_dir=dest_dir, app_folder_type="custom")
            for target in targets:
                job.add_file_to(source, target=target, dest_dir=dest_dir, app_folder_type="custom")
        if self.carried_checkpoint:
            records_log = os.path.join(os.path.dirname(self.carried_checkpoint), RECORDS_LOG)
            for carried in [self.carried_checkpoint] + ([records_log] if os.path.isfile(records_log) else []):
                job.add_file_to_server(carried, dest_dir=CARRIED_RUN_FOLDER, app_folder_type="custom")
        return job


def package_sources() -> list[tuple[str, str]]:
    """(source file, destination folder inside ``custom/``): every .py file of the shipped packages and
    the presets (JSON) under ``app_configs``, which the code finds relative to the package root."""
    entries = []
    for top, suffix in [(p, ".py") for p in SHIPPED_PACKAGES] + [(d, ".json") for d in SHIPPED_DATA]:
        for folder, dirs, files in os.walk(os.path.join(_REPO_ROOT, top)):
            dirs[:] = sorted(d for d in dirs if d != "__pycache__")
            relative = os.path.relpath(folder, _REPO_ROOT)
            entries.extend((os.path.join(folder, f), relative) for f in sorted(files) if f.endswith(suffix))
    return entries


def build_recipe(
    config: SimulationConfig,
    server_cls: type,
    job_name: str,
    leaves_on_host: int = 1,
    leaves_on_gpu: int = 1,
    sync_timeout: float | None = None,
):
    """A Collab recipe with ``server_cls`` on the server and a leaf node on each of the leaf sites.

    ``leaves_on_host`` is how many leaf processes share this machine's cores (all of them in
    ``sim`` and ``poc``; 1 in production) and ``leaves_on_gpu`` how many share one GPU; both size
    each leaf's worker pool, and the first tells the server whether a core is free for writing checkpoints in the
    background. ``sync_timeout`` is how long (seconds) the server waits for every leaf to
    start before giving up; default ``max(60, round_timeout)`` (``--round-timeout`` unset: the first round's wait,
    :data:`devsim.observe.round_timeout.FIRST_SECONDS`), which leaves time for sites started by hand.
    """
    settings = config.to_dict()
    first_wait = RoundTimeout(config.round_timeout).seconds
    server = server_cls(settings=settings, leaves_on_host=leaves_on_host)
    leaf = LeafNode(
        settings=settings,
        num_workers=config.num_workers,
        leaves_on_host=leaves_on_host,
        processor=server_cls.processor,
        leaves_on_gpu=leaves_on_gpu,
    )
    recipe = DevsimRecipe(
        job_name=job_name,
        server=server,
        client=leaf,
        min_clients=config.num_leaf_nodes,
        sync_task_timeout=sync_timeout if sync_timeout is not None else max(60.0, first_wait),
        max_call_threads_for_server=max(8, 2 * config.num_leaf_nodes),
        max_call_threads_for_client=4,
    )
    recipe.task_file = source_file(config.task) if config.task else None
    recipe.app_params = tensor_transfer_params(config.tensor_transfer)
    return recipe


def tensor_transfer_params(mode: str) -> dict:
    """App config values for ``--tensor-transfer`` (already resolved from ``auto``, see
    :func:`devsim.tasks.fit.tensor_transfer_for`).

    NVFlare's NumPy decomposer sends every array by reference: the message carries an id and the receiver then
    downloads the arrays from the sender in 2 MiB chunks, a second exchange on every call. ``np_download_chunk_size``
    0 makes it put the arrays inside the message instead. Measured with a bare Collab echo in the simulator (2-core
    CPU): a call with 8 floats each way 16 -> 3.2 ms, with 62k floats 24 -> 5.4 ms, and the server's CPU per call
    11 -> 2.3 ms. ``download`` (and ``auto``, unresolved) leave NVFlare's default.
    """
    return {"np_download_chunk_size": 0} if mode == "inline" else {}


LOG_LEVELS = ("WARNING", "INFO", "DEBUG")


def console_log_config(level: str, folder: str) -> str:
    """Path of an NVFlare log configuration (written into ``folder``) whose console shows ``level`` and up.

    Log files in the workspace keep NVFlare's usual detail; only the console is quietened, so the
    round lines printed by the server stand out at the default level.
    """
    if level not in LOG_LEVELS:
        raise ConfigError("log_level", f"{level!r} is not one of the allowed values: {', '.join(LOG_LEVELS)}")
    from nvflare.fuel.utils.log_utils import concise_log_dict

    config = copy.deepcopy(concise_log_dict)
    config["handlers"]["consoleHandler"]["level"] = level
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"console_log_{level.lower()}.json")
    with open(path, "w", encoding="utf-8") as stream:
        json.dump(config, stream, indent=1)
    return path


RUNTIME_ENV_DEFAULTS = {
    "NVFLARE_STREAMING_RETRY_WAIT": "2",
    "NVFLARE_STREAMING_RETRY_TIMEOUT": "2",
    "NVFLARE_STREAMING_CHUNK_SIZE": "262144",
    "MALLOC_ARENA_MAX": "2",
}


def apply_runtime_env_defaults(environ=None) -> dict[str, str]:
    """Set this project's defaults for NVFlare's streaming and glibc's allocator; return what was set.

    The simulator and POC start every server and leaf process from this process's environment, so
    the variables set here reach all of them (glibc reads ``MALLOC_*`` when a process starts; NVFlare
    reads ``NVFLARE_<config var>`` when no comm config of the site sets that var). A variable that is
    already set is kept; ``DEVSIM_RUNTIME_ENV_DEFAULTS=0`` turns them all off. Measured with
    ``benchmarks/memory_growth.py`` (2 leaves, small CNN, 2-core CPU, one run each): over 500 rounds
    the server went 320 -> 532 MB and the leaves 450 -> 540 and 447 -> 529 MB without these defaults,
    and 287 -> 334 MB and 429 -> 445 and 429 -> 446 MB with them; open files stayed flat either way.

    - ``NVFLARE_STREAMING_RETRY_WAIT=2``, ``NVFLARE_STREAMING_RETRY_TIMEOUT=2`` (NVFlare: 5 and 60 s).
      NVFlare keeps every received reply stream, with a timer thread, for wait + timeout seconds to
      re-acknowledge retried chunks: at about 6 streams a round the server held 2,500 threads (the
      leaves 900) with 65 s, and about 200 (the leaves about 80) with 4 s. The cost: a chunk still
      unacknowledged after 2 s is sent again, and after 4 s its stream fails (NVFlare allows 65 s).
    - ``NVFLARE_STREAMING_CHUNK_SIZE=262144`` (NVFlare: 1 MiB). Every sent stream allocates a buffer
      of one chunk, which stays in a reference cycle until a full garbage collection (rare in a
      process with NVFlare and PyTorch loaded): with 1 MiB the server's RSS swung by up to 90 MB,
      with 256 KiB by 20-40 MB. The cost: 45 MB payloads took about 18% longer to exchange
      (the retired benchmark ``collab_echo_memory.py --params 11200000``); the small CNN fits in one chunk.
    - ``MALLOC_ARENA_MAX=2`` (glibc: 8 per core) bounds the allocator arenas that NVFlare's many
      short-lived threads spread allocations over: from round 20 to 300 the leaves grew 10-12 MB
      without it and 5-6 MB with it. No measurable cost on training or evaluation speed.
    """
    environ = os.environ if environ is None else environ
    if not runtime_defaults_enabled(environ):
        return {}
    applied = {}
    for name, value in RUNTIME_ENV_DEFAULTS.items():
        if name not in environ:
            environ[name] = applied[name] = value
    return applied


def build_env(
    kind: str,
    num_leaf_nodes: int,
    workspace: str,
    log_level: str = "WARNING",
    gpu_groups: str | None = None,
):
    """The execution environment named ``kind``, ``sim`` or ``poc`` (``prod`` submits through
    :func:`devsim_flare.deployment.prod_run.run_on_deployment`, which checks the deployment first).

    ``sim`` and ``poc`` launch their processes from this one, after
    :func:`apply_runtime_env_defaults` has set the project's runtime defaults. ``gpu_groups`` is
    NVFlare's ``-gpu`` string, one group per leaf (:func:`devsim.resources.gpu_placement.leaf_gpu_groups`);
    only ``sim`` places leaves (the CLI refuses ``--gpus`` elsewhere).
    """
    if kind in ("sim", "poc"):
        apply_runtime_env_defaults()
    if kind == "sim":
        return SimEnv(
            num_clients=num_leaf_nodes,
            workspace_root=workspace,
            log_config=console_log_config(log_level, workspace),
            gpu_config=gpu_groups,
        )
    if kind == "poc":
        os.environ.setdefault("NVFLARE_POC_WORKSPACE", os.path.join(workspace, "poc"))
        return PocEnv(num_clients=num_leaf_nodes)
    raise ConfigError("env", f"{kind!r} is not one of the allowed values: {', '.join(ENVIRONMENTS)}")
