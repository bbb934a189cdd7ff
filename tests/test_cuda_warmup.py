"""CUDA's start on a background thread in the server and leaf processes (devsim.resources.cuda_warmup), and the job
component that starts it (devsim_flare.launch.cuda_warmup)."""

from __future__ import annotations

import threading

import pytest
import torch
from nvflare.apis.event_type import EventType

from devsim.observe.startup import StartupClock
from devsim.resources import cuda_warmup
from devsim_flare.launch.cuda_warmup import CudaWarmup


@pytest.fixture
def fresh(monkeypatch):
    """The module's once-per-process state, fresh for the test."""
    monkeypatch.setattr(cuda_warmup, "_thread", None)
    monkeypatch.setattr(cuda_warmup, "_stamps", {})
    return cuda_warmup


def test_without_cuda_nothing_starts_and_nothing_is_reported(fresh, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert fresh.start_cuda_warmup() is None
    assert fresh.warmup_stamps() == {} and fresh.warmup_parts() == {}


def test_with_cuda_one_thread_warms_once_and_stamps_its_start_and_end(fresh, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    release, devices = threading.Event(), []
    monkeypatch.setattr(fresh, "warm_cuda", lambda device: (devices.append(device), release.wait(5)))
    thread = fresh.start_cuda_warmup()
    assert thread is not None and thread.daemon
    assert fresh.start_cuda_warmup() is thread  # once per process
    assert fresh.warmup_parts() == {}  # not finished: nothing for the leaf's record yet
    release.set()
    thread.join(5)
    assert devices == [torch.device("cuda")]
    stamps = fresh.warmup_stamps()
    assert set(stamps) == set(fresh.WARMUP_STAMPS)
    parts = fresh.warmup_parts()
    assert parts["cuda_warmup"] == pytest.approx(stamps["cuda_warmup_done"] - stamps["cuda_warmup_started"])
    assert parts["cuda_warmup_started_at"] == stamps["cuda_warmup_started"]


def test_a_failed_warm_up_reports_no_end(fresh, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)

    def broken(device):
        raise RuntimeError("no context")

    monkeypatch.setattr(fresh, "warm_cuda", broken)
    fresh.start_cuda_warmup().join(5)
    assert "cuda_warmup_done" not in fresh.warmup_stamps() and fresh.warmup_parts() == {}


def test_the_component_starts_the_warm_up_when_the_job_starts_and_only_then(monkeypatch):
    started = []
    monkeypatch.setattr(cuda_warmup, "start_cuda_warmup", lambda: started.append(True))
    component = CudaWarmup()
    component.handle_event(EventType.END_RUN, None)
    assert started == []
    component.handle_event(EventType.START_RUN, None)
    assert started == [True]


def test_the_server_records_the_warm_up_as_a_start_up_stage():
    clock = StartupClock()
    clock.add_stamps({"cuda_warmup_started": 10.0, "cuda_warmup_done": 10.5})
    clock.add_stamps({"cuda_warmup_started": 99.0})  # the first stamp counts
    assert clock.record()["seconds"]["server_cuda_warmup"] == pytest.approx(0.5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device: the warm-up on a real GPU")
def test_warming_a_gpu_leaves_its_random_state_alone():
    before = torch.cuda.get_rng_state()
    cuda_warmup.warm_cuda(torch.device("cuda"))
    assert torch.equal(torch.cuda.get_rng_state(), before)
