"""Checkpoints keep NumPy arrays as tensors in the file and give NumPy arrays back, and name the run's records log
instead of holding its records."""

from __future__ import annotations

import json
import os
from collections import OrderedDict

import numpy as np
import pytest
import torch

from devsim.observe.checkpoint import CHECKPOINT_NAME, StoredArray, load_checkpoint, records_counted, save_checkpoint
from devsim.observe.results import RECORDS_LOG, RunRecorder


def test_arrays_travel_as_tensors_and_come_back_as_the_same_arrays(tmp_path):
    weights = np.arange(12, dtype=np.float32).reshape(3, 4)
    state = {
        "weights": OrderedDict(w=weights, column=weights[:, 1]),
        "snapshot": weights,  # the same object twice, as a checkpoint's weights and snapshots can be
        "random": np.random.RandomState(3).get_state(),
        "mixed": [np.int64(3), np.array(["a", "b"]), np.zeros(3, bool), np.ones(2, np.float16), np.array(5.0)],
        "tensor": torch.ones(2),
    }
    save_checkpoint(str(tmp_path), state)
    raw = torch.load(os.path.join(tmp_path, CHECKPOINT_NAME), weights_only=False)
    assert isinstance(raw["weights"]["w"], StoredArray) and isinstance(raw["mixed"][1], np.ndarray)  # strings stay
    back = load_checkpoint(str(tmp_path))
    assert type(back["weights"]) is OrderedDict and back["weights"]["w"] is back["snapshot"]
    np.testing.assert_array_equal(back["weights"]["column"], weights[:, 1])
    for got, want in zip(back["mixed"], state["mixed"], strict=True):
        assert np.asarray(got).dtype == np.asarray(want).dtype
        np.testing.assert_array_equal(got, want)
    generator = np.random.RandomState()
    generator.set_state(back["random"])
    assert generator.rand() == np.random.RandomState(3).rand()
    assert torch.equal(back["tensor"], torch.ones(2))


def _records(first: int, last: int) -> list[dict]:
    """Records shaped like a round's: numbers, nested dicts, lists, text with a newline and non-ASCII."""
    return [
        {"round": r, "accuracy": r / 1000, "bytes_total": {"up": 10 * r}, "dead_leaves": [], "note": f"r{r}\nü"}
        for r in range(first, last + 1)
    ]


def test_a_checkpoint_names_the_records_log_and_does_not_grow_with_the_run(tmp_path):
    """Each checkpoint appends the new records to records.jsonl and keeps only their count: its file is the same
    size after 1,000 records as after 10, and loading gives every record back in order."""
    recorder = RunRecorder(str(tmp_path), {}, method="fedavg")
    sizes = {}
    for count in (10, 1000):
        for record in _records(len(recorder.data["rounds"]) + 1, count):
            recorder.add_round(record)
        save_checkpoint(str(tmp_path), {"weights": {"w": np.ones(3, np.float32)}, "records": recorder.log_records()})
        sizes[count] = os.path.getsize(tmp_path / CHECKPOINT_NAME)
        assert load_checkpoint(str(tmp_path))["records"] == _records(1, count)
        assert records_counted(str(tmp_path / CHECKPOINT_NAME)) == count
    assert sizes[1000] == sizes[10]
    assert len((tmp_path / RECORDS_LOG).read_text(encoding="utf-8").splitlines()) == 1000


def test_records_logged_after_a_checkpoint_are_not_read_back_and_a_short_log_is_named(tmp_path):
    """A run that went on after its checkpoint (and then stopped) resumes with the checkpoint's records only; a log
    shorter than the checkpoint's count is an error naming the file."""
    recorder = RunRecorder(str(tmp_path), {}, method="fedavg")
    for record in _records(1, 5):
        recorder.add_round(record)
    save_checkpoint(str(tmp_path), {"records": recorder.log_records()})
    for record in _records(6, 8):
        recorder.add_round(record)
    recorder.log_records()
    assert load_checkpoint(str(tmp_path))["records"] == _records(1, 5)
    (tmp_path / RECORDS_LOG).write_text("".join(line + "\n" for line in map(json.dumps, _records(1, 3))))
    with pytest.raises(ValueError, match=r"records.jsonl holds 3 records; the checkpoint beside it counts 5"):
        load_checkpoint(str(tmp_path))


def test_a_resumed_recorder_logs_its_records_anew_and_an_old_list_checkpoint_still_loads(tmp_path):
    """A resume replaces the recorder's records: the next mark rewrites the log (in the same folder or a new one),
    so it holds exactly the resumed records and those after. A checkpoint that kept its records as a list loads."""
    recorder = RunRecorder(str(tmp_path), {}, method="fedavg")
    for record in _records(1, 6):
        recorder.add_round(record)
    recorder.log_records()
    save_checkpoint(str(tmp_path), {"records": _records(1, 4)})  # a checkpoint written before records.jsonl
    assert load_checkpoint(str(tmp_path))["records"] == _records(1, 4)
    assert records_counted(str(tmp_path / CHECKPOINT_NAME)) == 4
    for folder in (tmp_path, tmp_path / "elsewhere"):
        resumed = RunRecorder(str(folder), {}, method="fedavg")
        resumed.data["rounds"] = _records(1, 4)
        resumed.add_round(_records(5, 5)[0])
        save_checkpoint(str(folder), {"records": resumed.log_records()})
        lines = (folder / RECORDS_LOG).read_text(encoding="utf-8").splitlines()
        assert [json.loads(line) for line in lines] == _records(1, 5)


def test_a_background_checkpoint_holds_the_state_as_it_was_when_saved(tmp_path):
    """The run goes on changing its arrays while the file is written: the file holds the state of the call."""
    from devsim.observe.checkpoint import CheckpointWriter

    weights = {"w": np.arange(6, dtype=np.float32)}
    writer = CheckpointWriter()
    writer.save(str(tmp_path), {"rounds_done": 5, "weights": weights})
    weights["w"] += 100.0  # the next round, in place
    writer.wait()
    state = load_checkpoint(str(tmp_path))
    assert state["rounds_done"] == 5 and state["weights"]["w"].tolist() == list(range(6))
    writer.save(str(tmp_path), {"rounds_done": 6, "weights": weights}, wait=True)  # a run's last: on return
    assert load_checkpoint(str(tmp_path))["rounds_done"] == 6
    assert writer.close() is None


def test_a_failed_background_checkpoint_is_raised_at_the_next_one_or_returned_at_close(tmp_path):
    from devsim.observe.checkpoint import CheckpointWriter

    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    writer = CheckpointWriter()
    writer.save(str(blocker / "run"), {"rounds_done": 1})  # its folder cannot be made
    with pytest.raises(OSError):
        writer.save(str(tmp_path), {"rounds_done": 2})
    writer.save(str(blocker / "run"), {"rounds_done": 3})
    assert isinstance(writer.close(), OSError) and writer.close() is None


def test_checkpoints_go_to_the_background_only_where_a_core_is_free(tmp_path, monkeypatch):
    """Where the leaves' training holds every core, a background write slows the rounds as much as it saves: the
    writer then saves in the calling thread."""
    import devsim.resources.workers as workers
    from devsim.observe.checkpoint import CheckpointWriter, background_pays

    monkeypatch.setattr(workers, "usable_cpu_cores", lambda: 2)
    assert not background_pays(1) and background_pays(0)  # one leaf beside the server on 2 cores; a deployment's
    monkeypatch.setattr(workers, "usable_cpu_cores", lambda: 16)
    assert background_pays(2) and not background_pays(15)
    writer = CheckpointWriter(background=False)
    writer.save(str(tmp_path), {"rounds_done": 1})
    assert os.path.isfile(tmp_path / CHECKPOINT_NAME) and writer._pending is None  # written on return
    assert writer.close() is None
