"""A lossy uplink's rows forwarded by the leaf (asynchronous runs) and decoded by the server."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from devsim.codec import model_to_numpy, numpy_to_tensors, tensors_to_numpy
from devsim.compression import CodecSpec, UplinkCompressor, UplinkStats, decode_row, row_of
from devsim.compression.codecs import wire_parts
from devsim.models import build_model
from devsim.observe.traffic import array_bytes
from devsim.training.leaf_runner import LeafRoundRunner
from tests.conftest import codec_id, lossy_codecs, small_processors


@pytest.mark.parametrize("spec", lossy_codecs(), ids=codec_id)
@pytest.mark.parametrize("device_batch", [1, 3])
def test_forwarded_rows_decode_to_what_the_leaf_received(spec, device_batch):
    """The server's decode of each forwarded row equals what one device's transmit delivers to the leaf (bit for
    bit when the leaf trains one device at a time); the forwarded arrays weigh what the uplink carried."""
    weights = model_to_numpy(build_model("cnn"))
    runner = LeafRoundRunner(small_processors(1), device_batch=device_batch, uplink=UplinkCompressor(spec))
    try:
        payload = runner.run_jobs(weights, [0, 1, 2], [4, 2, 7], [11, 12, 13], version=3)
    finally:
        runner.close()
    assert "deltas" not in payload
    assert array_bytes(payload["encoded"]) == int(payload["uplink_bytes"].sum())
    assert int(payload["uplink_raw_bytes"].sum()) == 3 * 4 * sum(v.size for v in weights.values())
    reference = small_processors(1)[0]
    global_tensors = numpy_to_tensors(weights, reference.keys, reference.torch_device)
    for row, (device, seed) in enumerate(((4, 11), (2, 12), (7, 13))):
        reference.train_with_seed(device, seed, global_tensors)
        update = reference.delta(global_tensors)
        want = tensors_to_numpy(reference.keys, UplinkCompressor(spec).transmit(device, 3, update, UplinkStats()))
        got = decode_row(row_of(payload["encoded"], row), payload["delta_keys"], weights, spec)
        assert list(got) == list(reference.keys)
        for key in weights:
            assert got[key].dtype == np.float32 and got[key].shape == weights[key].shape
            if device_batch == 1:
                assert np.array_equal(got[key], want[key])
            else:  # batched training equals one device at a time to float rounding, which can move an int8 code
                np.testing.assert_allclose(got[key], want[key], rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("spec", lossy_codecs(), ids=codec_id)
def test_decode_row_is_the_uplinks_own_decode(spec):
    """Bit for bit: the same arrays through the server's decode and the leaf's."""
    model = {
        "conv": np.zeros((4, 3, 3), np.float32),
        "bias": np.zeros(4, np.float32),
        "fc": np.zeros((9, 30), np.float32),
    }
    update = [torch.randn(v.shape, generator=torch.Generator().manual_seed(i)) for i, v in enumerate(model.values())]
    encoded: list = []
    received = UplinkCompressor(spec).transmit(5, 0, [t.clone() for t in update], UplinkStats(), encoded)
    parts = tuple(part[0].numpy() for part in encoded[0].parts)
    got = decode_row(parts, list(model), model, spec)
    for key, want in zip(model, received, strict=True):
        assert np.array_equal(got[key], want.numpy())


def test_decode_row_refuses_what_does_not_fit_naming_it():
    model = {"w": np.zeros((10, 10), np.float32), "b": np.zeros(10, np.float32)}
    spec = CodecSpec("topk", topk_fraction=0.1)
    index = np.arange(11, dtype=np.uint8)
    values = np.ones(11, np.float32)
    assert [(d, s) for d, s in wire_parts([(10, 10), (10,)], spec)] == [(index.dtype, (11,)), (values.dtype, (11,))]
    assert decode_row((index, values), ["w", "b"], model, spec)["w"].sum() == 11.0
    with pytest.raises(ValueError, match=r"forwarded entries \['b', 'x'\] are not the model's"):
        decode_row((index, values), ["x", "b"], model, spec)
    with pytest.raises(ValueError, match="topk update forwarded in 1 parts, expected 2"):
        decode_row((index,), ["w", "b"], model, spec)
    with pytest.raises(ValueError, match="topk part 1 is float64"):
        decode_row((index, values.astype(np.float64)), ["w", "b"], model, spec)
    with pytest.raises(ValueError, match=r"topk part 0 is uint8 \(12,\), expected uint8 \(11,\)"):
        decode_row((np.arange(12, dtype=np.uint8), values), ["w", "b"], model, spec)
    with pytest.raises(ValueError, match="top-k index 200 is beyond the update's 110 elements"):
        decode_row((np.full(11, 200, np.uint8), values), ["w", "b"], model, spec)
    with pytest.raises(ValueError, match="int8 part 1 is float32 \\(1,\\), expected float32 \\(2,\\)"):
        decode_row((np.zeros(110, np.int8), np.ones(1, np.float32)), ["w", "b"], model, CodecSpec("int8"))
    assert decode_row({"part1": values, "part0": index}, ["w", "b"], model, spec)["w"].sum() == 11.0
    with pytest.raises(
        ValueError, match=r"forwarded parts are named \['index', 'part1'\], expected \['part0', 'part1'\]"
    ):
        decode_row({"index": index, "part1": values}, ["w", "b"], model, spec)
    with pytest.raises(ValueError, match="only lossy codecs"):
        decode_row((values,), ["w", "b"], model, CodecSpec("none"))
