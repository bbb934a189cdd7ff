"""``--env prod`` for the Collab jobs: read the admin startup kit, check in seconds that the server answers and
that the expected leaves are connected, then (once the job is submitted) follow the server's results through
the admin API while it runs and download them into the local ``--output-dir``.

The server writes its run folder as in every environment, into ``devsim/`` inside its job folder on the server
host (:func:`devsim_flare.servers.base.output_dir_for`); NVFlare stores that job folder with the job when it
ends, and the admin downloads it. Nothing here needs a path on the server host.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import time
from dataclasses import dataclass

from devsim.observe.progress import format_metrics
from devsim_flare.deployment.processes import connected_clients, open_admin_session
from devsim_flare.deployment.workspace import DeploymentError

ADMIN_CONFIG = os.path.join("startup", "fed_admin.json")
LOGIN_TIMEOUT_SECONDS = 10.0
SERVER_RUN_FOLDER = "devsim"
"""The server's run folder inside its job folder when the job names no ``--output-dir`` (prod never does)."""


@dataclass(frozen=True)
class AdminKit:
    """An admin user's startup kit: its folder and what ``startup/fed_admin.json`` says of the server."""

    folder: str
    username: str
    host: str
    port: int

    def open_session(self, timeout: float = 10.0):
        """An admin session with this kit (the folder may have any name)."""
        return open_admin_session(self.username, self.folder, f"{self.host}:{self.port}", timeout)


def read_admin_kit(folder: str) -> AdminKit:
    """The kit in ``folder``; ValueError with a one-line reason when it is not an admin startup kit."""
    folder = os.path.abspath(folder)
    if not os.path.isdir(folder):
        raise ValueError(f"folder {folder!r} does not exist")
    path = os.path.join(folder, ADMIN_CONFIG)
    try:
        with open(path, encoding="utf-8") as stream:
            admin = json.load(stream)["admin"]
        return AdminKit(folder, str(admin["username"]), str(admin["host"]), int(admin["port"]))
    except FileNotFoundError:
        raise ValueError(
            f"{folder!r} is not an admin startup kit (no {ADMIN_CONFIG}); give the folder `nvflare provision` "
            "wrote for a user of type admin, e.g. prod_00/admin@example.org"
        ) from None
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ValueError(f"{path} is not a readable admin configuration ({error})") from None


def check_deployment(kit: AdminKit, num_leaf_nodes: int, timeout: float = LOGIN_TIMEOUT_SECONDS) -> list[str]:
    """Log in as the kit's admin (at most ``timeout`` seconds) and return the connected leaf sites; raises
    DeploymentError when the server does not answer or the number of leaves is not ``num_leaf_nodes``."""
    try:
        session = kit.open_session(timeout)
    except DeploymentError as error:
        raise DeploymentError(
            f"{error} (server address from {os.path.join(kit.folder, ADMIN_CONFIG)}; is the deployment started, "
            "and is this the kit of its project?)"
        ) from None
    try:
        leaves = connected_clients(session)
    finally:
        with contextlib.suppress(Exception):
            session.close()
    if len(leaves) != num_leaf_nodes:
        raise DeploymentError(
            f"--num-leaf-nodes is {num_leaf_nodes} but {len(leaves)} leaf sites are connected to the server "
            f"({', '.join(leaves) or 'none'}); start the missing ones or set --num-leaf-nodes {len(leaves)}"
        )
    return leaves


def record_line(record: dict) -> str:
    """One progress line for a round (sync) or version (async) record of results.json."""
    if "version" in record:
        head = f"version {record['version']}  sim-time {record.get('simulated_time', 0.0):.1f}s"
    else:
        head = f"round {record['round']}"
    figures = format_metrics(record["loss"], record.get("metrics", {})) if "loss" in record else "(no evaluation)"
    dead = record.get("dead_leaves") or []
    return f"{head}  {figures}" + (f"  without {', '.join(dead)} (not answering)" if dead else "")


class ProdJob:
    """A submitted job followed through one admin session: its status, the server's results.json (read with
    the admin ``cat`` command on the server, so a line is printed for every new round or version record), abort
    and download. A dropped connection is opened again at the next call."""

    def __init__(self, kit: AdminKit, job_id: str, printer=print):
        self.kit = kit
        self.job_id = job_id
        self.printer = printer
        self.shown = 0
        self.finished = False
        self.synchronous = False
        """Whether the run's records are rounds (a synchronous run, which a resubmission can take leaves back into)."""
        self.dropped: set[str] = set()
        """Leaves the server dropped from the run (``dead_leaves`` of its records)."""
        self._session = None

    def _call(self, method: str, *args, **kwargs):
        if self._session is None:
            self._session = self.kit.open_session(LOGIN_TIMEOUT_SECONDS)
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                return getattr(self._session, method)(*args, **kwargs)
        except Exception:
            self.close()
            raise

    def get_status(self) -> str | None:
        try:
            return self._call("get_job_meta", self.job_id).get("status")
        except Exception:  # the server is unreachable for a moment: the caller's deadline bounds the wait
            return None

    def poll(self) -> bool:
        """Print the records the server added since the last call; True once its summary is written."""
        try:
            results = json.loads(
                self._call("cat_target", "server", file=f"{self.job_id}/{SERVER_RUN_FOLDER}/results.json")
            )
        except Exception:  # not written yet, written half-way, or the job folder is gone (the job ended)
            return self.finished
        for record in results.get("rounds", [])[self.shown :]:
            self.printer(record_line(record))
            self.dropped.update(record.get("dead_leaves") or [])
            self.synchronous = "round" in record
        self.shown = max(self.shown, len(results.get("rounds", [])))
        self.finished = bool(results.get("summary"))
        return self.finished

    def returned_leaves(self) -> list[str]:
        """Leaves the server dropped from this run whose client answers again without running this job (its host
        was started again): NVFlare does not start a running job on a client that registers later, so the run
        can take such a leaf back only in a new job. A client that is gone answers ``no_reply``."""
        if not self.dropped or self.finished:
            return []
        try:
            entries = self._call("get_client_job_status", sorted(self.dropped)) or []
        except Exception:
            return []
        back = []
        for leaf in sorted(self.dropped):
            mine = [entry for entry in entries if entry.get("client_name") == leaf]
            answering = mine and all(entry.get("status") != "no_reply" for entry in mine)
            if answering and not any(self.job_id in json.dumps(entry, default=str) for entry in mine):
                back.append(leaf)
        return back

    def abort(self) -> None:
        with contextlib.suppress(Exception):
            self._call("abort_job", self.job_id)

    def get_result(self, timeout: float = 60.0) -> str | None:
        """Download the job's stored workspace (into the admin kit's ``transfer/`` folder) once the job has ended
        (an aborted job takes a few seconds; at most ``timeout`` seconds); None when it fails."""
        deadline = time.monotonic() + timeout
        while not (self.get_status() or "").startswith("FINISHED") and time.monotonic() < deadline:
            time.sleep(1.0)
        try:
            return self._call("download_job_result", self.job_id)
        except Exception as error:
            self.printer(f"could not download the result of job {self.job_id}: {error}")
            return None

    def close(self) -> None:
        if self._session is not None:
            with contextlib.suppress(Exception):
                self._session.close()
            self._session = None


def copy_run_folder(job_result: str | None, output_dir: str) -> bool:
    """Copy the server's run folder out of a downloaded job result (``<result>/devsim/`` or below it) into
    ``output_dir``; False when the download holds none."""
    if not job_result or not os.path.isdir(job_result):
        return False
    for folder, dirs, files in os.walk(job_result):
        if os.path.basename(folder) == SERVER_RUN_FOLDER and "results.json" in files:
            shutil.copytree(folder, output_dir, dirs_exist_ok=True)
            return True
        dirs.sort()
    return False
