"""Gathering asynchronous jobs into few calls and guessing them ahead: the scheduler's fork, the lookahead, the
gatherer, and leaves training jobs of several base versions in one call."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from devsim.clock import AsyncScheduler
from devsim.clock.gather import JobGatherer, job_key
from devsim.clock.lookahead import dispatches_ahead
from devsim.codec import model_to_numpy
from devsim.models import build_model
from devsim.training.leaf_runner import LeafRoundRunner
from tests.conftest import small_processors
from tests.test_async_scheduler import scheduler as async_scheduler


def scheduler(**overrides) -> AsyncScheduler:
    """The scheduler of the scheduler tests, larger: 60 devices, K = 12, B = 4, 25 versions."""
    return async_scheduler(
        **{"population_size": 60, "concurrency": 12, "buffer_size": 4, "max_versions": 25, **overrides}
    )


def test_fork_is_independent_of_the_original():
    s = scheduler()
    s.start()
    twin = s.fork()
    for _ in range(10):
        job = twin.next_arrival()
        twin.record_accepted(job)
        twin.dispatch_open()
    assert s.in_flight == 12 and s.now == 0.0 and s.version == 0 and s.dispatched_total == 12
    assert twin.dispatched_total > 12 and twin.version > 0


@settings(max_examples=40, deadline=None)
@given(
    concurrency=st.integers(1, 20),
    buffer_size=st.integers(1, 8),
    min_open=st.integers(1, 20),
    seed=st.integers(0, 50),
    rejected=st.sets(st.integers(0, 200), max_size=20),
)
def test_every_guess_made_at_a_version_start_is_what_the_run_dispatches(
    concurrency, buffer_size, min_open, seed, rejected
):
    """Guessing with the true acceptances gives exactly the jobs dispatched until the version changes; guessing
    that every update is accepted is right until the first rejection."""
    s = scheduler(
        concurrency=concurrency, buffer_size=buffer_size, min_open_slots=min(min_open, concurrency), seed=seed
    )
    s.start()
    guesses_checked = 0
    while True:
        exact = dispatches_ahead(s, lambda job: job.job_id not in rejected, limit=1000)
        optimistic = dispatches_ahead(s, lambda job: True, limit=1000)
        made: list = []
        any_rejected = False
        while True:
            job = s.next_arrival()
            if job is None:
                break
            accepted = job.job_id not in rejected
            any_rejected |= not accepted
            if accepted and s.record_accepted(job):
                break
            made.extend(s.dispatch_open())
        assert made == exact
        if not any_rejected:
            assert made == optimistic
        guesses_checked += 1
        if job is None:
            break
        s.dispatch_open()
    assert guesses_checked >= 1


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 50), concurrency=st.integers(1, 16), wrong=st.sets(st.integers(0, 300), max_size=30))
def test_a_run_that_looks_ahead_dispatches_exactly_what_one_that_does_not_would(seed, concurrency, wrong):
    """The real scheduler takes the dispatches its lookahead's fork drew (right guesses) and draws the rest itself
    (guesses that were wrong: an update guessed accepted that is rejected); every job is the same either way."""

    def run(look_ahead: bool) -> list:
        s = scheduler(seed=seed, concurrency=concurrency, max_versions=15)
        dispatched = list(s.start())
        while (job := s.next_arrival()) is not None:
            made = job.job_id not in wrong and s.record_accepted(job)
            dispatched += s.dispatch_open()
            if look_ahead and made:  # as the server: guess once the version's first dispatch is made
                dispatches_ahead(s, lambda j: True, limit=concurrency)
        return dispatched

    assert run(look_ahead=True) == run(look_ahead=False)


def test_the_run_does_not_draw_again_what_its_lookahead_drew(monkeypatch):
    draws = {"run": 0, "fork": 0}
    plan = AsyncScheduler._plan_dispatch

    def counted(self, count):
        draws["fork" if self._records_dispatches else "run"] += 1
        return plan(self, count)

    monkeypatch.setattr(AsyncScheduler, "_plan_dispatch", counted)
    s = scheduler()
    s.start()
    while (job := s.next_arrival()) is not None:
        made = s.record_accepted(job)
        s.dispatch_open()
        if made:
            dispatches_ahead(s, lambda j: True, limit=s.concurrency)
    assert draws["fork"] > 50 and draws["run"] < draws["fork"] / 2  # left: the start, and each version's first


def test_lookahead_stops_at_the_limit_and_leaves_the_scheduler_alone():
    s = scheduler(buffer_size=12)
    s.start()
    ahead = dispatches_ahead(s, lambda job: True, limit=3)
    assert len(ahead) == 3 and [j.job_id for j in ahead] == [12, 13, 14]
    assert s.dispatched_total == 12 and s.now == 0.0


def _jobs(count: int, version: int = 0, first: int = 0):
    s = scheduler(concurrency=count, max_versions=5)
    jobs = s.start()
    return [j.__class__(**{**j.to_dict(), "job_id": first + i, "base_version": version}) for i, j in enumerate(jobs)]


def test_gatherer_sends_at_the_count_and_on_flush():
    gather = JobGatherer(send_at=4, max_call_versions=8)
    jobs = _jobs(6)
    gather.add(jobs[:3])
    assert gather.take_ready() == [] and gather.held == 3 and gather.holds(jobs[0])
    gather.add(jobs[3:5])
    assert gather.take_ready() == [jobs[:4]] and gather.held == 1
    gather.flush()
    assert gather.take_ready() == [[jobs[4]]] and gather.held == 0


def test_gatherer_limits_the_versions_one_call_carries():
    gather = JobGatherer(send_at=100, max_call_versions=2)
    a, b, c = _jobs(2, version=0), _jobs(2, version=1, first=2), _jobs(2, version=2, first=4)
    gather.add(a + b)
    assert gather.take_ready() == []
    gather.add(c)
    assert gather.take_ready() == [a + b] and gather.held == 2


def test_right_guesses_are_sent_once_and_wrong_ones_dropped_or_marked_stale():
    gather = JobGatherer(send_at=3, max_call_versions=8)
    guessed = _jobs(4)
    gather.guess(guessed, [True] * 4)
    sent = gather.take_ready()
    assert sent == [guessed[:3]] and gather.held == 1
    assert gather.dispatched(guessed[:2], [True, True]) is False
    assert gather.take_ready() == [] and gather.held == 1
    wrong_sent = guessed[2].__class__(**{**guessed[2].to_dict(), "device_id": guessed[2].device_id + 100})
    wrong_held = guessed[3].__class__(**{**guessed[3].to_dict(), "device_id": guessed[3].device_id + 100})
    assert gather.dispatched([wrong_sent, wrong_held], [True, True]) is True
    assert gather.stale == {job_key(guessed[2])}
    gather.flush()
    assert gather.take_ready() == [[wrong_sent, wrong_held]]


def test_unsendable_jobs_are_never_gathered():
    gather = JobGatherer(send_at=1, max_call_versions=8)
    jobs = _jobs(3)
    assert gather.dispatched(jobs, [True, False, True]) is True
    assert gather.take_ready() == [[jobs[0]], [jobs[2]]]


@pytest.mark.parametrize("device_batch", [1, 3])
def test_jobs_of_several_versions_in_one_call_train_as_in_calls_of_their_own(device_batch):
    """A call carrying bases 0 and 1 stacked gives each job the update it gets in a call of its base alone (bit
    for bit one at a time; to float rounding batched, where groups differ)."""
    model = build_model("cnn")
    first = model_to_numpy(model)
    second = {k: v + np.float32(0.01) * np.sign(v) for k, v in first.items()}
    devices, seeds, bases = [4, 2, 9, 7], [11, 12, 13, 14], [0, 1, 0, 1]
    runner = LeafRoundRunner(small_processors(1), device_batch=device_batch)
    try:
        stacked = {k: np.stack([first[k], second[k]]) for k in first}
        together = runner.run_jobs(
            stacked, [0, 1, 2, 3], devices, seeds, version=1, job_bases=bases, base_versions=[5, 6]
        )
        alone = {
            0: runner.run_jobs(first, [0, 2], [4, 9], [11, 13], version=5),
            1: runner.run_jobs(second, [1, 3], [2, 7], [12, 14], version=6),
        }
    finally:
        runner.close()
    for row, base in enumerate(bases):
        reference = alone[base]
        position = [0, 0, 1, 1][row]
        for key in first:
            got, want = together["deltas"][key][row], reference["deltas"][key][position]
            if device_batch == 1:
                np.testing.assert_array_equal(got, want)
            else:
                np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-6)
        assert together["num_samples"][row] == reference["num_samples"][position]


def test_a_call_refuses_base_indices_outside_its_bases():
    weights = model_to_numpy(build_model("cnn"))
    runner = LeafRoundRunner(small_processors(1))
    try:
        stacked = {k: v[None] for k, v in weights.items()}
        with pytest.raises(ValueError, match="job_bases"):
            runner.run_jobs(stacked, [0], [1], [2], job_bases=[1], base_versions=[0])
    finally:
        runner.close()
