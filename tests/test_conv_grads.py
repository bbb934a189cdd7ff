"""Convolution weight gradients from unfold (``--conv-grads``): the same gradients as PyTorch's under vmap, the
trainer's updates, and how a leaf chooses."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.nn import functional

from devsim.config import ConfigError, SimulationConfig
from devsim.data.device_shards import ShardPool
from devsim.models import build_model
from devsim.training.batched import BatchedTrainer
from devsim.training.flat_step import UnfoldConvGrads, batched_step
from devsim.training.graphed_step import GRAPH_OPTIONS
from devsim.training.local import LocalTrainer, LocalTrainingSpec
from devsim.training.probe.conv_grads_probe import probe_conv_grads, resolve_conv_grads, unfoldable_convolutions
from processors.task_processor import TaskDeviceProcessor


class _Convs(nn.Module):
    """Every kind of 2-D convolution call: strided, padded, dilated, without bias, reflect-padded, grouped (which
    unfold leaves to PyTorch) and ``padding="same"`` (likewise), and a functional call."""

    def __init__(self) -> None:
        super().__init__()
        self.strided = nn.Conv2d(3, 4, 3, stride=2, padding=1)
        self.dilated = nn.Conv2d(4, 4, 3, dilation=2, padding=(2, 1), bias=False)
        self.reflect = nn.Conv2d(4, 6, (3, 2), padding=1, padding_mode="reflect")
        self.grouped = nn.Conv2d(6, 6, 3, padding=1, groups=2)
        self.same = nn.Conv2d(6, 6, 3, padding="same")
        self.kernel = nn.Parameter(torch.randn(5, 6, 1, 1) * 0.3)
        self.head = nn.Linear(5, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.tanh(self.dilated(torch.relu(self.strided(x))))
        x = self.same(self.grouped(torch.relu(self.reflect(x))))
        x = functional.conv2d(x, self.kernel, None, 1, 0, 1, 1)
        return self.head(x.mean((2, 3)))


def _step_grads(model: nn.Module, conv_grads: str, devices: int = 3) -> tuple[torch.Tensor, ...]:
    torch.manual_seed(1)
    keys = [name for name, _ in model.named_parameters()]
    named = dict(model.named_parameters())
    params = tuple(named[k].detach() + 0.05 * torch.randn(devices, *named[k].shape) for k in keys)
    inputs, targets = torch.randn(5, devices, 3, 12, 12), torch.randint(0, 3, (5, devices))
    step = batched_step(model, functional.cross_entropy, keys, [], conv_grads)
    grads, _ = step(params, (), inputs, targets)
    return grads


def test_unfold_gives_pytorchs_weight_gradients_for_every_convolution_under_vmap():
    model = _Convs()
    assert unfoldable_convolutions(model) == 3  # strided, dilated, reflect; not the grouped or "same" ones
    want, got = _step_grads(model, "cudnn"), _step_grads(model, "unfold")
    for w, g in zip(want, got, strict=True):
        assert g.shape == w.shape
        assert torch.allclose(g, w, rtol=1e-5, atol=1e-7), float((g - w).abs().max())
    assert any(not torch.equal(g, w) for w, g in zip(want, got, strict=True))  # the other path really ran


def test_unfold_routes_plain_conv2d_calls_only():
    weight, x = torch.randn(4, 3, 3, 3, requires_grad=True), torch.randn(2, 3, 8, 8)
    with UnfoldConvGrads():
        routed = functional.conv2d(x, weight, padding=1)
        unbatched = functional.conv2d(x[0], weight, padding=1)  # 3-D input: PyTorch's own
    assert routed.grad_fn.name().endswith("Backward") and "Unfold" in routed.grad_fn.name()
    assert "Unfold" not in unbatched.grad_fn.name()
    (grad,) = torch.autograd.grad(routed.square().sum(), weight)
    (want,) = torch.autograd.grad(functional.conv2d(x, weight, padding=1).square().sum(), weight)
    assert torch.allclose(grad, want, rtol=1e-4, atol=1e-4)


def test_batched_step_refuses_an_unknown_conv_grads():
    with pytest.raises(ValueError, match="conv_grads must be one of cudnn, unfold"):
        batched_step(nn.Linear(2, 2), functional.mse_loss, ["weight", "bias"], [], "winograd")


def _pool(devices: int = 4, rows: int = 12) -> tuple[ShardPool, torch.Tensor, torch.Tensor]:
    torch.manual_seed(2)
    x, y = torch.randn(devices * rows, 3, 32, 32), torch.randint(0, 10, (devices * rows,))
    return ShardPool(x, y, [torch.arange(i * rows, (i + 1) * rows) for i in range(devices)]), x, y


def test_unfold_trainer_matches_one_device_at_a_time():
    torch.manual_seed(0)
    model = build_model("cnn")
    spec = LocalTrainingSpec(batch_size=4, iterations=3, lr=0.01)
    pool, x, y = _pool(devices=3, rows=8)
    trainer = BatchedTrainer(copy.deepcopy(model), spec, torch.device("cpu"), conv_grads="unfold")
    start = [model.state_dict()[k].detach().clone() for k in trainer.keys]
    deltas, _ = trainer.train_pool([0, 1, 2], start, pool, _generators(3))
    single = LocalTrainer(copy.deepcopy(model), spec, torch.device("cpu"))
    for i, rows in enumerate(pool.indices):
        single.train(i, start, x[rows], y[rows], torch.Generator().manual_seed(i))
        want = [s - g for s, g in zip(single.state_tensors, start, strict=True)]
        scale = max(float(w.abs().max()) for w in want)
        worst = max(float((d[i] - w).abs().max()) for d, w in zip(deltas, want, strict=True))
        assert worst <= 1e-5 * scale, (i, worst / scale)


def test_unfold_resnet_step_is_the_cudnn_step_up_to_rounding():
    """ResNet-18 (batch normalisation, 1x1 shortcut convolutions, no conv bias): one local step both ways."""
    torch.manual_seed(0)
    model = build_model("resnet18")
    spec = LocalTrainingSpec(batch_size=4, iterations=1, lr=0.01)
    pool, _, _ = _pool(devices=2, rows=4)
    both = {c: BatchedTrainer(copy.deepcopy(model), spec, "cpu", conv_grads=c) for c in ("cudnn", "unfold")}
    start = [model.state_dict()[k].detach().clone() for k in both["cudnn"].keys]
    want, _ = both["cudnn"].train_pool([0, 1], start, pool, _generators(2))
    got, _ = both["unfold"].train_pool([0, 1], start, pool, _generators(2))
    scale = max(float(w.abs().max()) for w in want)
    assert max(float((g - w).abs().max()) for g, w in zip(got, want, strict=True)) <= 1e-5 * scale


def _generators(count: int) -> list[torch.Generator]:
    return [torch.Generator().manual_seed(i) for i in range(count)]


def test_unfold_through_the_graphed_step_mechanism_is_the_eager_unfold_step():
    torch.manual_seed(0)
    model = build_model("cnn")
    spec = LocalTrainingSpec(batch_size=4, epochs=1)
    pool, _, _ = _pool()
    eager = BatchedTrainer(copy.deepcopy(model), spec, torch.device("cpu"), conv_grads="unfold")
    graphed = BatchedTrainer(
        copy.deepcopy(model), spec, torch.device("cpu"), compile_options=dict(GRAPH_OPTIONS), conv_grads="unfold"
    )
    start = [model.state_dict()[k].detach().clone() for k in eager.keys]
    want, _ = eager.train_pool([0, 1, 2, 3], start, pool, _generators(4))
    got, _ = graphed.train_pool([0, 1, 2, 3], start, pool, _generators(4))
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))


def test_resolve_conv_grads():
    cnn, mlp = build_model("cnn"), nn.Sequential(nn.Linear(4, 3))
    assert resolve_conv_grads("unfold", "cpu", cnn).value == "unfold"
    assert resolve_conv_grads("cudnn", "cuda", cnn).reason == "conv_grads=cudnn (as set)"

    def never() -> tuple[bool, str]:
        raise AssertionError("the probe runs only for auto on a GPU with convolutions")

    assert resolve_conv_grads("auto", "cpu", cnn, never).reason == "conv_grads=auto -> cudnn on the CPU"
    assert resolve_conv_grads("auto", "cuda", mlp, never).reason.endswith("no 2-D convolution to change")
    faster = resolve_conv_grads("auto", "cuda", cnn, lambda: (True, "16 probe devices: unfold 1.0 ms, cudnn 3.0 ms"))
    assert faster.value == "unfold" and faster.reason == (
        "conv_grads=auto -> unfold (2 convolutions; 16 probe devices: unfold 1.0 ms, cudnn 3.0 ms)"
    )
    assert resolve_conv_grads("auto", "cuda", cnn, lambda: (False, "slower")).value == "cudnn"
    with pytest.raises(ValueError, match="conv_grads must be one of auto, cudnn, unfold, got 'fast'"):
        resolve_conv_grads("fast", "cpu", cnn)


def test_probe_conv_grads_times_both_and_checks_one_step():
    torch.manual_seed(0)
    model = build_model("cnn")
    pool, _, _ = _pool(devices=5)
    start = [model.state_dict()[k].detach().clone() for k in BatchedTrainer(model, LocalTrainingSpec(), "cpu").keys]
    built: list[tuple[str, LocalTrainingSpec | None]] = []

    def build(conv_grads: str, spec: LocalTrainingSpec | None) -> BatchedTrainer:
        built.append((conv_grads, spec))
        return BatchedTrainer(
            copy.deepcopy(model), spec or LocalTrainingSpec(batch_size=4), "cpu", conv_grads=conv_grads
        )

    faster, figures = probe_conv_grads(build, pool, start, tolerance=1e-3, repeats=1)
    assert isinstance(faster, bool)
    assert figures.startswith("5 probe devices: unfold ") and "one step within" in figures
    assert [spec.iterations for _, spec in built if spec is not None] == [1, 1]

    def broken(conv_grads: str, spec: LocalTrainingSpec | None) -> BatchedTrainer:
        if conv_grads == "unfold":
            raise RuntimeError("no kernel")
        return build(conv_grads, spec)

    assert probe_conv_grads(broken, pool, start, tolerance=1e-3) == (
        False,
        "unfold failed on the probe: RuntimeError: no kernel",
    )


def test_the_flag_is_checked_and_reaches_the_processor():
    with pytest.raises(ConfigError, match="--conv-grads: 'fastest' is not one of the allowed values: auto, cudnn"):
        SimulationConfig(conv_grads="fastest").validate()
    processor = TaskDeviceProcessor.from_settings({"dataset": "digits", "conv_grads": "unfold"}, compute_device="cpu")
    assert processor.conv_grads == "unfold"
    assert processor.conv_grads_choice().reason == "conv_grads=unfold (as set)"
