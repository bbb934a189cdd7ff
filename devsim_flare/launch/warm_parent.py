"""A warm parent: one background process per interpreter and environment that holds PyTorch, NumPy and NVFlare
imported, and forks each later job command, so a command starts in tens of milliseconds instead of importing them
again (2-3 s of CPU on a 2-core machine, the largest part of a short run's start).

How a job command uses it (:func:`run_in_warm_parent`, the first thing a job script calls):

- **A warm parent answers** (its Unix socket, named by :func:`parent_key`, exists under the cache folder): the command
  sends it its script, ``sys.argv``, ``sys.path``, working folder, environment, umask and stdin/stdout/stderr (passed
  as file descriptors); the warm parent forks a child that runs the script as ``__main__`` as a new interpreter would
  (:func:`devsim_flare.launch.forked_child.become`: this project's modules imported afresh from the script's
  checkout, fresh signal handlers, exit handlers, logging and random seeds). The command waits, passes on SIGINT,
  SIGTERM, SIGHUP and SIGQUIT to the child, and exits with the child's status. When the command dies, its
  connection closes and the warm parent sends the child SIGTERM (the run stops as on SIGTERM).
- **None answers**: the command runs here as before; when it ends, having imported PyTorch and got past its checks
  (:func:`note_job_accepted`: not ``--help``, not a refused flag), it starts a warm parent for the next commands
  (:func:`start_warm_parent`, printing one line). The warm parent imports what that command
  imported from the standard library and site-packages (never this project's modules), and what the simulator's
  server and leaf processes import (:data:`WARM_IMPORTS`).

A warm parent serves only commands of the same interpreter, site-packages (their modification times), environment
variables read at import (:data:`KEY_ENV_PREFIXES`) and launch code: :func:`parent_key` names them all, so after a
``pip install`` or a change of ``OMP_NUM_THREADS`` the next command starts cold and starts another warm parent (the
old one ends idle). It ends after :data:`DEFAULT_IDLE_SECONDS` without a command (``DEVSIM_WARM_IDLE``), on SIGTERM
once its commands have ended, or with ``python -m devsim_flare.launch.warm_parent stop``. ``DEVSIM_WARM=0`` turns it
off (neither used nor started); interpreter options (``-X``, ``-W``, ``-O``, ``-I``, ...) make a command start cold.

What differs from a command started cold, and is left as it is: the run's processes descend from the warm parent,
not from the command (``ps``: the command's pid waits for them; Ctrl-Z suspends the waiting command only), and
resource limits (``ulimit``) are the warm parent's.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import os
import signal
import socket
import subprocess
import sys
import time

from devsim.cache_dir import cache_root
from devsim_flare.launch.forked_child import SHIPPED_PACKAGES, interpreter_prefixes
from devsim_flare.launch.forked_process import STDIO_FDS, recv_frame, send_frame

WARM_ENV = "DEVSIM_WARM"
"""``0``: no warm parent is used or started."""
CHILD_ENV = "DEVSIM_WARM_CHILD"
"""Set (``1``) in the environment of a command that a warm parent forked."""
IDLE_ENV = "DEVSIM_WARM_IDLE"
"""Seconds a warm parent waits for a command before it ends (default :data:`DEFAULT_IDLE_SECONDS`)."""
DEFAULT_IDLE_SECONDS = 600.0
FOLDER = "warm"
CONNECT_SECONDS = 2.0
"""How long a command waits to connect to a warm parent, and then for the forked child's pid, before it runs cold."""
REPLY_SECONDS = 10.0
READY_SUFFIX = ".ready"
"""Beside a warm parent's socket: a file that exists once it has taken all its imports."""
MAX_SOCKET_PATH = 107  # bytes of a Unix socket path on Linux (a longer cache folder path: no warm parent)
KEY_ENV_PREFIXES = (
    *("PYTHON", "LD_", "MALLOC_", "OMP_", "KMP_", "MKL_", "OPENBLAS_", "GOTO", "NUMEXPR_", "BLIS_", "NPY_"),
    *("TORCH", "PYTORCH_", "CUDA_", "NVIDIA_", "NCCL_", "DNNL_", "ONEDNN_", "NVFLARE", "GRPC_", "TF_", "XLA_"),
    *("TQDM_", "MPL", "VIRTUAL_ENV", "HOME", "XDG_", "LANG", "LC_", "TZ"),
)
"""Environment variables (by prefix) that the imports a warm parent holds may read (tqdm reads ``TQDM_*`` and
``time`` reads ``TZ`` when imported; the locale sets the standard streams' encoding): part of its key."""
WARM_IMPORTS = ("numpy", "torch", "torch._dynamo", "torch.func", "torch.utils.tensorboard", "nvflare")
"""Imported by every warm parent first, before the modules its starting command had imported."""
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)
LAUNCH_SOURCES = ("warm_parent.py", "fork_server.py", "forked_child.py", "forked_process.py")
"""The code a warm parent runs for a command: part of its key (an edited checkout gets a new warm parent)."""

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
"""The checkout this module is in (a warm parent imports its launch code from there)."""

_at_start: dict = {}
"""This command's key and environment as they were when it started (a run changes ``os.environ``)."""


def warm_enabled(environ=None) -> bool:
    """False when ``DEVSIM_WARM=0`` in ``environ`` (default ``os.environ``) or the cache folder is off."""
    environ = os.environ if environ is None else environ
    return environ.get(WARM_ENV, "1").strip() != "0" and cache_root(environ) is not None and hasattr(os, "fork")


def plain_interpreter() -> bool:
    """Whether this interpreter runs without options that a warm parent would not share (``-X``, ``-W``, ``-O``,
    ``-I``, ``-E``, ``-S``, ``-i``, ``-v``, ``-b``, ``-P``, dev mode)."""
    flags = sys.flags
    names = ("optimize", "isolated", "ignore_environment", "no_site", "inspect", "interactive", "verbose")
    names += ("bytes_warning", "dev_mode", "safe_path")
    return not (sys.warnoptions or getattr(sys, "_xoptions", {}) or any(getattr(flags, n, False) for n in names))


def parent_key(environ=None) -> str:
    """16 hex digits naming what a warm parent's imports depend on: the interpreter, the modification times of the
    interpreter's own ``sys.path`` folders (site-packages change when a package is installed), the environment
    variables of :data:`KEY_ENV_PREFIXES` and the launch code's source."""
    environ = os.environ if environ is None else environ
    prefixes = interpreter_prefixes()
    digest = hashlib.sha256()
    for part in (os.path.realpath(sys.executable), sys.version, *prefixes):
        digest.update(part.encode() + b"\0")
    for entry in sys.path:
        if entry and entry.startswith(prefixes) and os.path.isdir(entry):
            digest.update(f"{entry}:{os.stat(entry).st_mtime_ns}\0".encode())
    for name in sorted(environ):
        if name.startswith(KEY_ENV_PREFIXES):
            digest.update(f"{name}={environ[name]}\0".encode())
    here = os.path.dirname(os.path.abspath(__file__))
    for name in LAUNCH_SOURCES:
        with open(os.path.join(here, name), "rb") as stream:
            digest.update(stream.read())
    return digest.hexdigest()[:16]


def socket_path(environ=None) -> str | None:
    """The warm parent's socket for this interpreter and ``environ``; None when warm parents are off or the path
    would be too long for a Unix socket."""
    environ = os.environ if environ is None else environ
    if not warm_enabled(environ):
        return None
    path = os.path.join(cache_root(environ), FOLDER, f"{parent_key(environ)}.sock")
    return path if len(path.encode()) <= MAX_SOCKET_PATH else None


def run_in_warm_parent() -> None:
    """Run this job command in a warm parent when one answers, and exit with the run's status; otherwise return
    (the command runs here, and starts a warm parent when it ends). Call it first in a job script's ``__main__``
    block, before anything imports PyTorch. Does nothing in a command a warm parent forked."""
    if os.environ.get(CHILD_ENV) or not plain_interpreter() or not warm_enabled():
        return
    path = socket_path()
    main = sys.modules.get("__main__")
    script = getattr(main, "__file__", None)
    if path is None or not script or getattr(main, "__spec__", None) is not None:  # run as a file, not with -m
        return
    _at_start.update(key_path=path, environ=dict(os.environ))
    atexit.register(_start_after_cold_run)
    if not os.path.exists(path):
        return
    from devsim.observe.startup import stamp_command_start

    stamp_command_start()
    env = {**os.environ, CHILD_ENV: "1"}
    umask = os.umask(0)
    os.umask(umask)
    request = {"script": os.path.abspath(script), "argv": sys.argv, "sys_path": sys.path, "cwd": os.getcwd()}
    request.update(env=env, umask=umask)
    signal.pthread_sigmask(signal.SIG_BLOCK, FORWARDED_SIGNALS)  # a signal during the hand-over waits for it
    pid, conn = _request_child(path, request)
    if conn is None:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED_SIGNALS)
        return
    atexit.unregister(_start_after_cold_run)
    sys.exit(_wait_for_child(pid, conn))


def _request_child(path: str, request: dict) -> tuple[int, socket.socket | None]:
    """Ask the warm parent at ``path`` to fork the command: (child pid, open connection), or (0, None) when it does
    not answer in time (the command then runs cold; a child forked after the command gave up is stopped by the warm
    parent when the connection closes)."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.settimeout(CONNECT_SECONDS)
        conn.connect(path)
        conn.settimeout(REPLY_SECONDS)
        send_frame(conn, request, STDIO_FDS)
        reply, _ = recv_frame(conn)
    except (OSError, ValueError):  # ValueError: an environment value JSON cannot carry (undecodable bytes)
        conn.close()
        return 0, None
    if not reply or "pid" not in reply:
        conn.close()
        return 0, None
    conn.settimeout(None)
    return int(reply["pid"]), conn


def _wait_for_child(pid: int, conn: socket.socket) -> int:
    """Pass this command's signals on to the forked ``pid`` until the warm parent reports its exit; its exit code
    (a child ended by a signal ends this command by the same signal)."""

    def forward(signum: int, _frame) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)

    for signum in FORWARDED_SIGNALS:
        signal.signal(signum, forward)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, FORWARDED_SIGNALS)  # one that came meanwhile is forwarded now
    message, _ = recv_frame(conn)
    conn.close()
    if message is None or "returncode" not in message:
        print(f"error: the warm parent ended before the run (pid {pid}) reported its exit", file=sys.stderr)
        return 1
    code = int(message["returncode"])
    if code < 0:
        sys.stdout.flush()
        sys.stderr.flush()
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code & 0xFF


def note_job_accepted() -> None:
    """Called by a job command once its flags are parsed and checked, before it exports or runs: only such a command
    starts a warm parent when it ends (``--help``, ``--version`` and a refused flag end without one)."""
    _at_start["accepted"] = True


def _start_after_cold_run() -> None:
    """At the exit of a command that ran cold, imported PyTorch and was accepted (:func:`note_job_accepted`): start a
    warm parent for the next commands."""
    if "torch" not in sys.modules or not _at_start.get("accepted") or "key_path" not in _at_start:
        return
    with contextlib.suppress(Exception):
        pid = start_warm_parent(_at_start["key_path"], _at_start["environ"], imported_modules())
        if pid is not None:
            idle = idle_seconds(_at_start["environ"])
            print(
                f"warm start: a background process (pid {pid}) now holds PyTorch and NVFlare imported, so the next "
                f"runs start sooner; it ends after {idle / 60:g} idle minutes ({WARM_ENV}=0 turns this off)",
                file=sys.stderr,
            )


def idle_seconds(environ) -> float:
    """``DEVSIM_WARM_IDLE`` seconds (default :data:`DEFAULT_IDLE_SECONDS`)."""
    try:
        return max(1.0, float(environ.get(IDLE_ENV, DEFAULT_IDLE_SECONDS)))
    except ValueError:
        return DEFAULT_IDLE_SECONDS


def imported_modules() -> list[str]:
    """The modules this process has imported from the standard library and site-packages, in import order (never
    this project's, which a command imports from its own checkout, nor ``__main__``)."""
    prefixes = interpreter_prefixes()
    names = []
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None)
        if name == "__main__" or name.split(".")[0] in SHIPPED_PACKAGES or not path:
            continue
        if path.startswith(prefixes):
            names.append(name)
    return names


def start_warm_parent(path: str, environ: dict[str, str], modules: list[str]) -> int | None:
    """Start a warm parent listening at ``path`` (detached: its own session, no terminal, working folder ``/``) that
    imports :data:`WARM_IMPORTS` and then ``modules``; its pid, or None when one already answers there."""
    if _answers(path):
        return None
    folder = os.path.dirname(path)
    os.makedirs(folder, mode=0o700, exist_ok=True)
    stem = path.removesuffix(".sock")
    with open(stem + ".modules", "w", encoding="utf-8") as stream:
        stream.write("\n".join(modules))
    env = {k: v for k, v in environ.items() if not k.startswith("DEVSIM_FORK_SERVER") and k != CHILD_ENV}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (REPO_ROOT, environ.get("PYTHONPATH"))))
    with open(stem + ".log", "wb") as log:  # the last warm parent's messages, if any
        process = subprocess.Popen(
            [sys.executable, "-m", "devsim_flare.launch.warm_parent", "serve", path, str(idle_seconds(environ))],
            cwd="/",
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            start_new_session=True,
            close_fds=True,
        )
    return process.pid


def _answers(path: str) -> bool:
    """Whether a warm parent accepts connections at ``path``."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.settimeout(CONNECT_SECONDS)
        conn.connect(path)
        return True
    except OSError:
        return False
    finally:
        conn.close()


def serve(path: str, idle: float) -> int:
    """The warm parent itself: bind ``path`` (ending at once when another warm parent answers there), import, fork a
    command per request until ``idle`` seconds pass without one. It reads and removes its module list at the start,
    and removes its socket and an empty log at the end."""
    from devsim_flare.launch.fork_server import _serve

    if _answers(path):
        return 0
    sys.path[:] = [e for e in sys.path if e not in ("", "/", REPO_ROOT)] + [REPO_ROOT]  # site-packages first
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(16)
    bound = os.stat(path).st_ino

    stem = path.removesuffix(".sock")

    def remove_socket() -> None:
        """Remove the socket and the ready mark (unless another warm parent has bound the path since) and an empty
        log."""
        with contextlib.suppress(OSError):
            if os.stat(path).st_ino == bound:
                os.unlink(path)
                os.unlink(stem + READY_SUFFIX)
        with contextlib.suppress(OSError):
            if os.path.getsize(stem + ".log") == 0:
                os.unlink(stem + ".log")

    try:
        with open(stem + ".modules", encoding="utf-8") as stream:
            learned = [name for name in stream.read().split("\n") if name]
        os.unlink(stem + ".modules")
    except OSError:
        learned = []
    imports = tuple(dict.fromkeys([*WARM_IMPORTS, *learned]))
    try:
        return _serve(
            listener,
            None,
            imports,
            idle_seconds=idle,
            child_wait=None,
            stop_orphans=True,
            before_exit=remove_socket,
            import_beside_children=False,
            after_imports=lambda: os.close(os.open(stem + READY_SUFFIX, os.O_CREAT | os.O_WRONLY, 0o600)),
        )
    finally:
        remove_socket()


def is_ready(path: str) -> bool:
    """Whether the warm parent at socket ``path`` has taken all its imports (a command sent to it meanwhile waits for
    the import in progress, :data:`REPLY_SECONDS` at most, then runs cold)."""
    return os.path.exists(path.removesuffix(".sock") + READY_SUFFIX)


def running_parents(environ=None) -> list[tuple[int, str]]:
    """(pid, socket path) of every warm parent of this user's cache folder (all interpreters)."""
    root = cache_root(os.environ if environ is None else environ)
    folder = os.path.join(root, FOLDER) if root else None
    if not folder or not os.path.isdir(folder):
        return []
    found = []
    for pid_dir in os.listdir("/proc"):
        if not pid_dir.isdigit():
            continue
        with contextlib.suppress(OSError):
            with open(f"/proc/{pid_dir}/cmdline", "rb") as stream:
                args = stream.read().split(b"\0")
            if b"devsim_flare.launch.warm_parent" in args and b"serve" in args:
                path = args[args.index(b"serve") + 1].decode()
                if os.path.dirname(path) == folder:
                    found.append((int(pid_dir), path))
    return found


def stop_parents(environ=None, wait_seconds: float = 5.0) -> list[int]:
    """SIGTERM every warm parent of this cache folder (each ends once its running commands have ended) and wait
    ``wait_seconds`` at most for the idle ones to be gone; the pids signalled."""
    pids = [pid for pid, _ in running_parents(environ)]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + wait_seconds
    while time.monotonic() < deadline and any(os.path.exists(f"/proc/{pid}") for pid in pids):
        time.sleep(0.05)
    return pids


def main(argv: list[str]) -> int:
    """``serve PATH IDLE`` (started by :func:`start_warm_parent`), ``stop`` or ``status``."""
    if argv[:1] == ["serve"] and len(argv) == 3:
        return serve(argv[1], float(argv[2]))
    if argv == ["stop"]:
        pids = stop_parents()
        print(f"stopped {len(pids)} warm parent(s){': ' if pids else ''}{', '.join(map(str, pids))}")
        return 0
    if argv == ["status"]:
        for pid, path in running_parents():
            print(f"{pid} {path} {'ready' if is_ready(path) else 'importing'}")
        return 0
    print("usage: python -m devsim_flare.launch.warm_parent stop|status", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
