"""Penguin species from field measurements, one device per nest: a tabular task with a natural partition.

Data: the Palmer Penguins (Gorman, Williams and Fraser, PLoS ONE 2014), 344 adults of three species
measured on three islands of the Palmer Archipelago over three breeding seasons, read offline from the CSV that
the ``palmerpenguins`` package ships (``pip install palmerpenguins``; part of this project's ``examples`` extra).
Each penguin's "Individual ID" (``N<nest>A<1|2>``) names its nest: the two adults of a nest in one season on
one island are one owner, so a device is a nest (172 of them, two penguins each; islands hold different
species, so devices are label-skewed the way real sites are). A fifth of the nests (seeded) are held out: the
test penguins come from nests no device holds.

Inputs: float32 ``(N, 5)``: culmen length and depth (mm), flipper length (mm), body mass (g), standardised with
the training split's mean and standard deviation, and sex (+1 male, -1 female, 0 unknown). Targets: the species
(0 Adelie, 1 Chinstrap, 2 Gentoo). The two penguins without measurements are left out.

Run it (from the repository root)::

    .venv/bin/python jobs/pt_job_fedavg.py --task examples/penguins_task.py --num-leaf-nodes 2 \\
        --device-selection-size 40 --local-epochs 5 --batch-size 4 --lr 0.05 --num-rounds 20
"""

from __future__ import annotations

import csv
import importlib.util
import os
import re

import numpy as np
import torch
from torch import nn

MEASUREMENTS = ("Culmen Length (mm)", "Culmen Depth (mm)", "Flipper Length (mm)", "Body Mass (g)")
SPECIES = ("Adelie", "Chinstrap", "Gentoo")
TEST_FRACTION = 0.2
SPLIT_SEED = 0


def _csv_path() -> str:
    found = importlib.util.find_spec("palmerpenguins")
    if found is None or not found.submodule_search_locations:
        raise RuntimeError("this task reads the palmerpenguins package's CSV: pip install palmerpenguins==0.1.6")
    return os.path.join(found.submodule_search_locations[0], "data", "penguins-raw.csv")


def data() -> dict:
    with open(_csv_path(), encoding="utf-8") as stream:
        rows = [r for r in csv.DictReader(stream) if all(r[m] not in ("", "NA") for m in MEASUREMENTS)]
    features = np.array([[float(r[m]) for m in MEASUREMENTS] for r in rows])
    sex = np.array([{"MALE": 1.0, "FEMALE": -1.0}.get(r["Sex"], 0.0) for r in rows])
    species = np.array([SPECIES.index(r["Species"].split()[0]) for r in rows], dtype=np.int64)
    nests = [(r["studyName"], r["Island"], re.match(r"N(\d+)", r["Individual ID"]).group(1)) for r in rows]
    nest_ids = {nest: i for i, nest in enumerate(sorted(set(nests)))}
    owner = np.array([nest_ids[n] for n in nests], dtype=np.int64)
    rng = np.random.default_rng(SPLIT_SEED)
    test_nests = rng.choice(len(nest_ids), size=round(TEST_FRACTION * len(nest_ids)), replace=False)
    test = np.isin(owner, test_nests)
    mean, std = features[~test].mean(axis=0), features[~test].std(axis=0)
    x = np.column_stack([(features - mean) / std, sex]).astype(np.float32)
    return {
        "x_train": x[~test],
        "y_train": species[~test],
        "x_test": x[test],
        "y_test": species[test],
        "owner_train": owner[~test],
    }


def model() -> nn.Module:
    return nn.Sequential(nn.Linear(5, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, len(SPECIES)))


def metrics(outputs: torch.Tensor, targets: torch.Tensor) -> dict[str, float]:
    """Accuracy and the accuracy on the rarest species (Chinstrap, on one island only)."""
    predicted = outputs.argmax(dim=1)
    chinstrap = targets == 1
    return {
        "accuracy": float((predicted == targets).float().mean()),
        "chinstrap_recall": float((predicted[chinstrap] == 1).float().mean()) if chinstrap.any() else 0.0,
    }
