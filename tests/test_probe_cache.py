"""The batching probe's verdict is kept per model, task, settings, machine and PyTorch version, and reused."""

from __future__ import annotations

import json
import os

import pytest
import torch
from torch import nn

from devsim.training.local import LocalTrainingSpec, Objective
from devsim.training.probe.batch_probe import ProbeOutcome
from devsim.training.probe.probe_cache import CACHE_ENV, cache_root, cached_probe, key_path, probe_key, task_identity

TASK = task_identity(
    {"name": "t", "origin": "builtin:t", "sha256": None, "sample_shape": [4], "input_dtype": "float32"}
)


def key(model: nn.Module | None = None, spec: LocalTrainingSpec | None = None, timed: bool = True, task=TASK) -> dict:
    model = model if model is not None else nn.Sequential(nn.Linear(4, 3))
    return probe_key(model, task, spec or LocalTrainingSpec(), Objective(), torch.device("cpu"), timed)


class Counting:
    """A probe that counts its runs and returns ``outcome``."""

    def __init__(self, outcome: ProbeOutcome):
        self.outcome, self.runs = outcome, 0

    def __call__(self) -> ProbeOutcome:
        self.runs += 1
        return self.outcome


def test_the_first_verdict_is_stored_and_given_to_later_probes(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    probe = Counting(ProbeOutcome("not faster here", 0.2, 0.3))
    first, source = cached_probe(key(), probe)
    assert (first, source) == (probe.outcome, None)
    again, source = cached_probe(key(), Counting(ProbeOutcome(None)))  # a second timing would have said batch it
    assert again == probe.outcome and source == key_path(key(), str(tmp_path)) and os.path.isfile(source)
    assert probe.runs == 1


@pytest.mark.parametrize(
    "changed",
    [
        lambda: key(model=nn.Sequential(nn.Linear(4, 5))),
        lambda: key(spec=LocalTrainingSpec(batch_size=32)),
        lambda: key(timed=False),
        lambda: key(task={**TASK, "sha256": "another task file"}),
    ],
)
def test_another_model_task_setting_or_timing_is_probed_again(tmp_path, monkeypatch, changed):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    cached_probe(key(), Counting(ProbeOutcome("stored")))
    fresh = Counting(ProbeOutcome(None))
    assert cached_probe(changed(), fresh) == (ProbeOutcome(None), None) and fresh.runs == 1


def test_another_torch_version_or_machine_is_another_key(monkeypatch):
    before = key()
    monkeypatch.setattr(torch, "__version__", "0.0.0-other")
    assert key() != before
    monkeypatch.undo()
    monkeypatch.setattr("platform.node", lambda: "another-host")
    assert key() != before
    assert key() == key()  # two fresh copies of one model name the same verdict


def test_off_probes_every_time_and_a_damaged_file_is_replaced(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, "off")
    assert cache_root() is None
    probe = Counting(ProbeOutcome(None))
    cached_probe(key(), probe)
    cached_probe(key(), probe)
    assert probe.runs == 2
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    path = key_path(key(), str(tmp_path))
    os.makedirs(os.path.dirname(path))
    with open(path, "w") as stream:
        stream.write("{not json")
    assert cached_probe(key(), probe) == (ProbeOutcome(None), None)
    with open(path) as stream:
        assert json.load(stream)["outcome"]["obstacle"] is None


def test_the_default_folder_is_the_users_cache():
    assert cache_root({"XDG_CACHE_HOME": "/x/cache"}) == "/x/cache/nvflare-devsim"
    assert cache_root({"HOME": "/h"}) == "/h/.cache/nvflare-devsim"
    assert cache_root({CACHE_ENV: "/tmp/c"}) == "/tmp/c"
