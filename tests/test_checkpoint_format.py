"""Checkpoints keep NumPy arrays as tensors in the file and give NumPy arrays back."""

from __future__ import annotations

import os
from collections import OrderedDict

import numpy as np
import torch

from devsim.observe.checkpoint import CHECKPOINT_NAME, StoredArray, load_checkpoint, save_checkpoint


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
