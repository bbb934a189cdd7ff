"""Fork servers for NVFlare's simulator processes: forked from the job command, they hold PyTorch, NumPy and NVFlare's
simulator modules already imported and fork each simulator process that NVFlare asks for.

NVFlare 2.9's simulator starts its server process and one worker process per leaf as new interpreters
(``python -m nvflare.private.fed.app.simulator.simulator`` / ``...simulator_worker``); each imports PyTorch and
NVFlare again before it reaches the job, about 1-2 s of CPU a process. :func:`start_fork_server` forks this
(single-threaded) job command twice before it has run any PyTorch computation: each fork listens on its own Unix
socket and imports, while the command goes on validating the run, what its processes need: the server's fork server
NVFlare's simulator modules and communication drivers (:data:`SERVER_IMPORTS`), the leaves' fork server
``torch._dynamo`` and NVFlare's client side (:data:`LEAF_IMPORTS`), each on a core of its own. Before each fork
the fork server freezes its objects (``gc.freeze``), so a child's garbage collections skip what was imported. It
imports without automatic garbage collection (:func:`devsim.resources.collection.pause_for_imports`).
For every request (:class:`devsim_flare.launch.forked_process.ForkedProcess`) it forks a child that becomes what
``python -m <module> <args>`` would have been: the requester's stdin/stdout/stderr, environment, working folder
and session (``setsid``), ``sys.path`` rebuilt from ``PYTHONPATH`` as a new interpreter builds it, this project's
packages dropped from ``sys.modules`` (the job imports them from its own ``custom/`` folder, as NVFlare deploys
it), fresh signal handlers, exit handlers and logging, the glibc arena limit of ``MALLOC_ARENA_MAX`` applied, and
NVFlare's simulator polls shortened from the start (:func:`devsim_flare.sim_polling.shorten_before_start`). The
module then runs as ``__main__``. The job folder, the processes, their command lines and NVFlare's own code are
unchanged; only the interpreter start and the imports are skipped.

The fork server reaps its children and reports each exit status over the request's connection. It ends when the
job command closes it (:meth:`ForkServer.close`), when the command's end of its pipe closes (the command died), or on
SIGTERM, after its children have exited (at most :data:`CHILD_EXIT_WAIT_SECONDS`).

The module is longer than 400 lines: the command's handle, the fork, the serving loop and its children's reaping
share the socket protocol and the lifeline, and split apart they would each need the others' internals.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import importlib
import os
import select
import shutil
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable

from devsim.resources.collection import pause_for_imports, resume_after_imports
from devsim_flare.launch.forked_child import become
from devsim_flare.launch.forked_process import (
    JOB_CONFIG_MODULE,
    SOCKET_ENV,
    fork_server_enabled,
    recv_frame,
    route_popen,
    send_frame,
    unroute_popen,
)

COMM_DRIVER_MODULES = (
    "nvflare.fuel.f3.drivers.tcp_driver",
    "nvflare.fuel.f3.drivers.aio_tcp_driver",
    "nvflare.fuel.f3.drivers.grpc_driver",
    "nvflare.fuel.f3.drivers.aio_grpc_driver",
    "nvflare.fuel.f3.drivers.aio_http_driver",  # aiohttp: ~0.3 s of CPU
    "nvflare.fuel.f3.drivers.file_driver",
)
"""What NVFlare's driver manager imports in a process the first time it creates a cell's connector (each module of
``nvflare.fuel.f3.drivers``): in the simulator's server process on the way to its listeners, in each leaf's worker
before it connects."""
SERVER_IMPORTS = (
    "numpy",
    "torch",
    "nvflare.private.fed.app.simulator.simulator",
    "nvflare.private.fed.app.simulator.simulator_runner",
    *COMM_DRIVER_MODULES,
    "torch.utils.tensorboard",  # the server's metrics writer
)
"""Imported by the server's fork server, one between two requests (a name that fails to import is skipped): what the
simulator's server process needs."""
LEAF_IMPORTS = (
    "torch._dynamo",  # imported by the first optimizer a process builds (1.3-1.9 s of CPU)
    "nvflare.private.fed.app.simulator.simulator_worker",
    *COMM_DRIVER_MODULES,
    "nvflare.collab",
    "nvflare.apis.dxo",
    "torch.func",
    "nvflare.edge.simulation.device_task_processor",
    "nvflare.edge.web.models.job_response",
    "nvflare.edge.web.models.task_response",
    "nvflare.app_opt.pt",  # named by the leaves' app configuration
    "safetensors.torch",
)
"""Imported by the leaves' fork server, one between two requests: what a leaf's worker process imports before and
while it sets up. It runs beside the server's fork server, so ``torch._dynamo`` is imported on the other core while
the simulator's server process starts (one fork server taking both lists made the leaves wait for it: 0.9 s of the
digits demo's start)."""
CHILD_EXIT_WAIT_SECONDS = 10.0
CHILD_CHECK_SECONDS = 2.0
"""How long :func:`forked_children_compute` waits for its child (which takes milliseconds when it can finish)."""
POLL_SECONDS = 0.02


class ForkServer:
    """The job command's handle on a fork server: its socket path and process; ``leaves``, the leaves' fork server
    when it is another one (closed with this one)."""

    def __init__(self, pid: int, folder: str, socket_path: str, lifeline: int, leaves: ForkServer | None = None):
        self.pid = pid
        self.folder = folder
        self.socket_path = socket_path
        self._lifeline = lifeline
        self.leaves = leaves

    def close(self, wait_seconds: float = CHILD_EXIT_WAIT_SECONDS) -> None:
        """Stop the fork server (after its children, within ``wait_seconds``), reap it, remove its socket; the
        leaves' fork server first."""
        if self.leaves is not None:
            self.leaves.close(wait_seconds)
        unroute_popen(JOB_CONFIG_MODULE)
        if os.environ.get(SOCKET_ENV) == self.socket_path:
            del os.environ[SOCKET_ENV]
        with contextlib.suppress(OSError):
            os.close(self._lifeline)
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGTERM)
        deadline = time.monotonic() + wait_seconds
        while time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError):
                if os.waitpid(self.pid, os.WNOHANG)[0]:
                    break
            time.sleep(POLL_SECONDS)
        else:
            with contextlib.suppress(ProcessLookupError, ChildProcessError):
                os.kill(self.pid, signal.SIGKILL)
                os.waitpid(self.pid, 0)
        shutil.rmtree(self.folder, ignore_errors=True)


def start_fork_server(
    server_imports: tuple[str, ...] = SERVER_IMPORTS,
    leaf_imports: tuple[str, ...] | None = LEAF_IMPORTS,
    leaves: int | None = None,
    check_children: bool = False,
    forked: ForkServer | None = None,
) -> ForkServer | None:
    """Fork the fork servers from this process: one for the simulator's server process, importing ``server_imports``,
    and one for the leaves' workers, importing ``leaf_imports`` (None: the first one starts the leaves too) until it
    has started ``leaves`` workers (None: no limit; the imports left then would only compete with the leaves' set-up,
    whose batching probe is timed). Names the leaves' socket in :data:`SOCKET_ENV` for the processes this one starts
    and routes this process's start of the simulator to the first. None (nothing started) when
    ``DEVSIM_FORK_SERVER=0``, when this process runs other Python threads (a fork would copy their locks mid-use),
    when the platform cannot fork, or, with ``check_children`` (a process that may have run PyTorch already, such as
    a script calling ``recipe.execute()``), when a forked child of this process cannot run PyTorch's parallel code
    (:func:`forked_children_compute`). ``forked``: fork servers this command forked earlier
    (:func:`fork_servers`, from :mod:`devsim_flare.launch.early_fork`), taken instead of forking."""
    if forked is not None:
        return _route_to(forked)
    if not fork_server_enabled() or threading.active_count() > 1 or not hasattr(os, "fork"):
        return None
    if check_children and not forked_children_compute():
        print(
            "simulator processes start as new interpreters: a child forked from this process could not run PyTorch "
            "(it has run a parallel PyTorch computation already)",
            file=sys.stderr,
            flush=True,
        )
        return None
    return _route_to(fork_servers(server_imports, leaf_imports, leaves))


def fork_servers(
    server_imports: tuple[str, ...] = SERVER_IMPORTS,
    leaf_imports: tuple[str, ...] | None = LEAF_IMPORTS,
    leaves: int | None = None,
) -> ForkServer:
    """Fork the server's fork server and (unless ``leaf_imports`` is None) the leaves' from this process now; the
    handle holds both. Nothing is routed to them yet (:func:`start_fork_server` does that). With ``leaves`` unknown
    (None) the leaves' fork server imports only until its first leaf runs: the leaves are asked for together, and
    an import after a child's fork would serve none of them, only take CPU from their set-up."""
    folder = tempfile.mkdtemp(prefix="devsim-fork-")
    leaf_server = None
    if leaf_imports is not None:  # with no leaf count, no imports once a leaf runs
        leaf_server = _fork_one(folder, "leaves", leaf_imports, requests=leaves, beside_children=leaves is not None)
    return _fork_one(folder, "server", server_imports, leaf_server, requests=None if leaf_server is None else 1)


def _route_to(server: ForkServer) -> ForkServer:
    """Name the leaves' socket for the processes this one starts and route this process's start of the simulator to
    the server's fork server."""
    os.environ[SOCKET_ENV] = (server.leaves or server).socket_path
    importlib.import_module(JOB_CONFIG_MODULE)
    route_popen(JOB_CONFIG_MODULE, server.socket_path)  # the simulator's server process, started by this command
    return server


def forked_children_compute(timeout: float = CHILD_CHECK_SECONDS) -> bool:
    """Whether a child forked from this process now finishes a parallel PyTorch computation within ``timeout``
    seconds. Once a process has run one, GNU OpenMP's thread pool belongs to it, and a forked child's first
    parallel region waits for threads the fork did not copy, for ever; a fork server forked from such a process
    would hang every simulator process it starts. The child is killed when it does not finish."""
    pid = os.fork()
    if pid == 0:  # the check's child: a computation that PyTorch splits over its threads, then exit
        code = 1
        try:
            import torch

            torch.set_num_threads(max(2, torch.get_num_threads()))
            torch.ones(1 << 22).sum()
            code = 0
        finally:
            os._exit(code)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status) == 0
        time.sleep(0.002)
    with contextlib.suppress(ProcessLookupError, ChildProcessError):
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    return False


def _fork_one(
    folder: str,
    name: str,
    imports: tuple[str, ...],
    leaves: ForkServer | None = None,
    requests: int | None = None,
    beside_children: bool = True,
) -> ForkServer:
    """Fork one fork server, listening on ``<folder>/<name>.sock``, that imports ``imports`` between requests until
    it has served ``requests`` of them (None: no limit), and, without ``beside_children``, only while none of its
    children runs; ``leaves``: the fork server forked before it, whose lifeline it must not hold."""
    path = os.path.join(folder, f"{name}.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(16)
    read_end, write_end = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # the fork server
        code = 1
        try:
            os.close(write_end)
            if leaves is not None:  # its end of the other server's lifeline would keep that one from seeing EOF
                os.close(leaves._lifeline)
            code = _serve(listener, read_end, imports, requests, import_beside_children=beside_children)
        finally:
            shutil.rmtree(folder, ignore_errors=True)  # also when the command died without closing it
            os._exit(code)
    listener.close()
    os.close(read_end)
    return ForkServer(pid, folder, path, write_end, leaves)


def _serve(
    listener: socket.socket,
    lifeline: int | None,
    imports: tuple[str, ...],
    requests: int | None = None,
    idle_seconds: float | None = None,
    child_wait: float | None = CHILD_EXIT_WAIT_SECONDS,
    stop_orphans: bool = False,
    before_exit: Callable[[], None] | None = None,
    import_beside_children: bool = True,
    after_imports: Callable[[], None] | None = None,
) -> int:
    """The fork server's loop: fork a child per request, report each child's exit; returns the exit code. The
    ``imports`` are taken one by one between requests, so a request that comes early waits for one import at most and
    gets what is imported by then (waiting for all of them made the digits demo's command -> server process 0.8 s
    longer, median of 3); none after ``requests`` requests (None: no limit), and, without ``import_beside_children``,
    none while a child runs (they would take CPU from it; the imports go on once it has ended).

    It ends when ``lifeline`` (a pipe's read end; None: none) reads EOF or on SIGTERM, after its children have exited
    (waiting ``child_wait`` seconds at most; None: as long as they run), or after ``idle_seconds`` without a child
    (None: never). With ``stop_orphans``, a child whose requester's connection closes before the child has exited
    gets SIGTERM (its requester died or gave up on it). ``before_exit`` runs before a SIGTERM ends it at once (no
    child running: the exit does not wait for an import in progress); ``after_imports`` once the last of ``imports``
    is taken."""
    closing = []
    children: dict[int, socket.socket] = {}
    orphans: set[int] = set()

    def on_sigterm(*_) -> None:
        if not children:  # nothing to report: a command that ends early waits for nothing
            if before_exit is not None:
                before_exit()
            os._exit(0)
        closing.append(True)

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the job command handles Ctrl-C for the whole run
    signal.signal(signal.SIGTERM, on_sigterm)
    atexit._clear()
    pause_for_imports()  # no collections of its growing heap while it imports (its children collect again)
    pending, served = list(imports), 0
    closed_at = None
    idle_since = time.monotonic()
    watched = [listener] if lifeline is None else [listener, lifeline]
    while True:
        if not pending:
            resume_after_imports()
        _reap(children)
        if children:
            idle_since = time.monotonic()
        if closing and closed_at is None:
            closed_at = time.monotonic()
            listener.close()
        if closed_at is not None:
            if not children or (child_wait is not None and time.monotonic() - closed_at > child_wait):
                return 0
            requesters = _requesters(children, orphans) if stop_orphans else {}
            readable = select.select(list(requesters), [], [], POLL_SECONDS)[0] if requesters else []
            if not requesters:
                time.sleep(POLL_SECONDS)
            _stop_children_of(readable, requesters, orphans)
            continue
        if idle_seconds is not None and not pending and time.monotonic() - idle_since > idle_seconds:
            return 0
        requesters = _requesters(children, orphans) if stop_orphans else {}
        importing = bool(pending) and (import_beside_children or not children)
        readable = select.select([*watched, *requesters], [], [], 0.0 if importing else POLL_SECONDS)[0]
        if lifeline is not None and lifeline in readable:  # the job command closed its end (or died)
            closing.append(True)
        elif listener in readable:
            conn, _ = listener.accept()
            _start_child(conn, listener, lifeline, children)
            served += 1
            if requests is not None and served >= requests:
                pending.clear()
        elif importing:
            name = pending.pop(0)
            with contextlib.suppress(Exception):
                importlib.import_module(name)
            if threading.active_count() > 1 and not children:  # a fork would copy that thread's locks mid-use
                print(f"fork server: importing {name} started a thread; no more forks from here", file=sys.stderr)
                return 1
            if not pending and after_imports is not None:
                after_imports()
        _stop_children_of(readable, requesters, orphans)


def _requesters(children: dict[int, socket.socket], orphans: set[int]) -> dict[socket.socket, int]:
    """Request connection -> child pid, for the children not yet sent SIGTERM."""
    return {conn: pid for pid, conn in children.items() if pid not in orphans}


def _stop_children_of(readable: list, requesters: dict[socket.socket, int], orphans: set[int]) -> None:
    """SIGTERM each child whose requester's connection is readable: a requester never writes after its request, so
    its connection closed (the requester died or gave up on the child)."""
    for conn in readable:
        if conn in requesters:
            with contextlib.suppress(ProcessLookupError):
                os.kill(requesters[conn], signal.SIGTERM)
            orphans.add(requesters[conn])


def _reap(children: dict[int, socket.socket]) -> None:
    """Report the exit of every child that has ended to its requester."""
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is not None:
            with contextlib.suppress(OSError):
                send_frame(conn, {"returncode": os.waitstatus_to_exitcode(status)})
            conn.close()


def _closed(conn: socket.socket) -> bool:
    """Whether the other end of ``conn`` has closed it (a requester writes nothing after its request)."""
    if not select.select([conn], [], [], 0.0)[0]:
        return False
    try:
        return conn.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


def _start_child(conn: socket.socket, listener: socket.socket, lifeline: int | None, children: dict) -> None:
    """Read one request from ``conn``, fork its child and answer its pid (the connection then waits for its exit)."""
    try:
        request, fds = recv_frame(conn, max_fds=3)
    except (OSError, ValueError):
        conn.close()
        return
    if request is None or len(fds) != 3 or _closed(conn):  # closed: its requester gave up waiting for the answer
        for fd in fds:
            os.close(fd)
        conn.close()
        return
    stopping = {signal.SIGTERM, signal.SIGINT}
    signal.pthread_sigmask(signal.SIG_BLOCK, stopping)  # held until the child has its own handlers
    gc.freeze()  # what is imported stays out of the child's collections (and its pages unwritten)
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            for sock in (listener, conn, *children.values()):
                sock.close()
            if lifeline is not None:
                os.close(lifeline)
            code = become(request, fds)
        except BaseException:  # noqa: BLE001 - the child must end here whatever happened
            import traceback

            traceback.print_exc()
        finally:
            os._exit(code)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, stopping)
    for fd in fds:
        os.close(fd)
    children[pid] = conn
    try:
        send_frame(conn, {"pid": pid})
    except OSError:
        pass
