"""TensorBoard metrics writer and the progress line's ETA."""

import glob
import os
import sys
import warnings

import numpy as np
import pytest

from devsim.observe import metrics
from devsim.observe.metrics import MetricsWriter
from devsim.observe.progress import BoundEta, ProgressLine, format_duration


def test_writer_creates_an_event_file_under_tensorboard(tmp_path):
    pytest.importorskip("tensorboard")
    with MetricsWriter(str(tmp_path)) as writer:
        assert writer.enabled
        writer.scalars(1, {"accuracy": 0.5, "loss": np.float32(1.25), "note": "skipped"}, prefix="eval")
        writer.scalars(2, {"accuracy": 0.75}, prefix="eval")
        writer.histogram(2, "async/staleness", np.array([0, 1, 1, 3]))
        writer.histogram(3, "async/staleness", np.array([]))
        writer.after_round(2, {"round": 2, "timing": {"parts": {"dispatch": 0.01}}, "leaf": "leaf-1"})
    assert not writer.enabled
    writer.close()
    files = glob.glob(os.path.join(str(tmp_path), "tensorboard", "events.out.tfevents.*"))
    assert len(files) == 1 and os.path.getsize(files[0]) > 0

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(os.path.join(str(tmp_path), "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"eval/accuracy", "eval/loss", "round/round", "round/timing/parts/dispatch"} <= tags
    assert "eval/note" not in tags and "round/leaf" not in tags
    assert [(e.step, e.value) for e in events.Scalars("eval/accuracy")] == [(1, 0.5), (2, 0.75)]
    assert "async/staleness" in events.Tags()["histograms"]


def test_writer_without_tensorboard_warns_once_and_does_nothing(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    monkeypatch.setattr(metrics, "_warned_missing", False)
    with pytest.warns(RuntimeWarning, match="results.json only"):
        first = MetricsWriter(str(tmp_path))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        second = MetricsWriter(str(tmp_path))
    for writer in (first, second):
        assert not writer.enabled
        writer.scalars(1, {"accuracy": 0.5})
        writer.histogram(1, "staleness", np.arange(3))
        writer.close()
    assert not os.path.exists(os.path.join(str(tmp_path), "tensorboard"))


def test_disabled_writer_writes_nothing(tmp_path):
    writer = MetricsWriter(str(tmp_path), enabled=False)
    writer.scalars(1, {"accuracy": 0.5})
    writer.close()
    assert not os.path.exists(os.path.join(str(tmp_path), "tensorboard"))


def test_progress_eta_uses_an_ema_of_round_durations():
    progress = ProgressLine(total_rounds=10, alpha=0.5)
    assert progress.line(1, 2.0) == "round 1/10  elapsed 0:00:02  eta 0:00:18"
    # Second round took 4 s: EMA = 2 + 0.5 * (4 - 2) = 3 s; 8 rounds left.
    assert progress.line(2, 6.0, "accuracy 0.5000") == "round 2/10  elapsed 0:00:06  eta 0:00:24  accuracy 0.5000"
    assert progress.step_seconds == pytest.approx(3.0)
    assert progress.line(10, 30.0).endswith("eta 0:00:00")


def test_progress_prints_every_n_and_the_last_and_feeds_the_ema_on_every_step():
    progress = ProgressLine(total_rounds=7, every=3, unit="version", alpha=0.5)
    assert progress.line(1, 1.0) is None
    assert progress.line(2, 2.0) is None
    assert progress.line(3, 3.0) == "version 3/7  elapsed 0:00:03  eta 0:00:04"
    assert progress.line(4, 7.0) is None
    assert progress.step_seconds == pytest.approx(2.5)
    assert progress.line(7, 10.0).startswith("version 7/7")


def test_progress_with_skipped_calls_applies_the_ema_once_per_step():
    progress = ProgressLine(total_rounds=100, alpha=0.5)
    progress.update(1, 1.0)
    progress.update(3, 7.0)  # two steps of 3 s: EMA 1 -> 2 -> 2.5
    assert progress.step_seconds == pytest.approx(2.5)
    assert progress.eta_seconds(3) == pytest.approx(97 * 2.5)


def test_progress_shows_the_sooner_of_its_eta_and_another_bounds():
    """An async run bounded by 100,000 versions and 2 simulated seconds ends at 2 s: the line must say so."""
    progress = ProgressLine(total_rounds=100_000, alpha=0.5)
    sim_time = BoundEta(2.0, alpha=0.5)  # simulated time 0 at wall second 0
    assert sim_time.update(0.0, 5.0) is None  # nothing grew yet
    assert sim_time.update(0.5, 10.0) == pytest.approx(30.0)  # 0.05 simulated s per wall s, 1.5 s left
    line = progress.line(100, 10.0, other_eta=sim_time.update(0.5, 10.0))
    assert line == "round 100/100000  elapsed 0:00:10  eta 0:00:30"
    # rate 0.05 -> EMA with 0.25 (1.0 more simulated s in 4 wall s): 0.15; 0.5 s left
    assert sim_time.update(1.5, 14.0) == pytest.approx(0.5 / 0.15)
    assert progress.line(101, 10.1, other_eta=10**9).endswith(f"eta {format_duration(99_899 * 0.1)}")
    assert sim_time.update(1.5, 16.0) == pytest.approx(0.5 / 0.15)  # no growth: the rate waits for the next
    assert sim_time.update(1.9, 18.0) == pytest.approx(0.1 / (0.15 + 0.5 * (0.1 - 0.15)))  # 0.4 s over 4 s
    assert sim_time.update(2.5, 20.0) == 0.0
    resumed = BoundEta(2.0, value=1.0, elapsed_s=3.0)  # a resumed run starts from its checkpoint's time
    assert resumed.update(1.5, 8.0) == pytest.approx(0.5 / 0.1)
    with pytest.raises(ValueError):
        BoundEta(2.0, alpha=0)


def test_format_duration_and_validation():
    assert format_duration(83) == "0:01:23"
    assert format_duration(605.4) == "0:10:05"
    assert format_duration(90061) == "25:01:01"
    assert format_duration(-3) == "0:00:00"
    with pytest.raises(ValueError):
        ProgressLine(0)
    with pytest.raises(ValueError):
        ProgressLine(10, every=0)
