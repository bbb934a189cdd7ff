"""Benchmark task: a small MLP on synthetic sensor features with a natural partition of unequal owners.

Not an example of real data (see examples/): a seeded stand-in with the shape of a cross-device sensor task, big
enough that a round's training, not messaging, sets its time. 2,000 owners hold 20-180 readings each (about 200,000
in all); a reading is 24 features (a window of 8 readings of a 3-axis sensor, flattened) whose class (one of 6
activities) shifts the axes' means; each owner adds their own offset, so shards differ as users do.
``benchmarks/round_overhead.py --task benchmarks/tasks/sensor_mlp_task.py`` measures its round against the tight loop.
"""

from __future__ import annotations

import numpy as np
from torch import nn

OWNERS = 2000
FEATURES = 24
CLASSES = 6


def data() -> dict:
    rng = np.random.default_rng(7)
    sizes = rng.integers(20, 181, size=OWNERS)
    owner = np.repeat(np.arange(OWNERS), sizes)
    labels = rng.integers(0, CLASSES, size=owner.size)
    centres = rng.normal(size=(CLASSES, FEATURES))
    offsets = 0.5 * rng.normal(size=(OWNERS, FEATURES))
    x = (centres[labels] + offsets[owner] + rng.normal(size=(owner.size, FEATURES))).astype(np.float32)
    test = rng.random(owner.size) < 0.05
    return {
        "x_train": x[~test],
        "y_train": labels[~test],
        "x_test": x[test],
        "y_test": labels[test],
        "owner_train": owner[~test],
    }


def model() -> nn.Module:
    return nn.Sequential(nn.Linear(FEATURES, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, CLASSES))
