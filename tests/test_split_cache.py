"""Tests for devsim.data.split_cache: synthetic and CIFAR splits read from this user's cache instead of made again."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import numpy as np
import pytest

from devsim.data import split_cache
from devsim.data.loading import load_dataset
from devsim.data.split_cache import CACHE_MIN_IMAGES, FOLDER, prune, synthetic_key, synthetic_split
from devsim.data.synthetic import make_synthetic, write_cifar_format

TRAIN, TEST = 1500, 1000  # the test split is the smallest that is cached


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DEVSIM_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache" / FOLDER


def refuse(monkeypatch, name: str) -> None:
    def refused(*_args, **_kwargs):
        raise AssertionError(f"{name} called although the cache holds the split")

    monkeypatch.setattr(split_cache, name, refused)


def assert_same(read, made) -> None:
    np.testing.assert_array_equal(read.images, made.images)
    np.testing.assert_array_equal(read.labels, made.labels)
    assert (read.mean, read.std, read.num_classes, read.name) == (made.mean, made.std, made.num_classes, made.name)


def test_synthetic_splits_read_back_equal_to_the_generated_ones_without_generating(cache, monkeypatch) -> None:
    train, test = make_synthetic(5, TRAIN, TEST)
    assert_same(synthetic_split(5, TRAIN, TEST, train=True), train)  # generates, writes both splits
    assert sorted(p.name for p in cache.iterdir()) == sorted(synthetic_key(5, TRAIN, TEST, 10, s) for s in (1, 0))
    refuse(monkeypatch, "make_synthetic")
    assert_same(synthetic_split(5, TRAIN, TEST, train=False), test)
    loaded = load_dataset("synthetic", None, True, seed=5, synthetic_train_size=TRAIN, synthetic_test_size=TEST)
    assert_same(loaded, train)
    with pytest.raises(AssertionError, match="make_synthetic"):  # another seed is another entry
        synthetic_split(6, TRAIN, TEST, train=True)


def test_cifar_splits_are_decoded_once_and_again_when_a_file_changes(cache, tmp_path, monkeypatch) -> None:
    train, test = make_synthetic(7, TRAIN, TEST)
    root = write_cifar_format(str(tmp_path / "data"), train, test)
    first = load_dataset("cifar10", root, False)
    assert_same(first, load_dataset("cifar10", root, False))
    real_load = split_cache.load_cifar
    refuse(monkeypatch, "load_cifar")
    assert_same(load_dataset("cifar10", root, False), first)
    assert first.name == "cifar10" and len(first) == TEST
    with open(os.path.join(root, "test_batch"), "ab") as stream:  # another file: decoded again
        stream.write(b"\0")
    with pytest.raises(AssertionError, match="load_cifar"):
        load_dataset("cifar10", root, False)
    monkeypatch.setattr(split_cache, "load_cifar", real_load)


def test_a_process_writing_into_its_read_arrays_changes_neither_the_file_nor_the_next_reader(cache) -> None:
    synthetic_split(1, TRAIN, TEST, train=True)
    first = synthetic_split(1, TRAIN, TEST, train=True)
    kept = int(first.images[0, 0, 0, 0])
    first.images[0, 0, 0, 0] = kept ^ 0xFF  # copy-on-write: only this process's page changes
    assert int(synthetic_split(1, TRAIN, TEST, train=True).images[0, 0, 0, 0]) == kept


def test_nothing_is_kept_with_the_cache_off_or_for_a_small_split(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("DEVSIM_CACHE_DIR", "off")
    assert_same(synthetic_split(2, TRAIN, TEST, train=True), make_synthetic(2, TRAIN, TEST)[0])
    monkeypatch.setenv("DEVSIM_CACHE_DIR", str(tmp_path))
    synthetic_split(2, TRAIN, CACHE_MIN_IMAGES - 1, train=False)
    assert [p.name for p in (tmp_path / FOLDER).iterdir()] == [synthetic_key(2, TRAIN, CACHE_MIN_IMAGES - 1, 10, True)]


def test_the_large_split_is_not_written_again_when_the_small_one_is_made(cache, monkeypatch) -> None:
    small = CACHE_MIN_IMAGES - 1
    synthetic_split(8, TRAIN, small, train=False)  # generated: the train split is written
    assert (cache / synthetic_key(8, TRAIN, small, 10, True) / "images.npy").is_file()
    monkeypatch.setattr(np, "save", lambda *_a, **_k: pytest.fail("wrote a whole entry again"))
    synthetic_split(8, TRAIN, small, train=False)  # generated again (too small to keep); the train entry stays


def test_a_broken_entry_is_made_and_written_again(cache) -> None:
    synthetic_split(3, TRAIN, TEST, train=True)
    images = cache / synthetic_key(3, TRAIN, TEST, 10, True) / "images.npy"
    images.write_bytes(images.read_bytes()[:1000])  # cut short, as by a full disk
    assert_same(synthetic_split(3, TRAIN, TEST, train=True), make_synthetic(3, TRAIN, TEST)[0])
    assert images.stat().st_size > 1000  # replaced by a whole entry
    assert not [p for p in cache.iterdir() if ".tmp" in p.name]


def test_a_cache_that_cannot_be_written_still_gives_the_split(tmp_path, monkeypatch) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    monkeypatch.setenv("DEVSIM_CACHE_DIR", str(blocked))
    assert_same(synthetic_split(4, TRAIN, TEST, train=False), make_synthetic(4, TRAIN, TEST)[1])


def test_prune_keeps_the_most_recently_read_entries_and_removes_dead_writes(tmp_path) -> None:
    for age, name in enumerate(["e0", "e1", "e2", "e3", "x.tmp1", "y.tmp2"]):
        (tmp_path / name).mkdir()
        os.utime(tmp_path / name, (1e9 - age, 1e9 - age))  # e0 most recent
    os.utime(tmp_path / "y.tmp2")  # a write in progress
    prune(str(tmp_path), keep=2, spare="e3")  # e3: just written, whatever its time
    assert sorted(p.name for p in tmp_path.iterdir()) == ["e0", "e3", "y.tmp2"]


RACE = """
import hashlib, sys
sys.path.insert(0, {repo!r})
from devsim.data.split_cache import synthetic_split
split = synthetic_split(9, {train}, {test}, train=True)
print(hashlib.sha256(split.images.tobytes() + split.labels.tobytes()).hexdigest())
"""


def test_processes_racing_on_an_empty_cache_all_get_the_split_and_leave_one_whole_entry(cache, tmp_path):
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    script = RACE.format(repo=repo, train=TRAIN, test=TEST)
    env = dict(os.environ, DEVSIM_CACHE_DIR=str(tmp_path / "cache"))
    racers = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, env=env) for _ in range(4)]
    digests = {proc.communicate(timeout=120)[0].strip() for proc in racers}
    assert all(proc.returncode == 0 for proc in racers)
    made = make_synthetic(9, TRAIN, TEST)[0]
    assert digests == {hashlib.sha256(made.images.tobytes() + made.labels.tobytes()).hexdigest().encode()}
    assert sorted(p.name for p in cache.iterdir()) == sorted(synthetic_key(9, TRAIN, TEST, 10, s) for s in (1, 0))


PINNED_IMAGES = {
    "numpy": "2.4.6",
    "generator": 1,
    "sha256": "9ca50048b574d7a44143e4c9e6367ab480bf5f9595a8b49f842ff4091d2bf7d2",
}
"""The digest of ``make_synthetic(0, 64, 16)``'s arrays under one NumPy version and generator version."""


def test_a_change_to_the_generated_images_comes_with_a_new_generator_version():
    """Cached splits are named by GENERATOR_VERSION: images that change under the same version would let a run read
    an older generator's images. When this fails after a change to devsim/data/synthetic.py, raise
    GENERATOR_VERSION and pin the new digest here."""
    from devsim.data.synthetic import GENERATOR_VERSION

    if np.__version__ != PINNED_IMAGES["numpy"]:
        pytest.skip(f"digest taken with NumPy {PINNED_IMAGES['numpy']}; entries are named by NumPy's version too")
    train, test = make_synthetic(0, 64, 16)
    arrays = (train.images, train.labels, test.images, test.labels)
    digest = hashlib.sha256(b"".join(a.tobytes() for a in arrays)).hexdigest()
    assert (GENERATOR_VERSION, digest) == (PINNED_IMAGES["generator"], PINNED_IMAGES["sha256"])
