"""The reused daemon threads behind leaf calls: a new thread only when none is idle, every thread a daemon,
and all of them gone after ``close``."""

from __future__ import annotations

import threading
import time

from devsim_flare.leaf_calls import _DaemonThreads


def leaf_call_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("test-calls-")]


def test_threads_are_reused_when_idle_and_end_on_close():
    threads = _DaemonThreads("test-calls")
    release = threading.Event()
    started = threading.Semaphore(0)
    done = threading.Semaphore(0)

    def blocking_call() -> None:
        started.release()
        assert release.wait(10)
        done.release()

    for _ in range(3):  # three calls in progress at once: three threads
        threads.submit(blocking_call)
    assert all(started.acquire(timeout=10) for _ in range(3))
    assert len(leaf_call_threads()) == 3 and all(t.daemon for t in leaf_call_threads())
    release.set()
    assert all(done.acquire(timeout=10) for _ in range(3))
    deadline = time.monotonic() + 10
    while threads._idle < 3 and time.monotonic() < deadline:  # each thread marks itself idle after its call
        time.sleep(0.01)

    ran = threading.Event()
    threads.submit(ran.set)  # an idle thread takes it: no fourth thread
    assert ran.wait(10)
    assert len(leaf_call_threads()) == 3

    threads.close()
    for thread in leaf_call_threads():
        thread.join(timeout=10)
    assert leaf_call_threads() == []
