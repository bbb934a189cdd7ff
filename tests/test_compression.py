"""Uplink compression and the network model: codec round trips and byte counts, error feedback, the
bounded residual store, transfer-time arithmetic, ``none`` unchanged, and configuration errors (fast)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from devsim.clock import AsyncScheduler, NetworkModel, SyncRoundClock, load_schedule, transfer_seconds
from devsim.clock.network import BYTES_PER_MEGABIT, DeviceLink
from devsim.compression import (
    CodecSpec,
    ResidualStore,
    UplinkCompressor,
    UplinkStats,
    decode,
    encode,
    payload_bytes,
    round_payload_bytes,
)
from devsim.compression import uplink as uplink_module
from devsim.compression.codecs import _cpu_topk_indices, _int8_scales
from devsim.config import AsyncConfig, ConfigError, SimulationConfig
from tests.conftest import codec_id, lossy_codecs, small_processors

SPECS = [
    CodecSpec("none"),
    CodecSpec("fp16"),
    CodecSpec("int8"),
    CodecSpec("int8", int8_block=7),
    CodecSpec("topk", topk_fraction=0.1),
    CodecSpec("topk", topk_fraction=1.0),
    CodecSpec("topk", topk_fraction=0.3, topk_values="float16"),
    CodecSpec("topk", topk_fraction=0.3, topk_values="int8"),
]

shapes = st.lists(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=9), min_size=1, max_size=4)
finite = st.floats(-1e3, 1e3, allow_nan=False, width=32)


@st.composite
def updates(draw):
    return [torch.from_numpy(draw(hnp.arrays(np.float32, shape, elements=finite))) for shape in draw(shapes)]


@settings(max_examples=60, deadline=None)
@given(tensors=updates(), spec=st.sampled_from(SPECS))
def test_round_trip_shapes_bytes_and_error_bounds(tensors, spec):
    encoded = encode(tensors, spec)
    decoded = decode(encoded, spec)
    assert encoded.nbytes == payload_bytes([t.shape for t in tensors], spec)
    assert [r.shape for r in decoded] == [t.shape for t in tensors]
    assert all(r.dtype == torch.float32 for r in decoded)
    x = np.concatenate([t.numpy().ravel() for t in tensors]).astype(np.float64)
    y = np.concatenate([r.numpy().ravel() for r in decoded]).astype(np.float64)
    if spec.name == "none":
        assert all(r is t for r, t in zip(decoded, tensors, strict=True))
    elif spec.name == "fp16":
        np.testing.assert_allclose(y, x, rtol=1e-3, atol=1e-7)
    elif spec.name == "int8" and spec.int8_block == 0:
        for original, received in zip(tensors, decoded, strict=True):
            scale = np.abs(original.numpy()).max(initial=0.0) / 127
            assert np.all(np.abs(received.numpy() - original.numpy()) <= scale / 2 * (1 + 1e-5) + 1e-12)
    elif spec.name == "int8":
        for start in range(0, x.size, spec.int8_block):
            block = slice(start, start + spec.int8_block)
            scale = np.abs(x[block]).max() / 127
            assert np.all(np.abs(y[block] - x[block]) <= scale / 2 * (1 + 1e-5) + 1e-12)
    else:
        k = spec.topk_count(x.size)
        kept = np.flatnonzero(y != 0)
        assert kept.size <= k
        if spec.topk_values != "float32":  # a kept value may round to 0
            kept = np.flatnonzero(np.isin(np.arange(x.size), encoded.parts[0].to(torch.int64).numpy()))
        if spec.topk_values == "float16":
            np.testing.assert_allclose(y[kept], x[kept], rtol=1e-3, atol=1e-7)
        elif spec.topk_values == "int8":
            scale = np.abs(x[kept]).max(initial=0.0) / 127
            assert np.all(np.abs(y[kept] - x[kept]) <= scale / 2 * (1 + 1e-5) + 1e-12)
        else:
            np.testing.assert_array_equal(y[kept], x[kept])
        dropped = np.abs(np.delete(x, kept))
        assert dropped.size == 0 or dropped.max() <= np.sort(np.abs(x))[::-1][k - 1]


def test_byte_ratios_of_a_cnn_sized_update():
    shapes = [(64, 3, 5, 5), (64,), (128, 1600), (128,), (10, 128), (10,)]
    full = payload_bytes(shapes, CodecSpec("none"))
    assert full == 4 * sum(math.prod(s) for s in shapes)
    assert full / payload_bytes(shapes, CodecSpec("fp16")) == 2
    assert full / payload_bytes(shapes, CodecSpec("int8")) > 3.99
    assert full / payload_bytes(shapes, CodecSpec("int8", int8_block=256)) > 3.9
    assert full / payload_bytes(shapes, CodecSpec("topk", topk_fraction=0.01)) > 30


def test_topk_indices_take_the_narrowest_exact_integer_type():
    for numel, dtype in ((256, torch.uint8), (257, torch.uint16), (2**16, torch.uint16), (2**16 + 1, torch.int32)):
        x = torch.zeros(numel)
        x[-1] = 5.0  # the largest index must survive the narrow type
        spec = CodecSpec("topk", topk_fraction=1 / numel)
        encoded = encode([x], spec)
        assert encoded.parts[0].dtype == dtype and encoded.nbytes == payload_bytes([x.shape], spec)
        assert encoded.nbytes == dtype.itemsize + 4 and decode(encoded, spec)[0][-1] == 5.0
    half = CodecSpec("topk", topk_fraction=0.01, topk_values="float16")
    assert payload_bytes([(62006,)], half) == 621 * (2 + 2) and payload_bytes([(62006,)], CodecSpec("topk")) == 621 * 6
    assert payload_bytes([(62006,)], CodecSpec("topk", topk_values="int8")) == 621 * (2 + 1) + 4  # + one scale


magnitudes = hnp.arrays(
    np.float32,
    st.integers(1, 400),
    elements=st.one_of(st.sampled_from([0.0, 0.5, 1.0]), st.floats(0, 1e3, width=32), st.just(float("nan"))),
)


@settings(max_examples=200, deadline=None)
@given(values=magnitudes, data=st.data())
def test_cpu_topk_picks_k_entries_none_smaller_than_any_left_out(values, data):
    """The CPU selection (with its every-16th-entry shortcut for small k) keeps exactly k distinct entries and
    nothing left out is larger than what was kept (NaN counts as the largest), ties and NaN included."""
    k = data.draw(st.integers(0, values.size))
    chosen = _cpu_topk_indices(values, k)
    assert chosen.size == k and np.unique(chosen).size == k
    ranked = np.where(np.isnan(values), np.inf, values)
    left_out = np.setdiff1d(np.arange(values.size), chosen)
    if k and left_out.size:
        assert ranked[chosen].min() >= ranked[left_out].max()
        if ranked[chosen].min() > ranked[left_out].max():  # no tie at the threshold: the set is unique
            assert np.array_equal(np.sort(chosen), np.sort(np.argsort(-ranked, kind="stable")[:k]))


@pytest.mark.parametrize("k", [1, 40, 400, 3000])
@pytest.mark.parametrize("sampled", [True, False])
def test_cpu_topk_is_exact_when_the_sample_misleads(k, sampled):
    """The selection reads a lower bound from every 16th entry. Large entries all on those positions make the
    bound too high (fewer than k entries clear it: the full partition must take over); large entries all
    between them make it too low (many candidates). Either way the result is the true top k."""
    rng = np.random.default_rng(k)
    values = rng.random(8192, dtype=np.float32)
    on_stride = np.arange(values.size) % 16 == 0
    values[on_stride if sampled else ~on_stride] += 10.0
    chosen = _cpu_topk_indices(values, k)
    assert np.array_equal(np.sort(chosen), np.sort(np.argsort(-values, kind="stable")[:k]))


@settings(max_examples=60, deadline=None)
@given(tensors=updates(), block=st.sampled_from([0, 1, 7, 64]))
def test_cpu_int8_scales_equal_per_segment_torch_maxima(tensors, block):
    """The CPU scales (one NumPy reduction) equal ``amax(|x|) / 127`` of each entry or block in torch."""
    flat = torch.cat([t.reshape(-1) for t in tensors])
    shapes = tuple(tuple(t.shape) for t in tensors)
    scales, per_element = _int8_scales(flat, shapes, block)
    n = flat.numel()
    sizes = [t.numel() for t in tensors] if block == 0 else [min(block, n - s) for s in range(0, n, block)]
    expected = [p.abs().amax() / 127 if p.numel() else torch.tensor(0.0) for p in torch.split(flat, sizes)]
    assert torch.equal(scales, torch.stack(expected) if expected else torch.zeros(0))
    safe = [e if e > 0 else torch.tensor(1.0) for e in expected]
    assert torch.equal(
        per_element,
        torch.cat([e.expand(size) for e, size in zip(safe, sizes, strict=True)]) if sizes else torch.zeros(0),
    )


def test_topk_warmup_ramps_density_down_to_the_fraction():
    spec = CodecSpec("topk", topk_fraction=0.01, topk_warmup_rounds=3)
    fractions = [spec.at_round(r).topk_fraction for r in range(5)]
    assert fractions[:3] == pytest.approx([0.01**0.25, 0.01**0.5, 0.01**0.75]) and fractions[3:] == [0.01, 0.01]
    assert spec.at_round(7) is spec and CodecSpec("int8", topk_warmup_rounds=3).at_round(0).name == "int8"
    shapes = [(1000,), (10,)]
    per_round = round_payload_bytes(shapes, spec)
    assert [per_round(r) for r in range(4)] == [payload_bytes(shapes, spec.at_round(r)) for r in range(4)]
    assert per_round(0) > per_round(1) > per_round(2) > per_round(3) == payload_bytes(shapes, spec)
    assert round_payload_bytes(shapes, CodecSpec("topk")) == payload_bytes(shapes, CodecSpec("topk"))
    uplink = UplinkCompressor(spec, residual_capacity=4)
    stats = [UplinkStats() for _ in range(4)]
    for r in range(4):
        uplink.transmit(1, r, [torch.randn(1000), torch.randn(10)], stats[r])
    assert [s.bytes_sent for s in stats] == [per_round(r) for r in range(4)]
    clock = SyncRoundClock(load_schedule("paper_default"), NetworkModel(1.0), 0, 0, per_round)
    assert [clock.upload_bytes_at(r) for r in range(4)] == [per_round(r) for r in range(4)]
    assert clock.device_seconds(0, 3)[1] > clock.device_seconds(3, 3)[1]


def test_codec_spec_from_settings_and_bad_values():
    spec = CodecSpec.from_settings(
        {"update_codec": "topk", "topk_fraction": 0.02, "topk_values": "float16", "topk_warmup_rounds": 2}
    )
    assert spec == CodecSpec("topk", topk_fraction=0.02, topk_values="float16", topk_warmup_rounds=2)
    assert CodecSpec.from_settings({}) == CodecSpec("none")
    with pytest.raises(ValueError, match="topk_values 'bfloat16' is not one of float32, float16, int8"):
        CodecSpec("topk", topk_values="bfloat16")
    with pytest.raises(ValueError, match="topk_warmup_rounds must be >= 0"):
        CodecSpec("topk", topk_warmup_rounds=-1)


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    rounds=st.integers(1, 6),
    fraction=st.sampled_from([0.05, 0.3, 1.0]),
    values=st.sampled_from(["float32", "float16", "int8"]),
    warmup=st.sampled_from([0, 3]),
)
def test_error_feedback_conserves_the_sum_of_updates(seed, rounds, fraction, values, warmup):
    """What was sent plus the residual is the sum of the updates, also with float16 or int8 values (their
    rounding stays in the residual) and during a warm-up."""
    rng = np.random.default_rng(seed)
    spec = CodecSpec("topk", topk_fraction=fraction, topk_values=values, topk_warmup_rounds=warmup)
    uplink = UplinkCompressor(spec, residual_capacity=4, residual_max_age=10)
    shapes = [(3, 4), (5,)]
    true_sum = [np.zeros(s, dtype=np.float64) for s in shapes]
    sent_sum = [np.zeros(s, dtype=np.float64) for s in shapes]
    for r in range(rounds):
        update = [torch.from_numpy(rng.standard_normal(s).astype(np.float32)) for s in shapes]
        received = uplink.transmit(7, r, update, UplinkStats())
        for i in range(len(shapes)):
            true_sum[i] += update[i].numpy()
            sent_sum[i] += received[i].numpy()
    residual = uplink.residuals.take(7, rounds).numpy()
    sent = np.concatenate([s.ravel() for s in sent_sum])
    np.testing.assert_allclose(sent + residual, np.concatenate([t.ravel() for t in true_sum]), atol=1e-5)


def test_residual_store_is_bounded_by_age_and_capacity():
    store = ResidualStore(capacity=2, max_age=3)
    one = torch.ones(2)
    for device, stamp in ((1, 0), (2, 1), (3, 2), (4, 2)):
        store.put(device, stamp, one)
    assert store.sweep(2) == 2 and len(store) == 2  # oldest two (devices 1, 2) go
    assert store.take(1, 2) is None
    store.put(5, 3, one)
    assert store.take(3, 9) is None and store.evicted == 3  # too old when seen again
    assert store.sweep(6) == 1 and len(store) == 1  # device 4 (stamp 2) is older than 3 at 6
    assert store.take(5, 6).tolist() == [1.0, 1.0]


def test_residual_store_is_bounded_by_bytes():
    store = ResidualStore(capacity=100, max_age=50, max_bytes=3 * 4 * 10)  # three residuals of 10 floats
    for device in range(6):
        store.put(device, device, torch.ones(10))
    assert store.sweep(6) == 3 and len(store) == 3
    assert store.take(0, 6) is None and store.take(5, 6) is not None  # oldest went first
    tiny = ResidualStore(capacity=100, max_age=50, max_bytes=1)
    tiny.put(1, 0, torch.ones(10))
    tiny.put(2, 0, torch.ones(10))
    assert tiny.sweep(0) == 1 and len(tiny) == 1  # never below one residual


def test_uplink_counts_bytes_and_evictions():
    uplink = UplinkCompressor(CodecSpec("topk", topk_fraction=0.25), residual_capacity=1, residual_max_age=5)
    stats = UplinkStats()
    for device in (1, 2, 3):
        uplink.transmit(device, 0, [torch.arange(8, dtype=torch.float32)], stats)
    uplink.sweep(0)
    assert stats.updates == 3 and stats.bytes_sent == 3 * 2 * (1 + 4) and stats.raw_bytes == 3 * 32  # uint8 indices
    assert uplink.residual_counts() == {"residuals_held": 1, "residual_evictions": 2}


def test_none_passes_updates_through_untouched():
    uplink = UplinkCompressor(CodecSpec("none"))
    update = [torch.randn(3, 3), torch.randn(4)]
    stats = UplinkStats()
    assert uplink.transmit(0, 0, update, stats) is update
    assert stats.bytes_sent == stats.raw_bytes == 4 * 13 and uplink.residuals is None


def test_transfer_time_arithmetic():
    assert transfer_seconds(1_000_000, 125_000.0, 0.05) == pytest.approx(8.05)
    assert transfer_seconds(123, None, 1.0) == 0.0
    with pytest.raises(ValueError, match="bandwidth"):
        transfer_seconds(1, 0.0)
    link = NetworkModel(uplink_mbps=2.0, downlink_mbps=8.0, latency_ms=40).link_for(seed=1, device_id=9)
    assert link == DeviceLink(2 * BYTES_PER_MEGABIT, 8 * BYTES_PER_MEGABIT, 0.04)
    assert link.upload_seconds(250_000) == pytest.approx(1.04)
    spread = NetworkModel(uplink_mbps=2.0, spread=0.5)
    assert spread.link_for(1, 9) == spread.link_for(1, 9) != spread.link_for(1, 10)
    assert spread.link_for(1, 9).downlink_bytes_per_s is None


def test_scheduler_adds_transfer_time_and_compression_reorders_arrivals():
    args = dict(
        population_size=40,
        schedule="paper_default",
        seed=5,
        concurrency=10,
        buffer_size=1,
        min_open_slots=1,
        max_versions=50,
    )
    plain = AsyncScheduler(**args).start()
    network = NetworkModel(uplink_mbps=1.0, downlink_mbps=10.0, latency_ms=50, spread=0.8)
    big = AsyncScheduler(**args, network=network, download_bytes=400_000, upload_bytes=400_000).start()
    small = AsyncScheduler(**args, network=network, download_bytes=400_000, upload_bytes=10_000).start()
    for p, b in zip(plain, big, strict=True):
        link = network.link_for(5, p.device_id)
        assert b.train_time == p.train_time
        assert b.upload_time == pytest.approx(p.upload_time + link.upload_seconds(400_000))
        assert b.download_time == pytest.approx(p.download_time + link.download_seconds(400_000))
    order = [j.job_id for j in sorted(big, key=lambda j: j.arrival_time)]
    assert order != [j.job_id for j in sorted(small, key=lambda j: j.arrival_time)]
    state = AsyncScheduler(**args, network=network, download_bytes=400_000, upload_bytes=10_000)
    state.start()
    with pytest.raises(ValueError, match="network"):
        AsyncScheduler(**args).load_state_dict(state.state_dict())


def test_sync_round_clock_is_max_over_devices_and_seeded():
    network = NetworkModel(uplink_mbps=1.0, latency_ms=10)
    clock = SyncRoundClock(load_schedule("paper_default"), network, seed=2, download_bytes=0, upload_bytes=125_000)
    parts = [clock.device_seconds(0, d) for d in (1, 2, 3)]
    fields = clock.round_seconds(0, [3, 1, 2])
    assert fields["simulated_round_seconds"] == pytest.approx(max(c + t for c, t in parts))
    assert all(t == pytest.approx(1.01) for _, t in parts)
    assert clock.now == fields["simulated_time"]
    again = SyncRoundClock(load_schedule("paper_default"), network, seed=2, download_bytes=0, upload_bytes=125_000)
    assert again.round_seconds(0, [1, 2, 3]) == fields


@pytest.mark.parametrize(
    "changes, flag, allowed",
    [
        ({"update_codec": "zip"}, "--update-codec", "none, fp16, int8, topk"),
        ({"topk_fraction": 0.0}, "--topk-fraction", "(0, 1]"),
        ({"topk_fraction": 1.5}, "--topk-fraction", "(0, 1]"),
        ({"uplink_mbps": 0.0}, "--uplink-mbps", "> 0"),
        ({"downlink_mbps": -3.0}, "--downlink-mbps", "> 0"),
        ({"latency_ms": -1.0}, "--latency-ms", ">= 0"),
        ({"int8_block": -1}, "--int8-block", "minimum of 0"),
        ({"residual_capacity": 0}, "--residual-capacity", "minimum of 1"),
        ({"topk_values": "int4"}, "--topk-values", "float32, float16, int8"),
        ({"topk_warmup_rounds": -1}, "--topk-warmup-rounds", "minimum of 0"),
    ],
)
def test_bad_codec_and_network_values_name_the_flag(changes, flag, allowed):
    for cls in (SimulationConfig, AsyncConfig):
        with pytest.raises(ConfigError) as info:
            cls(**changes).validate()
        assert str(info.value).startswith(flag) and allowed in str(info.value)


def test_topk_warmup_is_refused_in_asynchronous_runs():
    SimulationConfig(update_codec="topk", topk_warmup_rounds=3).validate()
    with pytest.raises(ConfigError) as info:
        AsyncConfig(update_codec="topk", topk_warmup_rounds=3, max_versions=5).validate()
    assert str(info.value).startswith("--topk-warmup-rounds") and "asynchronous" in str(info.value)


def test_none_codec_leaf_results_equal_uncompressed_training():
    """The ``none`` uplink changes nothing: the leaf's sum and job deltas are bit-identical to training alone."""
    from devsim.codec import model_to_numpy, numpy_to_tensors, tensors_to_numpy
    from devsim.models import build_model
    from devsim.training.leaf_runner import LeafRoundRunner

    weights = model_to_numpy(build_model("cnn"))
    runner = LeafRoundRunner(small_processors(1), uplink=UplinkCompressor(CodecSpec("none")))
    reference = small_processors(1)[0]
    try:
        result = runner.run_round(1, weights, [4, 2])
        jobs = runner.run_jobs(weights, [0, 1], [4, 2], [11, 12], version=3)
    finally:
        runner.close()
    global_tensors = numpy_to_tensors(weights, reference.keys, reference.torch_device)
    accumulator = [torch.zeros_like(t) for t in global_tensors]
    delta = [torch.empty_like(t) for t in global_tensors]
    for device in (2, 4):
        metrics = reference.train_device(device, 1, global_tensors)
        reference.delta_into(delta, global_tensors)
        torch._foreach_add_(accumulator, delta, alpha=float(metrics.num_samples))
    expected = tensors_to_numpy(reference.keys, accumulator)
    for key in weights:
        assert np.array_equal(result.delta_sum[key], expected[key])
    assert (
        result.counts["uplink_bytes"]
        == result.counts["uplink_raw_bytes"]
        == 2 * 4 * sum(v.size for v in weights.values())
    )
    for row, (device, seed) in enumerate(((4, 11), (2, 12))):
        reference.train_with_seed(device, seed, global_tensors)
        alone = tensors_to_numpy(reference.keys, reference.delta(global_tensors))
        for key in weights:
            assert np.array_equal(jobs["deltas"][key][row], alone[key])


def test_topk_leaf_round_reports_compressed_bytes_and_keeps_residuals():
    from devsim.codec import model_to_numpy
    from devsim.models import build_model
    from devsim.training.leaf_runner import LeafRoundRunner

    weights = model_to_numpy(build_model("cnn"))
    spec = CodecSpec("topk", topk_fraction=0.01)
    uplink = UplinkCompressor(spec, residual_capacity=1, residual_max_age=5)
    runner = LeafRoundRunner(small_processors(1), uplink=uplink)
    try:
        result = runner.run_round(0, weights, [1, 2, 3])
    finally:
        runner.close()
    assert result.counts["uplink_bytes"] == 3 * payload_bytes([v.shape for v in weights.values()], spec)
    assert result.counts["uplink_raw_bytes"] / result.counts["uplink_bytes"] > 30
    assert result.counts["residuals_held"] == 1 and result.counts["residual_evictions"] == 2
    assert result.timing["codec_seconds"] > 0


def test_traffic_counter_windows_totals_and_timing_info():
    from devsim.observe.timing import MEASURED_PARTS, RoundTiming, summarize
    from devsim.observe.traffic import HOPS, TrafficCounter, array_bytes, with_bytes

    traffic = TrafficCounter()
    traffic.add("device_to_leaf", 10)
    traffic.add("leaf_to_server", array_bytes({"a": np.zeros(3, np.float32), "b": {"c": np.zeros(2, np.int64)}}))
    first = traffic.drain()
    traffic.add("device_to_leaf", 5)
    assert first["device_to_leaf"] == 10 and first["leaf_to_server"] == 28 and set(first) == set(HOPS)
    assert traffic.drain()["device_to_leaf"] == 5 and traffic.totals["device_to_leaf"] == 15
    with pytest.raises(KeyError, match="hops"):
        traffic.add("uplink", 1)
    timing = with_bytes(RoundTiming(1.0, dict.fromkeys(MEASURED_PARTS, 0.1)), first)
    assert timing.info["bytes_device_to_leaf"] == 10.0 and "bytes_device_to_leaf" in summarize([timing])


@pytest.mark.parametrize("spec", lossy_codecs(), ids=codec_id)
@pytest.mark.parametrize("chunk_rows", [None, 2], ids=["one-chunk", "chunks-of-2"])
def test_a_group_of_rows_crosses_the_uplink_exactly_as_its_devices_one_by_one(spec, chunk_rows, monkeypatch):
    """transmit_rows (a batched group's (D, *shape) deltas) gives the bytes, received values and error-feedback
    residuals of one transmit per device, bit for bit, round after round (devices recur with residuals), whether
    the group crosses in one piece or in chunks of rows."""
    shapes = [(6, 3, 5, 5), (6,), (40, 16), (), (10,)]
    if chunk_rows is not None:
        monkeypatch.setattr(uplink_module, "CHUNK_BYTES", chunk_rows * 4 * sum(math.prod(s) for s in shapes))
    rows, alone = UplinkCompressor(spec), UplinkCompressor(spec)
    gen = torch.Generator().manual_seed(3)
    sent: dict[int, torch.Tensor] = {}  # per device: sum of its true updates minus what the leaf received
    for round_num in range(4):
        ids = [(round_num * 2 + i) % 7 for i in range(5)]
        stacked = [torch.randn(len(ids), *shape, generator=gen) for shape in shapes]
        stacked[2][1, 0, 0] = 50.0  # an outlier that every codec must carry or keep
        group_stats, single_stats = UplinkStats(), UplinkStats()
        received = rows.transmit_rows(ids, round_num, [t.clone() for t in stacked], group_stats)
        for i, device_id in enumerate(ids):
            want = alone.transmit(device_id, round_num, [t[i].clone() for t in stacked], single_stats)
            assert all(torch.equal(got[i], w) for got, w in zip(received, want, strict=True))
            gap = torch.cat([t[i].reshape(-1) for t in stacked]) - torch.cat([t[i].reshape(-1) for t in received])
            sent[device_id] = sent.get(device_id, torch.zeros_like(gap)) + gap
        assert (group_stats.updates, group_stats.bytes_sent, group_stats.raw_bytes) == (
            single_stats.updates,
            single_stats.bytes_sent,
            single_stats.raw_bytes,
        )
        if spec.name == "topk":
            assert rows.residual_counts() == alone.residual_counts()
            for device_id in ids:  # error feedback: what was not received is exactly what the device keeps
                got, want = rows.residuals.take(device_id, round_num), alone.residuals.take(device_id, round_num)
                assert torch.equal(got, want)
                torch.testing.assert_close(got, sent[device_id], rtol=0, atol=1e-5)
                rows.residuals.put(device_id, round_num, got)
                alone.residuals.put(device_id, round_num, want)


@pytest.mark.parametrize("values", ["float32", "int8"])
def test_a_non_finite_update_leaves_no_residual_behind(values):
    """A device whose update (plus residual) is not finite arrives non-finite (the leaf rejects it) and keeps
    no residual: nothing of a rejected update reaches later rounds; the other devices of its group keep theirs."""
    uplink = UplinkCompressor(CodecSpec("topk", topk_fraction=0.1, topk_values=values))
    stacked = [torch.randn(3, 200, generator=torch.Generator().manual_seed(0))]
    stacked[0][1, 7] = float("nan")
    received = uplink.transmit_rows([10, 11, 12], 0, stacked, UplinkStats())[0]
    assert not torch.isfinite(received[1]).all() and torch.isfinite(received[[0, 2]]).all()
    assert uplink.residual_counts()["residuals_held"] == 2
    assert uplink.residuals.take(11, 0) is None and uplink.residuals.take(12, 0) is not None


def test_leaf_momentum_folds_the_mean_of_each_round_into_a_velocity():
    """``v = beta v + sum / weight``, reported as ``v * weight``; a round without weight leaves ``v`` alone; no
    momentum (or another codec) returns the very sum it was given."""
    uplink = UplinkCompressor(CodecSpec("topk", topk_momentum=0.5))
    sums = [[torch.tensor([2.0, -4.0]), torch.tensor([6.0])], [torch.tensor([1.0, 1.0]), torch.tensor([0.0])]]
    first = uplink.fold_aggregate(sums[0], 2.0)
    assert [t.tolist() for t in first] == [[2.0, -4.0], [6.0]]  # v = mean (1, -2, 3)
    idle = [torch.tensor([9.0, 9.0]), torch.tensor([9.0])]
    assert uplink.fold_aggregate(idle, 0.0) is idle
    second = uplink.fold_aggregate(sums[1], 4.0)  # v = 0.5 (1, -2, 3) + (0.25, 0.25, 0) = (0.75, -0.75, 1.5)
    assert [t.tolist() for t in second] == [[3.0, -3.0], [6.0]]
    assert [t.tolist() for t in sums[0]] == [[2.0, -4.0], [6.0]]  # the leaf's sums are not modified
    for spec in (CodecSpec("topk"), CodecSpec("int8", topk_momentum=0.5), CodecSpec("none")):
        assert UplinkCompressor(spec).fold_aggregate(sums[1], 4.0) is sums[1]


def test_leaf_momentum_adds_no_bytes_and_reports_beta_v_plus_the_round_mean():
    """Two rounds of a leaf with ``topk_momentum`` against the same leaf without: the same uplink bytes, the first
    round's sum unchanged (up to the rounding of ``/ w * w``), the second's ``sum_1 + beta * sum_0 * w_1 / w_0``."""
    from devsim.codec import model_to_numpy
    from devsim.models import build_model
    from devsim.training.leaf_runner import LeafRoundRunner

    weights = model_to_numpy(build_model("cnn"))
    results = {}
    for beta in (0.0, 0.6):
        uplink = UplinkCompressor(CodecSpec("topk", topk_fraction=0.05, topk_momentum=beta), residual_capacity=8)
        runner = LeafRoundRunner(small_processors(1), uplink=uplink)
        try:
            results[beta] = [runner.run_round(r, weights, devices) for r, devices in enumerate(([1, 2, 3], [2, 4]))]
        finally:
            runner.close()
    plain, momentum = results[0.0], results[0.6]
    for r in range(2):
        assert momentum[r].counts["uplink_bytes"] == plain[r].counts["uplink_bytes"]
        assert momentum[r].total_weight == plain[r].total_weight
    ratio = plain[1].total_weight / plain[0].total_weight
    for key in weights:
        np.testing.assert_allclose(momentum[0].delta_sum[key], plain[0].delta_sum[key], rtol=1e-6, atol=1e-7)
        expected = plain[1].delta_sum[key] + 0.6 * plain[0].delta_sum[key] * ratio
        np.testing.assert_allclose(momentum[1].delta_sum[key], expected, rtol=1e-5, atol=1e-6)


def test_leaf_momentum_values_are_checked_naming_the_field():
    assert CodecSpec.from_settings({"update_codec": "topk", "topk_momentum": 0.3}).topk_momentum == 0.3
    for bad in (-0.1, 1.0, float("nan")):
        with pytest.raises(ValueError, match=r"topk_momentum must be in \[0, 1\)"):
            CodecSpec("topk", topk_momentum=bad)
    SimulationConfig(update_codec="topk", topk_momentum=0.5).validate()
    cases = [
        (SimulationConfig(update_codec="topk", topk_momentum=1.0), "outside the allowed range [0, 1)"),
        (SimulationConfig(update_codec="int8", topk_momentum=0.5), "needs update_codec topk (got int8); allowed: 0"),
        (AsyncConfig(update_codec="topk", topk_momentum=0.5, max_versions=5), "asynchronous runs; allowed: 0"),
    ]
    for config, message in cases:
        with pytest.raises(ConfigError) as info:
            config.validate()
        assert str(info.value).startswith("--topk-momentum") and message in str(info.value)


def test_uplink_state_round_trip_continues_residuals_and_momentum_exactly():
    """A leaf's uplink state (residuals with their stamps, eviction count, velocity) restored into a fresh
    uplink gives the same received updates and reported sums as the uplink it was taken from."""
    spec = CodecSpec("topk", topk_fraction=0.25, topk_momentum=0.5)
    generator = torch.Generator().manual_seed(0)
    updates = [[torch.randn(4, 3, generator=generator), torch.randn(5, generator=generator)] for _ in range(6)]
    original = UplinkCompressor(spec, residual_capacity=2)
    for device, update in enumerate(updates[:3]):
        original.transmit(device, 1, update, UplinkStats())
    original.sweep(1)
    original.fold_aggregate([torch.ones(4, 3), torch.ones(5)], 2.0)
    restored = UplinkCompressor(spec, residual_capacity=2)
    restored.load_state(original.state())
    assert restored.residual_counts() == original.residual_counts() == {"residuals_held": 2, "residual_evictions": 1}
    for device, update in zip([1, 2, 0], updates[3:], strict=True):
        sent = original.transmit(device, 2, [t.clone() for t in update], UplinkStats())
        again = restored.transmit(device, 2, [t.clone() for t in update], UplinkStats())
        assert all(torch.equal(a, b) for a, b in zip(sent, again, strict=True))
    sums = [torch.full((4, 3), 0.5), torch.full((5,), -1.0)]
    folded = original.fold_aggregate(sums, 3.0)
    assert all(torch.equal(a, b) for a, b in zip(folded, restored.fold_aggregate(sums, 3.0), strict=True))


def test_uplink_state_is_refused_by_an_uplink_with_other_settings():
    state = UplinkCompressor(CodecSpec("topk")).state()
    with pytest.raises(ValueError, match="error feedback"):
        UplinkCompressor(CodecSpec("int8")).load_state(state)
    assert not UplinkCompressor(CodecSpec("int8")).stateful and UplinkCompressor(CodecSpec("topk")).stateful
    empty = ResidualStore(3, 5)
    empty.load_state(ResidualStore(3, 5).state())
    assert len(empty) == 0
