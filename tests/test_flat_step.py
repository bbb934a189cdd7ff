"""The batched step over tuples against the dict-and-``functional_call`` step it replaces, bit for bit."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.func import functional_call, grad_and_value, vmap

from devsim.models import build_model
from devsim.training.flat_step import ModuleSlots, batched_step


def _dict_step(model: nn.Module, loss_fn, param_keys: list[str], buffer_keys: list[str]):
    """The step as it was written before: dicts through ``vmap`` / ``grad`` and ``functional_call``."""

    def loss_and_outputs(params: dict, buffers: dict, inputs: torch.Tensor, targets: torch.Tensor):
        outputs = functional_call(model, (params, buffers), (inputs,))
        return loss_fn(outputs, targets), outputs

    step = vmap(grad_and_value(loss_and_outputs, has_aux=True), in_dims=(0, 0, 1, 1))

    def run(params: tuple, buffers: tuple, inputs: torch.Tensor, targets: torch.Tensor):
        grads, aux = step(
            dict(zip(param_keys, params, strict=True)), dict(zip(buffer_keys, buffers, strict=True)), inputs, targets
        )
        return tuple(grads[k] for k in param_keys), aux

    return run


class _Tied(nn.Module):
    """A linear encoder and decoder sharing one weight, with a BatchNorm in between."""

    def __init__(self) -> None:
        super().__init__()
        self.encode = nn.Linear(6, 4)
        self.norm = nn.BatchNorm1d(4)
        self.decode = nn.Linear(4, 6)
        self.head = nn.Linear(6, 3)
        self.decode.weight = nn.Parameter(self.encode.weight.t().detach().clone())
        self.tail = self.head  # the same module under a second name

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.tail(torch.relu(self.decode(self.norm(self.encode(x)))))


def _stacked_state(model: nn.Module, count: int) -> tuple[list[str], list[str], tuple, tuple]:
    torch.manual_seed(3)
    param_keys = [name for name, _ in model.named_parameters()]
    buffer_keys = [name for name, _ in model.named_buffers()]  # as the batched trainer passes them
    named = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    params = tuple(named[k].detach() + 0.01 * torch.randn(count, *named[k].shape) for k in param_keys)
    buffers = tuple(named[k].detach().unsqueeze(0).repeat(count, *([1] * named[k].dim())) for k in buffer_keys)
    return param_keys, buffer_keys, params, buffers


@pytest.mark.parametrize("name", ["cnn", "cnn_tracked", "tied"])
def test_flat_step_is_bit_identical_to_the_dict_step(name):
    model = {"cnn": lambda: build_model("cnn"), "cnn_tracked": lambda: build_model("cnn", track_features=True)}.get(
        name, _Tied
    )()
    model.train()
    count, batch = 3, 5
    param_keys, buffer_keys, params, buffers = _stacked_state(model, count)
    gen = torch.Generator().manual_seed(0)
    shape = (3, 32, 32) if name != "tied" else (6,)
    inputs = torch.randn(batch, count, *shape, generator=gen)
    targets = torch.randint(0, 3, (batch, count), generator=gen)
    loss_fn = nn.functional.cross_entropy
    buffers_before = tuple(b.clone() for b in buffers)
    old_buffers = tuple(b.clone() for b in buffers)
    reference = copy.deepcopy(model)  # functional_call leaves a tensor behind on a module reached by two names
    want_grads, (want_loss, want_out) = _dict_step(reference, loss_fn, param_keys, buffer_keys)(
        params, old_buffers, inputs, targets
    )
    got_grads, (got_loss, got_out) = batched_step(model, loss_fn, param_keys, buffer_keys)(
        params, buffers, inputs, targets
    )
    assert len(got_grads) == len(param_keys)
    for key, got, want in zip(param_keys, got_grads, want_grads, strict=True):
        assert got.shape == want.shape, key
        assert torch.equal(got, want), key
    assert torch.equal(got_loss, want_loss) and torch.equal(got_out, want_out)
    for key, got, want, before in zip(buffer_keys, buffers, old_buffers, buffers_before, strict=True):
        assert torch.equal(got, want), key  # in-place running statistics reach the stacked buffers alike
        if "running" in key or "tracked" in key:
            assert not torch.equal(got, before), key
    for name_, tensor in model.named_parameters(remove_duplicate=False):  # the module's own tensors are back
        assert isinstance(tensor, nn.Parameter), name_


def test_mixed_dtypes_are_stepped_alike():
    mixed = nn.Sequential(nn.Linear(4, 3), _ToDouble(), nn.Linear(3, 2).double())
    param_keys = [n for n, _ in mixed.named_parameters()]
    named = dict(mixed.named_parameters())
    params = tuple(named[k].detach().unsqueeze(0).repeat(2, *([1] * named[k].dim())) for k in param_keys)
    inputs, targets = torch.randn(4, 2, 4), torch.randint(0, 2, (4, 2))
    grads, (loss, _) = batched_step(mixed, nn.functional.cross_entropy, param_keys, [])(params, (), inputs, targets)
    want, _ = _dict_step(mixed, nn.functional.cross_entropy, param_keys, [])(params, (), inputs, targets)
    assert [g.dtype for g in grads] == [named[k].dtype for k in param_keys]
    assert all(torch.equal(g, w) for g, w in zip(grads, want, strict=True)) and loss.shape == (2,)


class _ToDouble(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.double()


def test_module_slots_restore_the_module_and_name_unknown_keys():
    model = _Tied()
    slots = ModuleSlots(model, ["encode.weight"])
    assert len(slots.sites) == 1  # decode.weight is its own parameter here (a copy, not tied)
    shared = nn.Linear(2, 2)
    pair = nn.Sequential(shared, shared)
    assert len(ModuleSlots(pair, ["0.weight"]).sites) == 2  # one tensor reachable under two names: both replaced
    original = pair[0].weight
    with pytest.raises(RuntimeError):
        ModuleSlots(pair, ["0.weight"]).call([torch.zeros(3, 3)], torch.zeros(1, 2))
    assert pair[0].weight is original
    with pytest.raises(ValueError, match="nope"):
        ModuleSlots(pair, ["nope"])
