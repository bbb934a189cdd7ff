"""What a process forked by a fork server or a warm parent does to become the process it was asked for.

:func:`become` turns the forked child into ``python -m <module> <args>`` (a simulator process NVFlare asked for) or
``python <script> <args>`` (a job command handed to a warm parent), as a new interpreter would have started it: the
requester's stdin/stdout/stderr, environment, working folder, umask and session, fresh signal handlers, garbage
collection on, exit handlers, logging and global random seeds, ``sys.path`` rebuilt, this project's packages dropped
from ``sys.modules`` (imported again from the requester's checkout or the job's ``custom/`` folder), the glibc arena
limit applied; then it runs the module or script as ``__main__`` and returns its exit code.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import gc
import importlib
import logging
import os
import signal
import sys
import threading

from devsim_flare.sim_polling import shorten_before_start

SHIPPED_PACKAGES = ("devsim", "devsim_flare", "processors")
"""Dropped from a child's ``sys.modules``: the job ships them in its ``custom/`` folder (see
:data:`devsim_flare.recipe.SHIPPED_PACKAGES`)."""
M_ARENA_MAX = -8  # glibc's mallopt parameter for MALLOC_ARENA_MAX


def become(request: dict, fds: list[int]) -> int:
    """In the forked child: turn into what the request describes and run it; its exit code. A request names either
    ``module`` (``python -m <module> <argv>``, its ``sys.path`` rebuilt from ``PYTHONPATH``) or ``script``
    (``python <script>`` with the whole ``argv`` and the requester's ``sys_path``, from a warm parent)."""
    import runpy

    if request.get("setsid"):
        os.setsid()
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    env = request["env"]
    os.environ.clear()
    os.environ.update(env)
    _fresh_stdio(env)
    os.chdir(request["cwd"])
    if request.get("umask") is not None:
        os.umask(int(request["umask"]))
    for signum in (signal.SIGTERM, signal.SIGCHLD):
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGINT})
    gc.enable()  # its fork server or warm parent imported without automatic collection
    _limit_arenas(env.get("MALLOC_ARENA_MAX"))
    _reseed_global_generators()
    script, module = request.get("script"), request.get("module")
    if script:
        sys.path[:] = list(request["sys_path"])
    else:
        sys.path[:] = interpreter_path(request["cwd"], env.get("PYTHONPATH", ""), sys.path)
        shorten_before_start(module)  # before its first wait; the module's own import comes too late
    for name in [n for n in sys.modules if n.split(".")[0] in SHIPPED_PACKAGES]:
        del sys.modules[name]
    if module:
        sys.modules.pop(module, None)  # it runs afresh as __main__, as in a new interpreter (runpy warns)
    importlib.invalidate_caches()
    atexit._clear()
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
    sys.argv = list(request["argv"]) if script else ["-m", *request["argv"]]
    if script:
        _reread_argv_at_import()
    _name_process(os.path.basename(script) if script else process_name(module, request["argv"]))
    code = 0
    try:
        if script:
            runpy.run_path(script, run_name="__main__")
        else:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as stop:
        code = _exit_code(stop.code)
    except BaseException:  # noqa: BLE001 - what the interpreter does with an uncaught exception
        sys.excepthook(*sys.exc_info())
        code = 1
    threading._shutdown()  # type: ignore[attr-defined]  # what the interpreter does at exit: join the threads
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    return code


def _reread_argv_at_import() -> None:
    """Read this command's ``sys.argv`` where an already-imported module read the warm parent's when it was imported:
    NVFlare's recipe module strips ``--export`` / ``--export-dir`` from ``sys.argv`` at import and keeps what it
    found (``nvflare.recipe.spec``; without this a warm run of ``--export`` ran the job instead)."""
    spec = sys.modules.get("nvflare.recipe.spec")
    if spec is not None and hasattr(spec, "_consume_recipe_args"):
        spec._CONSUMED = False
        spec._RECIPE_EXPORT, spec._RECIPE_EXPORT_DIR = spec._consume_recipe_args()


def _reseed_global_generators() -> None:
    """Seed Python's and NumPy's global random generators afresh, as a new interpreter does (a forked child would
    otherwise draw the same numbers as its siblings). PyTorch's default generator starts from a fixed seed in every
    interpreter, so it stays as imported."""
    import random

    random.seed()
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        with contextlib.suppress(Exception):
            numpy.random.seed()


PR_SET_NAME = 15


def process_name(module: str, argv: list[str]) -> str:
    """The name (``comm``, at most 15 bytes) a forked simulator process takes: ``sim-<site>`` for a leaf's worker
    (its ``--client``), else ``sim-<module's last part>``. A forked process keeps the job command's command line in
    ``ps`` (only its name and ``/proc/<pid>/comm`` change), so tools that look for ``simulator_worker`` in command
    lines should look at its working folder (the site's folder) or this name."""
    client = argv[argv.index("--client") + 1] if "--client" in argv[:-1] else None
    return f"sim-{client or module.rpartition('.')[2]}"[:15]


def _name_process(name: str) -> None:
    """Set this process's name (``comm``, 15 bytes at most)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(PR_SET_NAME, name.encode()[:15], 0, 0, 0)


def _exit_code(code) -> int:
    """``sys.exit(code)``'s exit status, as the interpreter computes it (a message is printed, status 1)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _fresh_stdio(env: dict[str, str]) -> None:
    """New ``sys.stdout``/``sys.stderr`` on fds 1 and 2, buffered as a new interpreter would buffer them there."""
    import io

    unbuffered = bool(env.get("PYTHONUNBUFFERED"))
    for fd, name in ((1, "stdout"), (2, "stderr")):
        old = getattr(sys, name)
        stream = io.TextIOWrapper(
            open(fd, "wb", closefd=False),  # noqa: SIM115 - lives as long as the process
            encoding=getattr(old, "encoding", None),
            errors=getattr(old, "errors", None),
            line_buffering=unbuffered or fd == 2 or os.isatty(fd),
            write_through=unbuffered,
        )
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)


def _limit_arenas(value: str | None) -> None:
    """Apply ``MALLOC_ARENA_MAX`` (glibc reads it only when a process starts; a fork inherits the parent's)."""
    if not value:
        return
    with contextlib.suppress(OSError, AttributeError, ValueError):
        ctypes.CDLL(None).mallopt(M_ARENA_MAX, int(value))


def interpreter_path(cwd: str, pythonpath: str, current: list[str]) -> list[str]:
    """The ``sys.path`` of ``python -m`` started in ``cwd`` with ``PYTHONPATH=pythonpath``: the folder, the
    ``PYTHONPATH`` entries, then the interpreter's own entries (the standard library and site-packages: ``current``
    from its first entry under the interpreter's prefix on, which drops what a script put in front)."""
    prefixes = interpreter_prefixes()
    first = next((i for i, entry in enumerate(current) if entry and entry.startswith(prefixes)), len(current))
    extra = [os.path.abspath(entry) for entry in pythonpath.split(os.pathsep) if entry]
    return [cwd, *extra, *[entry for entry in current[first:] if entry not in extra]]


def interpreter_prefixes() -> tuple[str, ...]:
    """The interpreter's own installation prefixes (the virtual environment's and the base interpreter's), sorted:
    a ``sys.path`` entry or module file under one of them is the standard library's or site-packages'."""
    return tuple(sorted({sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}))
