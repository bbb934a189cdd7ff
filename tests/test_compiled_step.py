"""The compiled batched step: bucketed group sizes, padded devices that never change the real devices' updates."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from devsim.data.device_shards import ShardPool
from devsim.training.batched import BatchedTrainer
from devsim.training.compiled_step import (
    BUCKETS,
    CompiledGroups,
    bucket_for,
    compile_options_for,
    probe_compiled,
    resolve_compile,
)
from devsim.training.flat_step import batched_step
from devsim.training.graphed_step import GRAPH_OPTIONS, GraphedStep
from devsim.training.local import LocalTrainingSpec
from devsim.training.probe.batch_probe import TOLERANCE

SPEC = LocalTrainingSpec(epochs=1, batch_size=4, lr=0.1, momentum=0.9)
FAST = {"backend": "eager"}  # dynamo traces and guards the step as torch.compile does, without code generation


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3))


def _pool(devices: int, samples: int = 8) -> ShardPool:
    gen = torch.Generator().manual_seed(1)
    inputs = torch.randn(devices * samples, 6, generator=gen)
    targets = torch.randint(0, 3, (devices * samples,), generator=gen)
    return ShardPool(inputs, targets, [torch.arange(i * samples, (i + 1) * samples) for i in range(devices)])


def _start(model: nn.Module) -> list[torch.Tensor]:
    return [t.detach().clone() for t in model.state_dict().values()]


@pytest.mark.parametrize(("count", "bucket"), [(1, 2), (2, 2), (3, 4), (5, 8), (10, 16), (256, 256), (300, 300)])
def test_bucket_for(count, bucket):
    assert bucket_for(count) == bucket


@pytest.mark.parametrize("count", [3, 5])
def test_padded_compiled_group_gives_the_eager_updates_of_the_real_devices(count):
    model = _model()
    pool, start = _pool(count), _start(model)
    ids = [10 + i for i in range(count)]
    want, want_metrics = BatchedTrainer(_model(), SPEC, torch.device("cpu")).train_pool(
        ids, start, pool, [torch.Generator().manual_seed(i) for i in ids]
    )
    compiled = CompiledGroups(BatchedTrainer(_model(), SPEC, torch.device("cpu"), compile_options=FAST))
    got, metrics = compiled.train_pool(ids, start, pool, [torch.Generator().manual_seed(i) for i in ids])
    assert [g.shape[0] for g in got] == [count] * len(got)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-6)
    assert [m.device_id for m in metrics] == ids
    assert [m.loss for m in metrics] == pytest.approx([m.loss for m in want_metrics])


def test_padded_group_with_per_device_bases():
    model = _model()
    pool = _pool(3)
    bases = [torch.stack([t + 0.01 * i for i in range(3)]) for t in _start(model)]
    ids = [0, 1, 2]
    want, _ = BatchedTrainer(_model(), SPEC, torch.device("cpu")).train_pool(
        ids, bases, pool, [torch.Generator().manual_seed(i) for i in ids], per_device_base=True
    )
    compiled = CompiledGroups(BatchedTrainer(_model(), SPEC, torch.device("cpu"), compile_options=FAST))
    got, _ = compiled.train_pool(ids, bases, pool, [torch.Generator().manual_seed(i) for i in ids], True)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-6)


def test_warm_compiles_the_buckets_of_the_expected_groups():
    compiled = CompiledGroups(BatchedTrainer(_model(), SPEC, torch.device("cpu"), compile_options=FAST))
    assert compiled.warm([10, 9, 1], _pool(2), _start(_model())) == [16]


def test_probe_accepts_an_exact_step_and_names_what_rules_one_out():
    pool, start = _pool(3), _start(_model())

    def build(options):
        return BatchedTrainer(_model(), SPEC, torch.device("cpu"), compile_options=None if options is None else FAST)

    verdict = probe_compiled(build, pool, start, TOLERANCE)
    assert verdict is None or verdict.startswith("replayed not faster on the probe")

    def broken(options):
        if options is not None:
            raise RuntimeError("no compiler here")
        return build(None)

    assert probe_compiled(broken, pool, start, TOLERANCE).startswith("torch.compile failed: RuntimeError")


def test_resolve_compile():
    assert not resolve_compile("off", "cuda").enabled
    for setting in ("auto", "graphs"):
        on_cpu = resolve_compile(setting, "cpu")
        assert not on_cpu.enabled and "eager on the CPU" in on_cpu.reason
    on_cpu = resolve_compile("on", "cpu")
    assert on_cpu.enabled and on_cpu.options == {} and str(BUCKETS) in on_cpu.reason
    auto_gpu = resolve_compile("auto", "cuda:0", probe=lambda: None)
    assert auto_gpu.enabled and auto_gpu.options == GRAPH_OPTIONS and "CUDA graphs" in auto_gpu.reason
    assert resolve_compile("graphs", "cuda:0", probe=lambda: "never asked").options == GRAPH_OPTIONS
    on_gpu = resolve_compile("on", "cuda:0", num_params=11_173_962)
    assert on_gpu.enabled and on_gpu.options == compile_options_for("cuda") == {"mode": "reduce-overhead"}
    big = resolve_compile("auto", "cuda:0", probe=lambda: None, num_params=11_173_962)
    assert not big.enabled and "--compile graphs forces it" in big.reason
    refused = resolve_compile("auto", "cuda:0", probe=lambda: "replayed not faster")
    assert not refused.enabled and "replayed not faster" in refused.reason
    with pytest.raises(ValueError, match="compile must be one of off, auto, graphs, on"):
        resolve_compile("sometimes", "cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: CUDA graphs, captured or compiled")
@pytest.mark.parametrize("options", [dict(GRAPH_OPTIONS), {"mode": "reduce-overhead"}], ids=["graphs", "compiled"])
def test_cuda_graph_groups_match_eager(options):
    device = torch.device("cuda")
    model = _model().to(device)
    pool = _pool(3)
    pool = ShardPool(pool.inputs.to(device), pool.targets.to(device), [i.to(device) for i in pool.indices])
    start = [t.to(device) for t in _start(model)]
    ids = [0, 1, 2]
    want, _ = BatchedTrainer(_model(), SPEC, device).train_pool(
        ids, start, pool, [torch.Generator().manual_seed(i) for i in ids]
    )
    groups = CompiledGroups(BatchedTrainer(_model(), SPEC, device, compile_options=options))
    for _ in range(3):
        got, _ = groups.train_pool(ids, start, pool, [torch.Generator().manual_seed(i) for i in ids])
    for g, w in zip(got, want, strict=True):  # graphs: eager's kernels, apart from the GPU's own nondeterminism
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-6)


def test_a_failing_compiled_step_falls_back_to_eager_with_the_same_updates(capsys):
    pool, start = _pool(3), _start(_model())
    ids = [0, 1, 2]
    want, _ = BatchedTrainer(_model(), SPEC, torch.device("cpu")).train_pool(
        ids, start, pool, [torch.Generator().manual_seed(i) for i in ids]
    )

    def boom(graph, example_inputs):
        raise RuntimeError("no compiler here")

    compiled = CompiledGroups(
        BatchedTrainer(_model(), SPEC, torch.device("cpu"), compile_options={"backend": boom}),
        fallback=lambda: BatchedTrainer(_model(), SPEC, torch.device("cpu")),
    )
    for _ in range(2):
        got, _ = compiled.train_pool(ids, start, pool, [torch.Generator().manual_seed(i) for i in ids])
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(g, w, rtol=0, atol=0)
    assert capsys.readouterr().out.count("eager from now on") == 1


def _bn_model() -> nn.Module:
    torch.manual_seed(2)
    return nn.Sequential(nn.Linear(6, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3))


def test_graphed_step_copies_in_and_out_as_the_eager_step_computes():
    """Without capture (the CPU), GraphedStep runs the step on its static tensors: same gradients, losses and
    outputs as the eager step, buffers updated in place in the caller's tensors, one static set per shape."""
    model = _bn_model()
    params_keys = [n for n, _ in model.named_parameters()]
    buffer_keys = [n for n, _ in model.named_buffers()]
    step = batched_step(model, nn.functional.cross_entropy, params_keys, buffer_keys)
    graphed = GraphedStep(step, capture=False)
    gen = torch.Generator().manual_seed(3)
    for devices in (3, 3, 5):
        state = dict(model.named_parameters()) | dict(model.named_buffers())
        stacked = {k: v.detach().unsqueeze(0).repeat(devices, *[1] * v.dim()).clone() for k, v in state.items()}
        params = tuple(stacked[k] + 0.01 * torch.randn(stacked[k].shape, generator=gen) for k in params_keys)
        buffers = tuple(stacked[k] for k in buffer_keys)
        twins = tuple(b.clone() for b in buffers)
        inputs = torch.randn(4, devices, 6, generator=gen)
        targets = torch.randint(0, 3, (4, devices), generator=gen)
        want_grads, (want_loss, want_out) = step(params, twins, inputs, targets)
        got_grads, (got_loss, got_out) = graphed(params, buffers, inputs, targets)
        for got, want in zip(
            [*got_grads, got_loss, got_out, *buffers], [*want_grads, want_loss, want_out, *twins], strict=True
        ):
            assert torch.equal(got, want)
    assert graphed.shapes == 2


def test_graphed_trainer_trains_every_group_at_its_own_size_as_eager_does():
    ids = [4, 5, 6]
    pool, start = _pool(3), _start(_model())
    want, _ = BatchedTrainer(_model(), SPEC, torch.device("cpu")).train_pool(
        ids, start, pool, [torch.Generator().manual_seed(i) for i in ids]
    )
    trainer = BatchedTrainer(_model(), SPEC, torch.device("cpu"), compile_options=dict(GRAPH_OPTIONS))
    groups = CompiledGroups(trainer)
    assert trainer.graphed and groups.buckets == () and not groups.cudagraph_trees
    got, _ = groups.train_pool(ids, start, pool, [torch.Generator().manual_seed(i) for i in ids])
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)
    assert groups.warm([3, 2, 1], _pool(2), start) == [2, 3]
