"""Real digits (scikit-learn's load_digits): the loader, the flags that cannot apply, and that devices learn."""

from __future__ import annotations

import contextlib
import io

import numpy as np
import pytest
import torch

from devsim.config import ClusterConfig, ConfigError, SimulationConfig
from devsim.data import DatasetUnavailableError, load_dataset, make_partitioner
from devsim.data import digits as digits_module
from devsim.data.digits import DIGITS_TEST_SIZE, DIGITS_TRAIN_SIZE, INSTALL_HINT, load_digits_split
from devsim.data.groups import grouped_dataset


@pytest.fixture(scope="module")
def splits():
    return load_dataset("digits", None, train=True), load_dataset("digits", None, train=False)


def test_shapes_labels_and_pixel_format(splits) -> None:
    train, test = splits
    assert (len(train), len(test)) == (DIGITS_TRAIN_SIZE, DIGITS_TEST_SIZE)
    assert len(train) + len(test) == 1797
    for split in splits:
        assert split.images.shape[1:] == (3, 32, 32) and split.images.dtype == np.uint8
        assert split.labels.dtype == np.int64 and set(np.unique(split.labels)) == set(range(10))
        assert split.num_classes == 10 and split.name == "digits"
        # grey: three equal channels; nearest-neighbour upscaling: 4x4 blocks of one value
        assert np.array_equal(split.images[:, 0], split.images[:, 2])
        small = split.images[:, 0, ::4, ::4]
        assert np.array_equal(split.images[:, 0], small.repeat(4, axis=1).repeat(4, axis=2))
        assert split.images.max() == 255 and split.images.min() == 0


def test_split_is_stratified_and_disjoint(splits) -> None:
    train, test = splits
    train_counts, test_counts = np.bincount(train.labels), np.bincount(test.labels)
    share = test_counts / (train_counts + test_counts)
    assert np.all(np.abs(share - 0.2) < 0.02), share
    train_rows = {row.tobytes() for row in train.images[:, 0, ::4, ::4]}
    overlap = sum(row.tobytes() in train_rows for row in test.images[:, 0, ::4, ::4])
    assert overlap <= 3  # the raw data hold a few exact duplicate images; the split itself is disjoint


def test_loader_is_deterministic_and_returns_fresh_arrays(splits) -> None:
    again = load_digits_split(train=True)
    assert np.array_equal(again.images, splits[0].images) and np.array_equal(again.labels, splits[0].labels)
    again.images[0] = 0
    assert not np.array_equal(load_digits_split(train=True).images[0], again.images[0])


def test_normalisation_uses_train_statistics(splits) -> None:
    train, test = splits
    assert train.mean == test.mean and train.std == test.std
    scaled = (train.images[:, 0].astype(np.float64) / 255.0 - train.mean[0]) / train.std[0]
    assert abs(scaled.mean()) < 1e-6 and abs(scaled.std() - 1.0) < 1e-6


def test_load_dataset_refuses_a_data_root() -> None:
    with pytest.raises(ValueError, match="--data-root"):
        load_dataset("digits", "/tmp/somewhere", train=True)


def test_missing_scikit_learn_gives_the_install_line(monkeypatch) -> None:
    monkeypatch.setattr(digits_module, "sklearn_available", lambda: False)
    monkeypatch.delenv(digits_module.FILE_ENV, raising=False)
    digits_module._splits.cache_clear()
    try:
        with pytest.raises(DatasetUnavailableError, match="pip install scikit-learn"):
            load_digits_split(train=True)
        with pytest.raises(ConfigError, match="pip install scikit-learn") as info:
            SimulationConfig(dataset="digits").validate()
        assert str(info.value) == f"--dataset: {INSTALL_HINT}"
    finally:
        digits_module._splits.cache_clear()


def test_exported_file_gives_the_same_splits_without_scikit_learn(monkeypatch, tmp_path) -> None:
    path = tmp_path / "digits.npz"
    digits_module.export_digits(str(path))
    assert path.stat().st_size < 100_000
    digits_module._splits.cache_clear()
    expected = [load_digits_split(train=flag) for flag in (True, False)]
    monkeypatch.setattr(digits_module, "sklearn_available", lambda: False)
    monkeypatch.setenv(digits_module.FILE_ENV, str(path))
    digits_module._splits.cache_clear()
    try:
        assert digits_module.digits_available()
        SimulationConfig(dataset="digits").validate()
        for want, got in zip(expected, [load_digits_split(train=flag) for flag in (True, False)], strict=True):
            assert np.array_equal(want.images, got.images) and np.array_equal(want.labels, got.labels)
            assert (want.mean, want.std) == (got.mean, got.std)
        monkeypatch.setenv(digits_module.HOLDOUT_ENV, "0.2")
        digits_module._splits.cache_clear()
        with pytest.raises(DatasetUnavailableError, match="DEVSIM_DIGITS_HOLDOUT needs scikit-learn"):
            load_digits_split(train=True)
        monkeypatch.delenv(digits_module.HOLDOUT_ENV)
        np.savez(tmp_path / "wrong.npz", grey=np.zeros((3, 8, 8), np.uint8))
        for bad in (tmp_path / "wrong.npz", tmp_path / "absent.npz"):
            monkeypatch.setenv(digits_module.FILE_ENV, str(bad))
            digits_module._splits.cache_clear()
            with pytest.raises(DatasetUnavailableError, match="DEVSIM_DIGITS_FILE="):
                load_digits_split(train=True)
    finally:
        digits_module._splits.cache_clear()


@pytest.mark.parametrize(
    "changes, flag, text",
    [
        ({"data_root": "/tmp/x"}, "--data-root", "drop --data-root"),
        ({"download": True}, "--download", "drop --data-root and --download"),
        ({"samples_per_device": DIGITS_TRAIN_SIZE + 1}, "--samples-per-device", f"1..{DIGITS_TRAIN_SIZE}"),
        (
            {"num_leaf_nodes": 9, "hidden_groups": 9, "group_kind": "input_transform"},
            "--hidden-groups",
            "allowed: 1..8",
        ),
    ],
)
def test_config_errors_name_the_flag(changes, flag, text) -> None:
    values = SimulationConfig().to_dict() | {"dataset": "digits"} | changes
    with pytest.raises(ConfigError) as info:
        SimulationConfig.from_dict(values)
    assert str(info.value).startswith(flag) and text in str(info.value)


def test_digits_configs_validate() -> None:
    SimulationConfig(dataset="digits", samples_per_device=DIGITS_TRAIN_SIZE).validate()
    ClusterConfig(dataset="digits", num_leaf_nodes=8, hidden_groups=8, group_kind="input_transform").validate()
    ClusterConfig(dataset="digits", num_leaf_nodes=12, hidden_groups=12, group_kind="label_permutation").validate()


def test_job_command_line_with_data_root_is_one_clear_line() -> None:
    from devsim_flare.cli import build_parser, config_from_args

    parser = build_parser("test", SimulationConfig())
    stderr = io.StringIO()
    with pytest.raises(SystemExit) as info, contextlib.redirect_stderr(stderr):
        config_from_args(parser, parser.parse_args(["--dataset", "digits", "--data-root", "X"]))
    assert info.value.code == 2
    last = stderr.getvalue().strip().splitlines()[-1]
    assert "--data-root" in last and "--dataset digits" in last
    config = config_from_args(parser, parser.parse_args(["--dataset", "digits"]))
    assert config.dataset == "digits"


def test_edge_command_line_refuses_a_data_root() -> None:
    from devsim_flare.edge.cli import build_parser, check_task_args

    parser = build_parser()
    stderr = io.StringIO()
    with pytest.raises(SystemExit), contextlib.redirect_stderr(stderr):
        check_task_args(parser, parser.parse_args(["--dataset", "digits", "--data-root", "X"]))
    assert "--data-root" in stderr.getvalue().strip().splitlines()[-1]
    args = parser.parse_args(["--dataset", "digits"])
    check_task_args(parser, args)
    assert args.partition == "dirichlet"


def test_population_larger_than_the_train_set_reuses_images(splits) -> None:
    """100 devices x 100 samples > 1,437 images: IID shards wrap around, Dirichlet shards overlap."""
    labels = splits[0].labels
    iid = make_partitioner("iid", labels, 10, 100, seed=0)
    shards = [iid.device_indices(d) for d in range(100)]
    assert all(len(np.unique(s)) == 100 for s in shards)
    assert len(np.unique(np.concatenate(shards))) == DIGITS_TRAIN_SIZE
    dirichlet = make_partitioner("dirichlet", labels, 10, 100, seed=0, alpha=0.1)
    hist = np.stack([dirichlet.device_label_histogram(d) for d in range(50)])
    assert hist.sum(axis=1).tolist() == [100] * 50
    assert (hist.max(axis=1) >= 50).mean() > 0.5  # alpha 0.1: most devices dominated by one class


def test_hidden_input_transform_groups_differ(splits) -> None:
    test = splits[1]
    seen = {grouped_dataset(test, g, "input_transform").images.tobytes() for g in range(8)}
    assert len(seen) == 8


def test_a_few_devices_learn_the_digits() -> None:
    """Four FedAvg rounds of 4 IID devices (core + processor, no NVFlare) beat 85 % test accuracy (measured: 94 %)."""
    from devsim.aggregation import FedAvg, LeafUpdate
    from devsim.codec import load_numpy_into_model, model_to_numpy
    from devsim.models import build_model
    from devsim.tasks import task_from_settings
    from devsim.training.evaluation import Evaluator
    from devsim.training.leaf_runner import LeafRoundRunner
    from processors.task_processor import TaskDeviceProcessor

    settings = dict(
        dataset="digits", samples_per_device=150, partition="iid", local_epochs=3, batch_size=10, lr=0.02, seed=1
    )
    torch.manual_seed(1)
    model = build_model("cnn", num_classes=10)
    weights = model_to_numpy(model)
    evaluator = Evaluator.for_task(task_from_settings(settings), torch.device("cpu"))
    initial = evaluator.evaluate(model).accuracy
    runner = LeafRoundRunner([TaskDeviceProcessor.from_settings(settings)])
    try:
        for round_index in range(4):
            result = runner.run_round(round_index, weights, [0, 1, 2, 3])
            update = LeafUpdate("site-1", result.delta_sum, result.total_weight, 4)
            weights = FedAvg(1.0).aggregate(weights, [update])
    finally:
        runner.close()
    load_numpy_into_model(model, weights)
    accuracy = evaluator.evaluate(model).accuracy
    assert initial < 0.2 and accuracy > 0.85, (initial, accuracy)


def test_validation_holdout_is_carved_from_the_training_split(monkeypatch, splits) -> None:
    """DEVSIM_DIGITS_HOLDOUT=0.2: train = training split less a stratified, seeded holdout; eval = holdout."""
    from devsim.data.digits import HOLDOUT_ENV, holdout_fraction

    train, test = splits
    monkeypatch.setenv(HOLDOUT_ENV, "0.2")
    rest, held = load_digits_split(train=True), load_dataset("digits", None, train=False)
    assert len(rest) + len(held) == DIGITS_TRAIN_SIZE and abs(len(held) - 0.2 * DIGITS_TRAIN_SIZE) <= 1
    counts = np.bincount(held.labels, minlength=10) / np.bincount(train.labels)
    assert np.all(np.abs(counts - 0.2) < 0.03), counts  # stratified by class
    rows = {row.tobytes(): i for i, row in enumerate(train.images[:, 0])}
    rest_rows = [rows[row.tobytes()] for row in rest.images[:, 0]]
    held_rows = [rows[row.tobytes()] for row in held.images[:, 0]]
    assert len(set(rest_rows) | set(held_rows)) >= DIGITS_TRAIN_SIZE - 5  # a few raw duplicates collide
    test_rows = {row.tobytes() for row in test.images[:, 0]}
    assert sum(row.tobytes() in test_rows for row in held.images[:, 0]) <= 3  # the test split is not used
    assert rest.mean == held.mean != train.mean  # normalised with the reduced training split
    again = load_digits_split(train=False)
    assert np.array_equal(again.labels, held.labels) and np.array_equal(again.images, held.images)  # seeded
    monkeypatch.setenv(HOLDOUT_ENV, "0")
    assert len(load_digits_split(train=False)) == DIGITS_TEST_SIZE
    assert holdout_fraction({}) == 0.0 and holdout_fraction({HOLDOUT_ENV: " 0.25 "}) == 0.25
    for bad in ("1", "-0.1", "abc", "nan"):
        with pytest.raises(ValueError, match=HOLDOUT_ENV):
            holdout_fraction({HOLDOUT_ENV: bad})
