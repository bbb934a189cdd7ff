"""Tests for devsim.data: CIFAR reading/downloading, the synthetic dataset, and partitioners."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import os
import pickle
import tarfile
import urllib.error

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from devsim.data import (
    CIFAR_SPECS,
    DATASET_NAMES,
    DatasetUnavailableError,
    DirichletPartitioner,
    IIDPartitioner,
    ImageDataset,
    download_cifar,
    load_cifar,
    load_dataset,
    make_partitioner,
    make_synthetic,
    write_cifar_format,
)
from devsim.data import cifar as cifar_module


@pytest.fixture(scope="module")
def small_synthetic() -> tuple[ImageDataset, ImageDataset]:
    return make_synthetic(seed=3, num_train=1003, num_test=211)


# ---------------------------------------------------------------- ImageDataset / load_dataset


def test_image_dataset_validates_dtype_and_shape() -> None:
    images = np.zeros((2, 3, 32, 32), dtype=np.uint8)
    labels = np.zeros(2, dtype=np.int64)
    stats = (0.5, 0.5, 0.5)
    assert len(ImageDataset(images, labels, 10, "x", stats, stats)) == 2
    with pytest.raises(TypeError):
        ImageDataset(images.astype(np.float32), labels, 10, "x", stats, stats)
    with pytest.raises(ValueError):
        ImageDataset(np.zeros((2, 32, 32, 3), dtype=np.uint8), labels, 10, "x", stats, stats)
    with pytest.raises(ValueError):
        ImageDataset(images, np.array([0, 10], dtype=np.int64), 10, "x", stats, stats)
    with pytest.raises(ValueError):
        ImageDataset(images, labels, 10, "x", stats, (0.5, 0.0, 0.5))


def test_load_dataset_rejects_unknown_name_and_missing_root() -> None:
    with pytest.raises(ValueError, match="dataset") as info:
        load_dataset("mnist", None, True)
    assert all(name in str(info.value) for name in DATASET_NAMES)
    with pytest.raises(ValueError, match="--data-root"):
        load_dataset("cifar10", None, True)


def test_load_dataset_synthetic_splits() -> None:
    train = load_dataset("synthetic", None, True, seed=1, synthetic_train_size=50, synthetic_test_size=20)
    test = load_dataset("synthetic", None, False, seed=1, synthetic_train_size=50, synthetic_test_size=20)
    assert (len(train), len(test)) == (50, 20)
    assert train.name == "synthetic" and train.num_classes == 10
    assert train.mean == test.mean and train.std == test.std


# ---------------------------------------------------------------- CIFAR on-disk format


def test_cifar10_format_round_trip(tmp_path, small_synthetic) -> None:
    train, test = small_synthetic
    folder = write_cifar_format(str(tmp_path), train, test)
    assert folder == os.path.join(str(tmp_path), "cifar-10-batches-py")
    assert sorted(os.listdir(folder)) == sorted(
        ["batches.meta", "test_batch"] + [f"data_batch_{i}" for i in range(1, 6)]
    )
    for root in (str(tmp_path), folder):
        loaded_train = load_cifar(root, "cifar10", train=True)
        loaded_test = load_cifar(root, "cifar10", train=False)
        np.testing.assert_array_equal(loaded_train.images, train.images)
        np.testing.assert_array_equal(loaded_train.labels, train.labels)
        np.testing.assert_array_equal(loaded_test.images, test.images)
        np.testing.assert_array_equal(loaded_test.labels, test.labels)
    assert loaded_train.images.flags.c_contiguous and loaded_train.labels.dtype == np.int64
    assert loaded_train.name == "cifar10" and loaded_train.num_classes == 10
    with open(os.path.join(folder, "batches.meta"), "rb") as handle:
        meta = pickle.load(handle, encoding="bytes")
    assert {b"label_names", b"num_cases_per_batch", b"num_vis"} <= set(meta)
    via_dispatch = load_dataset("cifar10", str(tmp_path), False)
    np.testing.assert_array_equal(via_dispatch.images, test.images)


def test_missing_cifar_names_path_and_offline_option(tmp_path) -> None:
    with pytest.raises(DatasetUnavailableError) as info:
        load_cifar(str(tmp_path), "cifar10", train=True)
    message = str(info.value)
    assert "--dataset synthetic" in message and "--download" in message
    assert os.path.join(str(tmp_path), "cifar-10-batches-py") in message
    with pytest.raises(DatasetUnavailableError, match="--dataset synthetic"):
        load_dataset("cifar100", str(tmp_path), False)


def _write_pickle(path: str, obj: object) -> None:
    with open(path, "wb") as handle:
        pickle.dump(obj, handle)


def _fake_cifar100(root: str, rng: np.random.Generator) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    folder = os.path.join(root, "cifar-100-python")
    os.makedirs(folder)
    splits = {}
    for split, count in (("train", 7), ("test", 4)):
        data = rng.integers(0, 256, size=(count, 3072), dtype=np.uint8)
        fine = rng.integers(0, 100, size=count).tolist()
        entry = {b"data": data, b"fine_labels": fine, b"coarse_labels": [f // 5 for f in fine]}
        _write_pickle(os.path.join(folder, split), entry)
        splits[split] = (data, np.array(fine))
    _write_pickle(os.path.join(folder, "meta"), {b"fine_label_names": [b"c"] * 100})
    return splits


def test_cifar100_reads_hand_written_files(tmp_path) -> None:
    splits = _fake_cifar100(str(tmp_path), np.random.default_rng(0))
    for split, train in (("train", True), ("test", False)):
        data, fine = splits[split]
        loaded = load_cifar(str(tmp_path), "cifar100", train=train)
        assert loaded.num_classes == 100 and loaded.name == "cifar100"
        assert loaded.images.shape == (len(fine), 3, 32, 32)
        np.testing.assert_array_equal(loaded.labels, fine)
        assert loaded.images[1, 0, 0, 1] == data[1, 1]
        assert loaded.images[1, 1, 0, 0] == data[1, 1024]
        assert loaded.images[1, 2, 31, 31] == data[1, 3071]


def test_corrupt_batch_file_is_named(tmp_path) -> None:
    _fake_cifar100(str(tmp_path), np.random.default_rng(1))
    bad = os.path.join(str(tmp_path), "cifar-100-python", "test")
    with open(bad, "wb") as handle:
        handle.write(b"not a pickle")
    with pytest.raises(DatasetUnavailableError, match="cifar-100-python"):
        load_cifar(str(tmp_path), "cifar100", train=False)
    _write_pickle(bad, {b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, 1]})
    with pytest.raises(DatasetUnavailableError, match="fine_labels"):
        load_cifar(str(tmp_path), "cifar100", train=False)


# ---------------------------------------------------------------- download (no network)


def test_download_md5_mismatch_extracts_nothing(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(cifar_module, "_fetch", lambda url, timeout: iter([b"wrong ", b"bytes"]))
    with pytest.raises(DatasetUnavailableError, match="checksum") as info:
        download_cifar(str(tmp_path), "cifar10")
    assert "--dataset synthetic" in str(info.value)
    assert os.listdir(str(tmp_path)) == []
    with pytest.raises(DatasetUnavailableError, match="--dataset synthetic"):
        load_cifar(str(tmp_path), "cifar10", train=True, download=True)


def test_download_network_failure(tmp_path, monkeypatch) -> None:
    def fail(url: str, timeout: float):
        raise urllib.error.URLError("no route to host")

    monkeypatch.setattr(cifar_module, "_fetch", fail)
    with pytest.raises(DatasetUnavailableError, match="--dataset synthetic"):
        load_cifar(str(tmp_path), "cifar100", train=True, download=True)


def _tar_gz(entries: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=1) as tar:
        for name, payload in entries.items():
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            tar.addfile(info, io.BytesIO(payload))
    return buffer.getvalue()


def _read_bytes(path: str) -> bytes:
    with open(path, "rb") as handle:
        return handle.read()


def _serve(monkeypatch, archive: bytes) -> None:
    spec = dataclasses.replace(CIFAR_SPECS["cifar10"], md5=hashlib.md5(archive).hexdigest())
    monkeypatch.setitem(CIFAR_SPECS, "cifar10", spec)
    monkeypatch.setattr(cifar_module, "_fetch", lambda url, timeout: iter([archive]))


def test_download_verifies_and_extracts(tmp_path, monkeypatch, small_synthetic) -> None:
    source = write_cifar_format(str(tmp_path / "source"), *small_synthetic)
    files = {f"cifar-10-batches-py/{f}": _read_bytes(os.path.join(source, f)) for f in os.listdir(source)}
    _serve(monkeypatch, _tar_gz(files))
    dest = tmp_path / "dest"
    loaded = load_cifar(str(dest), "cifar10", train=True, download=True)
    np.testing.assert_array_equal(loaded.images, small_synthetic[0].images)
    assert os.listdir(str(dest)) == ["cifar-10-batches-py"]


def test_download_rejects_unsafe_members(tmp_path, monkeypatch) -> None:
    _serve(monkeypatch, _tar_gz({"cifar-10-batches-py/../../evil": b"x"}))
    with pytest.raises(DatasetUnavailableError, match="unsafe"):
        download_cifar(str(tmp_path / "dest"), "cifar10")
    assert not os.path.exists(tmp_path / "evil")


# ---------------------------------------------------------------- synthetic dataset


def test_synthetic_is_deterministic(small_synthetic) -> None:
    train, test = small_synthetic
    again_train, again_test = make_synthetic(seed=3, num_train=1003, num_test=211)
    assert train.images.tobytes() == again_train.images.tobytes()
    assert test.images.tobytes() == again_test.images.tobytes()
    assert np.array_equal(train.labels, again_train.labels) and train.mean == again_train.mean
    other, _ = make_synthetic(seed=4, num_train=1003, num_test=211)
    assert train.images.tobytes() != other.images.tobytes()
    assert train.images.tobytes()[:3072] != test.images.tobytes()[:3072]


def test_synthetic_shapes_and_stats(small_synthetic) -> None:
    train, test = small_synthetic
    assert train.images.shape == (1003, 3, 32, 32) and test.images.shape == (211, 3, 32, 32)
    assert set(np.unique(train.labels)) == set(range(10))
    pixels = train.images.astype(np.float64) / 255.0
    np.testing.assert_allclose(train.mean, pixels.mean(axis=(0, 2, 3)), atol=1e-9)
    np.testing.assert_allclose(train.std, pixels.std(axis=(0, 2, 3)), atol=1e-9)


def test_synthetic_learnable_but_not_trivial() -> None:
    train, test = make_synthetic(seed=0, num_train=2000, num_test=500)
    x_train = train.images.reshape(len(train), -1).astype(np.float32)
    x_test = test.images.reshape(len(test), -1).astype(np.float32)
    centroids = np.stack([x_train[train.labels == c].mean(axis=0) for c in range(10)])
    distances = (x_test**2).sum(1)[:, None] - 2 * x_test @ centroids.T + (centroids**2).sum(1)[None]
    accuracy = float((distances.argmin(axis=1) == test.labels).mean())
    assert 0.3 < accuracy < 0.99


# ---------------------------------------------------------------- partitioners

LABELS = np.random.default_rng(5).integers(0, 10, size=5000)


@pytest.mark.parametrize("kind,alpha", [("iid", None), ("dirichlet", 0.5)])
def test_partition_deterministic_across_instances(kind: str, alpha: float | None) -> None:
    first = make_partitioner(kind, LABELS, 10, 50, seed=11, alpha=alpha)
    second = make_partitioner(kind, LABELS.copy(), 10, 50, seed=11, alpha=alpha)
    third = make_partitioner(kind, LABELS, 10, 50, seed=12, alpha=alpha)
    for device in (0, 1, 999, 10**9):
        np.testing.assert_array_equal(first.device_indices(device), second.device_indices(device))
        np.testing.assert_array_equal(first.device_indices(device), first.device_indices(device))
    assert not np.array_equal(first.device_indices(3), third.device_indices(3))
    assert not np.array_equal(first.device_indices(3), first.device_indices(4))


def test_iid_shards_are_disjoint_and_wrap() -> None:
    part = IIDPartitioner(LABELS, samples_per_device=50, seed=0, num_classes=10)
    shards = [part.device_indices(d) for d in range(len(LABELS) // 50)]
    union = np.concatenate(shards)
    assert np.array_equal(np.sort(union), np.arange(len(LABELS)))
    np.testing.assert_array_equal(part.device_indices(len(LABELS) // 50), shards[0])
    uneven = IIDPartitioner(LABELS, samples_per_device=300, seed=0)
    assert len(np.unique(uneven.device_indices(16))) == 300


def _mean_max_share(alpha: float) -> float:
    part = DirichletPartitioner(LABELS, 10, 100, alpha=alpha, seed=2)
    return float(np.mean([part.device_label_histogram(d).max() / 100 for d in range(200)]))


def test_dirichlet_skew_grows_as_alpha_shrinks() -> None:
    skewed, balanced = _mean_max_share(0.1), _mean_max_share(100.0)
    assert skewed > 0.6 > 0.25 > balanced


@pytest.mark.parametrize("kind,alpha", [("iid", None), ("dirichlet", 0.1), ("dirichlet", 10.0)])
def test_histograms_match_indices(kind: str, alpha: float | None) -> None:
    part = make_partitioner(kind, LABELS, 10, 80, seed=4, alpha=alpha)
    for device in range(20):
        indices = part.device_indices(device)
        histogram = part.device_label_histogram(device)
        assert histogram.shape == (10,) and histogram.sum() == 80
        np.testing.assert_array_equal(histogram, np.bincount(LABELS[indices], minlength=10))
        assert len(np.unique(indices)) == 80


def test_dirichlet_small_pools_and_absent_classes() -> None:
    labels = np.array([0] * 5 + [1] * 200)
    part = DirichletPartitioner(labels, 3, 100, alpha=0.1, seed=0)
    for device in range(30):
        histogram = part.device_label_histogram(device)
        assert histogram[2] == 0 and histogram.sum() == 100
        np.testing.assert_array_equal(histogram, np.bincount(labels[part.device_indices(device)], minlength=3))


def test_partition_argument_errors() -> None:
    for alpha in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="alpha"):
            make_partitioner("dirichlet", LABELS, 10, 10, seed=0, alpha=alpha)
    with pytest.raises(ValueError, match="alpha"):
        make_partitioner("dirichlet", LABELS, 10, 10, seed=0)
    with pytest.raises(ValueError, match="partition") as info:
        make_partitioner("shards", LABELS, 10, 10, seed=0)
    assert "iid" in str(info.value) and "dirichlet" in str(info.value)
    with pytest.raises(ValueError, match="samples_per_device"):
        make_partitioner("iid", LABELS, 10, len(LABELS) + 1, seed=0)
    for kind, alpha in (("iid", None), ("dirichlet", 1.0)):
        part = make_partitioner(kind, LABELS, 10, 10, seed=0, alpha=alpha)
        for device in (-1, 1.5, True, "3"):
            with pytest.raises(ValueError, match="device_id"):
                part.device_indices(device)


@settings(max_examples=60, deadline=None)
@given(
    kind=st.sampled_from(["iid", "dirichlet"]),
    seed=st.integers(0, 2**63),
    device_id=st.integers(0, 2**62),
    samples_per_device=st.integers(1, len(LABELS)),
    alpha=st.floats(0.01, 1000.0),
)
def test_partition_property_valid_indices(
    kind: str, seed: int, device_id: int, samples_per_device: int, alpha: float
) -> None:
    part = make_partitioner(kind, LABELS, 10, samples_per_device, seed=seed, alpha=alpha)
    indices = part.device_indices(device_id)
    assert indices.dtype == np.int64 and indices.shape == (samples_per_device,)
    assert indices.min() >= 0 and indices.max() < len(LABELS)
    histogram = part.device_label_histogram(device_id)
    np.testing.assert_array_equal(histogram, np.bincount(LABELS[indices], minlength=10))


def test_a_device_s_rows_are_drawn_once_and_match_its_partition(monkeypatch) -> None:
    """A leaf asks for the same devices' shards call after call; their rows are drawn once (up to the cache's size)
    and are exactly the partitioner's indices."""
    import torch

    from devsim.data import device_shards
    from devsim.data.partition import DirichletPartitioner

    labels = np.random.default_rng(0).integers(0, 10, 500)
    partitioner = DirichletPartitioner(labels, num_classes=10, samples_per_device=20, alpha=0.5, seed=1)
    drawn = []
    real = partitioner.device_indices
    monkeypatch.setattr(partitioner, "device_indices", lambda d: drawn.append(d) or real(d))
    monkeypatch.setattr(device_shards, "ROWS_CACHE_SIZE", 3)
    source = device_shards.DeviceDataSource(np.zeros((500, 4), np.float32), labels, partitioner, torch.device("cpu"))
    for _ in range(3):
        pool = source.shard_pool([4, 7, 9])
    assert drawn == [4, 7, 9]
    assert all(torch.equal(rows, torch.from_numpy(real(d))) for rows, d in zip(pool.indices, [4, 7, 9], strict=True))
    source.shard_pool([1, 2, 3, 4])  # past the cache's size: the oldest are drawn again when asked for
    source.shard_pool([4])
    assert drawn == [4, 7, 9, 1, 2, 3, 4]
