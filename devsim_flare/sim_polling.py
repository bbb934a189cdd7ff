"""Shorter waits in NVFlare's simulator processes on the way to the first round.

NVFlare 2.9's simulator waits with fixed sleeps before a leaf can start. In the server process, the simulator
runner (``nvflare.private.fed.app.simulator.simulator_runner``) polls for the server app's start every 1.0 s,
each client thread sleeps 1.0 s before it launches its leaf's worker process, and it retries the connection to
that worker every 1.0 s while the worker imports. In each leaf's worker process, the client runner
(``nvflare.private.fed.client.client_runner``) sleeps 0.5 s before it first syncs with the server's runner. Each
is a wait for something that happens in a fraction of a second; together they cost a run up to ~3.5 s.

:func:`shorten_simulator_polls` swaps the ``time`` module that those modules see for one whose ``sleep`` lasts at
most :data:`POLL_SECONDS`; every other ``time`` function is the real one. Each of their sleeps is in a loop that
re-checks its condition (or a fixed pause before one), so the run is the same, only sooner. The client runner is
changed only in a simulator worker process: in POC and production its sleeps pace a leaf's task polling.

The worker module itself (run as ``__main__``) retries a leaf's task fetch every 0.5 s and sleeps the client
runner's fetch interval (0.2 s here) between tasks: with the simulator's two start-up tasks (``sync``, then
``setup`` once every leaf has synced), a leaf that asked before ``setup`` was scheduled waited up to 0.5 s more.
Those sleeps are capped too, in the worker's ``__main__`` only.

NVFlare's connector manager (``nvflare.fuel.f3.cellnet.connector_manager``) sleeps 0.5 s after it starts a dynamic
listener (the simulator server cell's internal listener), "to wait for listener ready and avoid race". NVFlare's TCP
listener is ready once its server socket is bound and listening, a few milliseconds after its thread starts:
:func:`wait_for_listeners` turns that sleep into a wait for exactly that (at most the same 0.5 s); a listener of any
other driver still gets the whole sleep.

A process forked by this project's fork server (:mod:`devsim_flare.launch.fork_server`) has the runner and client
runner modules loaded before it starts: :func:`shorten_before_start` caps them (and the listener's wait) then, so
the runner's first one-second wait (for the server app's start) is short too. Otherwise the ``devsim_flare``
package calls :func:`shorten_simulator_polls_by_default` when it is first imported: in the simulator's server
process that happens when NVFlare scans the server app's classes, a tenth of a second after it deploys the app, in
the middle of the first of those waits; in a worker, when NVFlare builds the leaf's app, before its client runner
syncs. Where the modules are not loaded (the job command, POC, production) nothing changes.
``DEVSIM_RUNTIME_ENV_DEFAULTS=0`` keeps NVFlare's waits.
"""

from __future__ import annotations

import functools
import sys
import threading
import time
from types import ModuleType
from typing import Any

from devsim_flare.runtime_defaults import runtime_defaults_enabled

RUNNER_MODULE = "nvflare.private.fed.app.simulator.simulator_runner"
SIMULATOR_MODULE = "nvflare.private.fed.app.simulator.simulator"
WORKER_MODULE = "nvflare.private.fed.app.simulator.simulator_worker"
CLIENT_RUNNER_MODULE = "nvflare.private.fed.client.client_runner"
CONNECTOR_MANAGER_MODULE = "nvflare.fuel.f3.cellnet.connector_manager"
COMMUNICATOR_MODULE = "nvflare.fuel.f3.communicator"
TCP_DRIVER_MODULE = "nvflare.fuel.f3.drivers.tcp_driver"
POLL_SECONDS = 0.05
LISTENER_STEP_SECONDS = 0.005
_started = threading.local()
"""``connector``: the connector this thread's communicator last started as a listener (until a wait takes it)."""


class _ShortSleepTime:
    """The ``time`` module with ``sleep`` capped at ``cap`` seconds."""

    def __init__(self, cap: float) -> None:
        self.cap = cap

    def sleep(self, seconds: float) -> None:
        time.sleep(min(seconds, self.cap))

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def _cap_sleeps(module_name: str, cap: float) -> bool:
    """Give the loaded module ``module_name`` a ``time`` whose sleeps last at most ``cap`` s; False if not loaded."""
    module: ModuleType | None = sys.modules.get(module_name)
    if module is None or not hasattr(module, "time"):
        return False
    if not isinstance(module.time, _ShortSleepTime):
        module.time = _ShortSleepTime(cap)
    return True


class _ListenerWaitTime:
    """The ``time`` module with ``sleep`` turned into a wait for the listener this thread just started: for
    NVFlare's TCP driver, until its server socket listens (at most ``seconds``); otherwise the whole sleep."""

    def sleep(self, seconds: float) -> None:
        connector, _started.connector = getattr(_started, "connector", None), None
        tcp = sys.modules.get(TCP_DRIVER_MODULE)
        if connector is None or tcp is None or not isinstance(connector.driver, tcp.TcpDriver):
            time.sleep(seconds)
            return
        deadline = time.monotonic() + seconds
        while connector.driver.server is None and time.monotonic() < deadline:
            time.sleep(LISTENER_STEP_SECONDS)

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)


def _remembering(start_listener):
    """``Communicator.start_listener`` that also notes, for this thread, the connector it started."""

    @functools.wraps(start_listener)
    def wrapper(self, scheme, resources):
        handle, connect_url, params = start_listener(self, scheme, resources)
        _started.connector = self.conn_manager.connectors.get(handle)
        return handle, connect_url, params

    wrapper.devsim_remembers = True
    return wrapper


def wait_for_listeners() -> bool:
    """Replace the connector manager's fixed sleep after starting a listener by a wait for the listener, in this
    process; False when NVFlare's modules are not loaded. Idempotent."""
    manager, communicator = sys.modules.get(CONNECTOR_MANAGER_MODULE), sys.modules.get(COMMUNICATOR_MODULE)
    if manager is None or communicator is None or not hasattr(manager, "time"):
        return False
    if not isinstance(manager.time, _ListenerWaitTime):
        manager.time = _ListenerWaitTime()
    cls = communicator.Communicator
    if not getattr(cls.start_listener, "devsim_remembers", False):
        cls.start_listener = _remembering(cls.start_listener)
    return True


def _worker_main() -> bool:
    """Whether ``__main__`` is NVFlare's simulator worker module (run with ``python -m`` or forked as if it were)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return getattr(spec, "name", None) == WORKER_MODULE


def _in_simulator_worker() -> bool:
    """Whether this process is a simulator worker (started as ``python -m`` of :data:`WORKER_MODULE`)."""
    return WORKER_MODULE in sys.modules or _worker_main()


def shorten_simulator_polls(cap: float = POLL_SECONDS) -> bool:
    """Cap the sleeps of NVFlare's simulator runner, and of the client runner and the worker's ``__main__`` in a
    simulator worker, at ``cap`` seconds where they run in this process. Returns True when something was capped
    (a simulator process). Idempotent."""
    capped = _cap_sleeps(RUNNER_MODULE, cap)
    if _in_simulator_worker():
        capped = _cap_sleeps(CLIENT_RUNNER_MODULE, cap) or capped
    if _worker_main():
        capped = _cap_sleeps("__main__", cap) or capped
    return capped


def shorten_before_start(module: str, cap: float = POLL_SECONDS) -> bool:
    """In a process about to run ``module`` as ``__main__`` (a fork server's child, NVFlare's modules already
    loaded): cap the runner's sleeps and wait for listeners (:func:`wait_for_listeners`) in the simulator's server
    process, cap the client runner's sleeps in a worker, unless ``DEVSIM_RUNTIME_ENV_DEFAULTS=0``. Returns whether
    something was changed."""
    if not runtime_defaults_enabled():
        return False
    if module == WORKER_MODULE:
        return _cap_sleeps(CLIENT_RUNNER_MODULE, cap)
    return module == SIMULATOR_MODULE and (wait_for_listeners() | _cap_sleeps(RUNNER_MODULE, cap))


def shorten_simulator_polls_by_default() -> bool:
    """:func:`shorten_simulator_polls` unless ``DEVSIM_RUNTIME_ENV_DEFAULTS=0``."""
    return runtime_defaults_enabled() and shorten_simulator_polls()
