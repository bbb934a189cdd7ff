"""FedProx (``--prox-mu``): the proximal term's gradient in the per-device loop and in the batched trainer, both
against the loss written out, for one global model and for per-job base versions; the flag's checks."""

from __future__ import annotations

import copy
import dataclasses

import numpy as np
import pytest
import torch
from torch import nn

from devsim.codec import model_to_numpy
from devsim.config import ConfigError, SimulationConfig
from devsim.models import build_model
from devsim.training.leaf_runner import LeafRoundRunner
from devsim.training.local import LocalTrainer, LocalTrainingSpec, batch_orders
from tests.test_batched_training import _check_against_single
from tests.test_core import _processors

MU = 0.5
PROX = LocalTrainingSpec(epochs=2, batch_size=8, lr=0.05, momentum=0.9, weight_decay=1e-4, prox_mu=MU)


def _reference_prox_training(model: nn.Module, spec: LocalTrainingSpec, images, labels, seed: int) -> list:
    """Local SGD on ``cross_entropy + mu / 2 * ||w - w_start||^2`` by autograd, the same batches as the trainer."""
    start = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.SGD(model.parameters(), lr=spec.lr, momentum=spec.momentum, weight_decay=spec.weight_decay)
    model.train()
    generator = torch.Generator().manual_seed(seed)
    for index in batch_orders(len(labels), spec.steps_for(len(labels)), spec.batch_size, generator):
        loss = nn.functional.cross_entropy(model(images[index]), labels[index])
        terms = (((p - s) ** 2).sum() for p, s in zip(model.parameters(), start, strict=True))
        loss = loss + spec.prox_mu / 2 * sum(terms)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    return [p.detach() for p in model.parameters()]


def test_loop_follows_the_proximal_loss_and_pulls_toward_the_start():
    torch.manual_seed(0)
    model = build_model("cnn")
    images, labels = torch.randn(24, 3, 32, 32), torch.randint(0, 10, (24,))
    want = _reference_prox_training(copy.deepcopy(model), PROX, images, labels, seed=5)
    global_tensors = [t.detach().clone() for t in model.state_dict().values() if t.is_floating_point()]
    trainer = LocalTrainer(copy.deepcopy(model), PROX, torch.device("cpu"))
    trainer.train(0, global_tensors, images, labels, torch.Generator().manual_seed(5))
    got = dict(trainer.model.named_parameters())
    for (name, _), expected in zip(model.named_parameters(), want, strict=True):
        torch.testing.assert_close(got[name], expected, rtol=1e-5, atol=1e-6, msg=name)
    plain = LocalTrainer(copy.deepcopy(model), dataclasses.replace(PROX, prox_mu=0.0), "cpu")
    plain.train(0, global_tensors, images, labels, torch.Generator().manual_seed(5))
    drift = [float((a - b).norm()) for a, b in zip(trainer.state_tensors, global_tensors, strict=True)]
    plain_drift = [float((a - b).norm()) for a, b in zip(plain.state_tensors, global_tensors, strict=True)]
    assert sum(drift) < sum(plain_drift)  # the term keeps the device closer to the model it received


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_batched_prox_matches_one_device_at_a_time(optimizer):
    spec = PROX if optimizer == "sgd" else LocalTrainingSpec(epochs=2, batch_size=8, lr=1e-3, optimizer="adam",
                                                             prox_mu=MU)  # fmt: skip
    _check_against_single("cnn", spec, [20, 13, 20, 5], atol=1e-5)


def test_async_jobs_from_several_base_versions_prox_toward_their_own_base():
    """Jobs of one call start from different versions: batched training pulls each toward its own base, as the
    loop does, and the term changes the deltas."""
    weights = model_to_numpy(build_model("cnn"))
    newer = {k: v + np.float32(0.01) for k, v in weights.items()}
    args = dict(job_ids=[0, 1, 2, 3], device_ids=[4, 2, 9, 7], train_seeds=[11, 12, 13, 14])
    runners = {
        "loop": LeafRoundRunner(_processors(1, prox_mu=MU)),
        "batched": LeafRoundRunner(_processors(2, prox_mu=MU), device_batch=4),
        "plain": LeafRoundRunner(_processors(2), device_batch=4),
    }
    stacked = {k: np.stack([weights[k], newer[k]]) for k in weights}
    try:
        out = {
            name: runner.run_jobs(stacked, job_bases=[0, 1, 1, 0], base_versions=[3, 4], **args)
            for name, runner in runners.items()
        }
    finally:
        for runner in runners.values():
            runner.close()
    for key in weights:
        np.testing.assert_allclose(out["batched"]["deltas"][key], out["loop"]["deltas"][key], rtol=1e-4, atol=1e-5)
    assert any(not np.allclose(out["plain"]["deltas"][k], out["loop"]["deltas"][k]) for k in weights)


@pytest.mark.parametrize("value", [-0.1, float("nan"), float("inf")])
def test_bad_prox_mu_is_refused_naming_the_flag(value):
    with pytest.raises(ConfigError, match="--prox-mu") as error:
        SimulationConfig.from_dict({"dataset": "synthetic", "prox_mu": value})
    assert error.value.field_name == "prox_mu"
