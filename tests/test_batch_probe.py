"""The batched path for any task: unequal shards in one ragged lockstep, and the probe that allows it per model."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from devsim.data.device_shards import ShardPool
from devsim.training.batched import BatchedTrainer
from devsim.training.local import LocalTrainer, LocalTrainingSpec, Objective
from devsim.training.probe.batch_probe import deterministic_kernels, probe_batching

CPU = torch.device("cpu")


class CharGRU(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed, self.gru, self.out = nn.Embedding(30, 8), nn.GRU(8, 16, batch_first=True), nn.Linear(16, 30)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.out(self.gru(self.embed(ids))[0][:, -1])


class CharLSTM(CharGRU):
    def __init__(self) -> None:
        super().__init__()
        self.gru = nn.LSTM(8, 16, batch_first=True)


class Dropped(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc, self.drop = nn.Linear(6, 4), nn.Dropout(0.3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.drop(x))


class Drifting(nn.Module):
    """Keeps a Python counter that changes its output: batched, it moves once per step instead of once per device."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 4)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return self.fc(x) * (1.0 + 0.5 * (self.calls % 3))


def _mlp() -> nn.Module:
    """No bias before the BatchNorm: its gradient is exactly zero in theory and rounding noise in practice, which
    Adam would scale up to a full step of either sign."""
    return nn.Sequential(nn.Linear(6, 16, bias=False), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 4))


def _tokens(rows: int = 400) -> ShardPool:
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 30, (rows, 12), generator=generator)
    return ShardPool(ids, ids[:, -1].clone(), [])


def _features(rows: int = 400) -> ShardPool:
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(rows, 6, generator=generator)
    return ShardPool(x, (x[:, 0] > 0).long() + 2 * (x[:, 1] > 0).long(), [])


def _check_ragged(model_fn, pool: ShardPool, spec: LocalTrainingSpec, sizes: list[int], objective: Objective) -> None:
    """Devices with these shard sizes, batched in one call, match training each alone (and report the same); Adam
    divides by the root of tiny second moments, which turns float rounding into 1e-5-sized differences."""
    atol = 5e-5 if spec.optimizer == "adam" else 2e-6
    torch.manual_seed(3)
    reference = model_fn()
    state = reference.state_dict()
    keys = [k for k, v in state.items() if v.is_floating_point()]
    global_tensors = [state[k].detach().clone() for k in keys]
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    indices = [torch.arange(s, s + n) for s, n in zip(starts, sizes, strict=True)]
    ids = list(range(10, 10 + len(sizes)))
    batched = BatchedTrainer(model_fn(), spec, CPU, objective)
    deltas, metrics = batched.train_pool(
        ids,
        global_tensors,
        ShardPool(pool.inputs, pool.targets, indices),
        [torch.Generator().manual_seed(i) for i in ids],
    )
    single = LocalTrainer(model_fn(), spec, CPU, objective)
    for row, (device_id, index) in enumerate(zip(ids, indices, strict=True)):
        alone = single.train(
            device_id, global_tensors, pool.inputs[index], pool.targets[index], torch.Generator().manual_seed(device_id)
        )
        assert (alone.steps, alone.num_samples) == (metrics[row].steps, metrics[row].num_samples)
        assert alone.loss == pytest.approx(metrics[row].loss, rel=1e-4, abs=1e-6)
        assert alone.accuracy == pytest.approx(metrics[row].accuracy, nan_ok=True)
        for k, (trained, start) in enumerate(zip(single.state_tensors, global_tensors, strict=True)):
            torch.testing.assert_close(deltas[k][row], trained - start, rtol=1e-4, atol=atol)


@pytest.mark.parametrize(
    "spec",
    [
        LocalTrainingSpec(epochs=2, batch_size=8, lr=0.05, momentum=0.9),
        LocalTrainingSpec(epochs=1, batch_size=5, lr=0.01, optimizer="adam", weight_decay=1e-4),
        LocalTrainingSpec(iterations=6, batch_size=8, lr=0.05, momentum=0.5),
    ],
)
def test_unequal_shards_train_in_one_ragged_lockstep_exactly(spec):
    """Natural partitions: every device a different size (short last batches at different steps, different step
    counts, groups that are not contiguous), BatchNorm buffers per device."""
    _check_ragged(_mlp, _features(), spec, [13, 8, 30, 7, 30, 18, 2, 22], Objective())


def test_a_recurrent_token_model_batches_exactly():
    spec = LocalTrainingSpec(epochs=1, batch_size=4, lr=0.01, optimizer="adam")
    _check_ragged(CharGRU, _tokens(), spec, [9, 4, 14, 7], Objective())


def test_a_regression_loss_batches_exactly():
    pool = _features()
    targets = pool.inputs[:, :4].sum(dim=1, keepdim=True).expand(-1, 4).contiguous()
    objective = Objective(loss=lambda out, y: F.mse_loss(out, y), classification=False)
    _check_ragged(
        _mlp, ShardPool(pool.inputs, targets, []), LocalTrainingSpec(epochs=1, batch_size=4), [10, 4, 14], objective
    )


def test_the_probe_allows_models_that_batch_exactly():
    assert probe_batching(_mlp, LocalTrainingSpec(), Objective(), _features(), CPU, timed=False).obstacle is None
    gru = probe_batching(CharGRU, LocalTrainingSpec(batch_size=16), Objective(), _tokens(), CPU, timed=False)
    assert gru.obstacle is None


def test_the_probe_refuses_randomness_python_state_and_per_sample_loops_and_says_why(monkeypatch):
    dropout = probe_batching(Dropped, LocalTrainingSpec(), Objective(), _features(), CPU).obstacle
    assert dropout.startswith("vmap cannot run the model") and "random" in dropout
    drifting = probe_batching(Drifting, LocalTrainingSpec(), Objective(), _features(), CPU).obstacle
    assert drifting.startswith("batched updates differ from one-at-a-time updates")
    # The LSTM's per-sample loop is detected from vmap's own warning; its timing sits near the 0.8x margin on this
    # CPU (0.85-1.07x at batch 32, measured), so the timed comparison is fixed here to "not faster".
    monkeypatch.setattr("devsim.training.probe.batch_probe._timed", lambda *args: (0.040, 0.040))
    lstm = probe_batching(CharLSTM, LocalTrainingSpec(batch_size=32), Objective(), _tokens(), CPU).obstacle
    assert lstm is not None and "no batching rule for aten::" in lstm and "40.0 ms batched against 40.0 ms" in lstm
    rmsprop = probe_batching(_mlp, LocalTrainingSpec(optimizer="rmsprop"), Objective(), _features(), CPU).obstacle
    assert "optimizer 'rmsprop'" in rmsprop


def _in_one_of_three(probe, expected) -> list:
    """Up to three timed probes until one verdict meets ``expected``; the verdicts seen (the last one met it, or
    none did). A probe times two arms in turn, and a test running beside others on a small machine may see one arm
    slowed by a neighbour: a verdict that is wrong every time is a fault, one wrong once is the machine."""
    seen = []
    for _ in range(3):
        seen.append(probe())
        if expected(seen[-1]):
            break
    return seen


def test_the_timed_probe_keeps_batching_where_it_pays_and_says_why_where_it_does_not():
    """A tiny MLP is per-step overhead (batched ~0.35x the time); a wide MLP on large batches is compute (~1x)."""
    fast = _in_one_of_three(
        lambda: probe_batching(_mlp, LocalTrainingSpec(), Objective(), _features(), CPU),
        lambda verdict: verdict.obstacle is None and verdict.batched_seconds < verdict.single_seconds,
    )
    assert fast[-1].obstacle is None and fast[-1].batched_seconds < fast[-1].single_seconds, fast

    def wide() -> nn.Module:
        return nn.Sequential(nn.Linear(6, 2048), nn.ReLU(), nn.Linear(2048, 2048), nn.ReLU(), nn.Linear(2048, 4))

    slow = _in_one_of_three(
        lambda: probe_batching(wide, LocalTrainingSpec(batch_size=64), Objective(), _features(2000), CPU).obstacle,
        lambda obstacle: obstacle is not None and obstacle.startswith("batched training is not faster"),
    )
    assert slow[-1] is not None and slow[-1].startswith("batched training is not faster"), slow
    assert "at most 0.8x" in slow[-1]


def test_the_leaf_plans_the_thread_pool_for_a_refused_model(tmp_path):
    """A user task whose model uses dropout: the processor's probe refuses batching and the plan says why."""
    from devsim.resources.device_batch import plan_device_batch
    from processors.task_processor import TaskDeviceProcessor
    from tests.test_tasks import GOOD, write_task

    path = write_task(tmp_path, GOOD.replace("nn.ReLU(),", "nn.ReLU(), nn.Dropout(0.2),"), "dropout_task.py")
    worker = TaskDeviceProcessor.from_settings({"task": path, "seed": 0})
    worker.setup()
    plan = plan_device_batch(
        "auto",
        obstacle=worker.batching_obstacle,
        device_bytes=1,
        device="cpu",
        num_workers=1,
        num_params=worker.num_params,
    )
    assert plan.size == 1 and "thread pool" in plan.reason and "vmap cannot run the model" in plan.reason
    metrics = worker.train_device(0, 0, [t.clone() for t in worker._ready().state_tensors])
    assert metrics.num_samples == 4


def test_an_explicit_device_batch_checks_exactness_only(tmp_path, monkeypatch):
    """auto times both ways (load-dependent); an explicit --device-batch N does not, so its path is fixed."""
    import devsim.training.probe.batch_probe as batch_probe
    from processors.task_processor import TaskDeviceProcessor
    from tests.test_tasks import GOOD, write_task

    monkeypatch.setattr(batch_probe, "_timed", lambda *args: (1.0, 2.0))  # batched measured twice as slow
    worker = TaskDeviceProcessor.from_settings({"task": write_task(tmp_path, GOOD, "mlp_task.py"), "seed": 0})
    worker.setup()
    assert worker.batching_obstacle(timed=False) is None
    assert worker.batching_obstacle(timed=True).startswith("batched training is not faster")


def test_the_channels_last_fold_is_kept_for_plain_conv_nets_and_dropped_for_pooling():
    """The fold pays for the stride-2 CNN; with max pooling (examples/mnist_task.py's LeNet) it costs 40%."""
    from devsim.models import build_model

    cnn = BatchedTrainer(build_model("cnn"), LocalTrainingSpec(), CPU, example=torch.zeros(1, 3, 32, 32))
    assert cnn.fold_channels_last

    class Pooled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.fc = nn.Conv2d(1, 4, 5), nn.Linear(4 * 12 * 12, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(F.max_pool2d(F.relu(self.conv(x)), 2).flatten(1))

    pooled = BatchedTrainer(Pooled(), LocalTrainingSpec(), CPU, example=torch.zeros(1, 1, 28, 28))
    assert not pooled.fold_channels_last and BatchedTrainer(Pooled(), LocalTrainingSpec(), CPU).fold_channels_last


def test_a_difference_within_the_models_own_rounding_sensitivity_is_rounding(monkeypatch):
    """Above the tolerance, the batched path still counts as exact when one rounding step of the start weights moves
    the one-at-a-time updates at least a quarter as far (a model that amplifies rounding); a model with hidden state
    is still refused when the loop itself is stable."""
    spec, pool = LocalTrainingSpec(), _features()
    stable = probe_batching(Drifting, spec, Objective(), pool, CPU, timed=False)
    assert stable.obstacle is not None and "one float32 rounding step" in stable.obstacle
    monkeypatch.setattr("devsim.training.probe.batch_probe.rounding_sensitivity", lambda *args: 1e6)
    chaotic = probe_batching(Drifting, spec, Objective(), pool, CPU, timed=False)
    assert chaotic.obstacle is None and "within 4x of the" in chaotic.note


@pytest.mark.slow
def test_resnet18_batches_within_its_rounding_sensitivity():
    """ResNet-18's updates move by ~1e-1 of the largest from one rounding step of the start weights, so the batched
    path (which differs from the loop by ~4e-2) is accepted, with the note saying why."""
    from devsim.models import build_model

    gen = torch.Generator().manual_seed(0)
    pool = ShardPool(torch.randn(80, 3, 32, 32, generator=gen), torch.randint(0, 10, (80,), generator=gen), [])
    spec = LocalTrainingSpec(batch_size=10, lr=0.05, momentum=0.9)
    outcome = probe_batching(lambda: build_model("resnet18"), spec, Objective(augment=None), pool, CPU, timed=False)
    assert outcome.obstacle is None and "amplifies rounding" in outcome.note


def test_deterministic_kernels_switch_cudnn_and_torch_to_deterministic_on_cuda_only_and_restore_them():
    before = (
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
        torch.are_deterministic_algorithms_enabled(),
    )
    with deterministic_kernels(CPU):
        assert (torch.backends.cudnn.deterministic, torch.are_deterministic_algorithms_enabled()) == (
            before[0],
            before[2],
        )
    with deterministic_kernels(torch.device("cuda", 0)):
        assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
        assert torch.are_deterministic_algorithms_enabled() and torch.is_deterministic_algorithms_warn_only_enabled()
    after = (
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
        torch.are_deterministic_algorithms_enabled(),
    )
    assert after == before


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: cuDNN's run-to-run nondeterminism")
def test_resnet18_batches_on_cuda_within_its_rounding_sensitivity():
    """On a GPU the one-at-a-time runs themselves differ (atomics in cuDNN's weight gradients); the sensitivity is
    measured under deterministic kernels, so ResNet-18 batches there as on the CPU."""
    from devsim.models import build_model

    cuda = torch.device("cuda")
    gen = torch.Generator().manual_seed(0)
    inputs, targets = torch.randn(80, 3, 32, 32, generator=gen), torch.randint(0, 10, (80,), generator=gen)
    pool = ShardPool(inputs.to(cuda), targets.to(cuda), [])
    spec = LocalTrainingSpec(batch_size=10, lr=0.05, momentum=0.9)
    outcome = probe_batching(lambda: build_model("resnet18"), spec, Objective(augment=None), pool, cuda, timed=False)
    assert outcome.obstacle is None
