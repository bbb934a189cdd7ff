"""The client side of the fork server: NVFlare's ``subprocess.Popen`` of its simulator modules, answered by a process
the fork server (:mod:`devsim_flare.launch.fork_server`) forks.

NVFlare 2.9 starts the simulator's server process from the job command (``nvflare.job_config.fed_job_config``) and
each leaf's worker process from the simulator's runner (``nvflare.private.fed.app.simulator.simulator_runner``), both
as ``subprocess.Popen([sys.executable, "-m", <module>, ...], preexec_fn=os.setsid, env=...)``. :func:`route_popen`
gives such a module a ``subprocess`` whose ``Popen`` sends those two commands (and only those, with no other
options) to the fork server named in :data:`SOCKET_ENV`, and returns a :class:`ForkedProcess`, which answers
``pid``, ``poll``, ``wait``, ``terminate``, ``kill`` and ``returncode`` as ``Popen`` does. Anything else, or a fork
server that cannot be reached, goes to the real ``subprocess.Popen``. Imports nothing heavy: the package
``devsim_flare`` calls :func:`route_simulator_workers` when it is first imported (in the simulator's server process,
when NVFlare loads the server app).
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import time
from types import ModuleType
from typing import Any

SOCKET_ENV = "DEVSIM_FORK_SERVER_SOCKET"
"""The fork server's Unix socket path, set by the job command for the processes it starts."""
SWITCH_ENV = "DEVSIM_FORK_SERVER"
"""``0`` turns the fork server off: every simulator process starts as a new interpreter, as NVFlare starts it."""
SIMULATOR_MODULE = "nvflare.private.fed.app.simulator.simulator"
WORKER_MODULE = "nvflare.private.fed.app.simulator.simulator_worker"
FORKABLE_MODULES = (SIMULATOR_MODULE, WORKER_MODULE)
JOB_CONFIG_MODULE = "nvflare.job_config.fed_job_config"
RUNNER_MODULE = "nvflare.private.fed.app.simulator.simulator_runner"
_HEADER = struct.Struct("!I")
STDIO_FDS = (0, 1, 2)


def fork_server_enabled(environ=None) -> bool:
    """False when ``DEVSIM_FORK_SERVER=0`` in ``environ`` (default ``os.environ``)."""
    environ = os.environ if environ is None else environ
    return environ.get(SWITCH_ENV, "1").strip() != "0"


def send_frame(sock: socket.socket, message: dict, fds: tuple[int, ...] = ()) -> None:
    """Send ``message`` (JSON) as one length-prefixed frame; ``fds`` travel with its header (SCM_RIGHTS)."""
    body = json.dumps(message).encode()
    header = _HEADER.pack(len(body))
    if fds:
        socket.send_fds(sock, [header], list(fds))
    else:
        sock.sendall(header)
    sock.sendall(body)


def recv_frame(sock: socket.socket, max_fds: int = 0) -> tuple[dict | None, list[int]]:
    """One frame from ``sock``: (message, received fds); (None, []) when the peer closed before a whole frame."""
    if max_fds:
        data, fds, _flags, _addr = socket.recv_fds(sock, _HEADER.size, max_fds)
    else:
        data, fds = sock.recv(_HEADER.size), []
    header = _recv_rest(sock, data, _HEADER.size)
    if header is None:
        for fd in fds:
            os.close(fd)
        return None, []
    body = _recv_rest(sock, b"", _HEADER.unpack(header)[0])
    if body is None:
        for fd in fds:
            os.close(fd)
        return None, []
    return json.loads(body), list(fds)


def _recv_rest(sock: socket.socket, data: bytes, size: int) -> bytes | None:
    """``data`` completed to ``size`` bytes from ``sock``; None when the peer closed first."""
    if not data and size:
        data = sock.recv(size)
        if not data:
            return None
    while len(data) < size:
        more = sock.recv(size - len(data))
        if not more:
            return None
        data += more
    return data


class ForkedProcess:
    """A ``subprocess.Popen`` look-alike for a process that the fork server forked (it is the fork server's child, not
    this process's: its exit status comes over the request's connection)."""

    def __init__(self, socket_path: str, args: list[str], env: dict[str, str] | None, setsid: bool):
        self.args = args
        self.returncode: int | None = None
        self._sock: socket.socket | None = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._sock.connect(socket_path)
            request = {"argv": list(args[3:]), "module": args[2], "cwd": os.getcwd(), "setsid": setsid}
            request["env"] = dict(os.environ if env is None else env)
            send_frame(self._sock, request, STDIO_FDS)
            reply, _ = recv_frame(self._sock)
        except OSError:
            self._sock.close()
            raise
        if not reply or "pid" not in reply:
            self._sock.close()
            raise OSError(f"the fork server at {socket_path} did not start {args[2]}: {reply}")
        self.pid = int(reply["pid"])

    def _read_exit(self, timeout: float | None) -> int | None:
        """The exit code once the fork server reports it within ``timeout`` seconds (None: wait as long as it
        takes). When the connection to the fork server is lost (it was stopped), the process counts as exited
        (``-SIGTERM``, its real status unknown here) once it is gone."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            step = 0.5 if left is None else min(left, 0.5)
            if self._sock is not None:
                if select.select([self._sock], [], [], step)[0]:
                    message, _ = recv_frame(self._sock)
                    self._sock.close()
                    self._sock = None
                    if message is not None:
                        self.returncode = int(message["returncode"])
                        break
                    continue
            elif not _pid_alive(self.pid):
                self.returncode = -signal.SIGTERM
                break
            else:
                time.sleep(min(step, 0.05))
            if deadline is not None and time.monotonic() >= deadline:
                return None
        return self.returncode

    def poll(self) -> int | None:
        return self._read_exit(0.0)

    def wait(self, timeout: float | None = None) -> int:
        code = self._read_exit(timeout)
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout)
        return code

    def send_signal(self, signum: int) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class ForkingSubprocess:
    """The ``subprocess`` module, except that ``Popen`` of a simulator module goes to the fork server."""

    def __init__(self, socket_path: str):
        self.socket_path = socket_path

    def Popen(self, args, **kwargs):  # noqa: N802 - the name subprocess gives it
        setsid = kwargs.get("preexec_fn") is os.setsid
        plain = set(kwargs) <= {"shell", "preexec_fn", "env"} and not kwargs.get("shell")
        if plain and (setsid or kwargs.get("preexec_fn") is None) and forkable(args):
            try:
                return ForkedProcess(self.socket_path, list(args), kwargs.get("env"), setsid)
            except OSError as error:
                print(f"warning: fork server unavailable ({error}); starting {args[2]} as a new process", flush=True)
        return subprocess.Popen(args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(subprocess, name)


def forkable(args) -> bool:
    """Whether ``args`` is ``[sys.executable, "-m", <a simulator module>, ...]``."""
    return (
        isinstance(args, (list, tuple))
        and len(args) >= 3
        and args[0] == sys.executable
        and args[1] == "-m"
        and args[2] in FORKABLE_MODULES
    )


def route_popen(module_name: str, socket_path: str) -> bool:
    """Give the loaded module ``module_name`` the forking ``subprocess``; False when it is not loaded. Idempotent."""
    module: ModuleType | None = sys.modules.get(module_name)
    if module is None or not hasattr(module, "subprocess"):
        return False
    if not isinstance(module.subprocess, ForkingSubprocess):
        module.subprocess = ForkingSubprocess(socket_path)
    return True


def unroute_popen(module_name: str) -> None:
    """Give ``module_name`` back the real ``subprocess`` module."""
    module = sys.modules.get(module_name)
    if module is not None and isinstance(getattr(module, "subprocess", None), ForkingSubprocess):
        module.subprocess = subprocess


def route_simulator_workers() -> bool:
    """In the simulator's server process (NVFlare's runner loaded) with a fork server named in :data:`SOCKET_ENV`:
    the leaves' worker processes are forked from it. Returns whether they will be."""
    path = os.environ.get(SOCKET_ENV)
    return bool(path) and fork_server_enabled() and route_popen(RUNNER_MODULE, path)
