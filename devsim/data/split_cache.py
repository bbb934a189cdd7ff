"""Dataset splits kept on disk, so that the processes of a run, and later runs, read them instead of each generating
or decoding them again.

Every process of a simulated run loads its dataset: the job command (to check the task), the server (to evaluate)
and each leaf (to train), all on the way to the first round. The default job's synthetic set (20,000 + 2,000
images) took 0.16-0.3 s of CPU to generate, up to three times a process, on a 2-core CPU; CIFAR-10's pickled
batches take 0.7-0.9 s to decode. :func:`synthetic_split` and :func:`cifar_split` do that once, write the split
into this user's cache folder (:func:`devsim.cache_dir.cache_root`, under :data:`FOLDER`), and from then on
memory-map it copy-on-write (``mmap_mode="c"``): about a millisecond, the pages shared by every process on the
host, the arrays writable in a process without reaching the file or another process.

An entry is a folder per split named by everything its images depend on (:func:`synthetic_key`: the generator's
:data:`~devsim.data.synthetic.GENERATOR_VERSION`, NumPy's version, seed, sizes and classes; :func:`cifar_key`: the
folder and the size and modification time of each batch file it reads), holding ``.npy`` files and the split's
metadata. It is written under a temporary name and renamed, so a reader sees a whole entry or none, and processes
that race to write one keep the first. An entry that cannot be read (cut short, removed under a reader, other
shapes) is loaded and written again. At most :data:`KEEP_ENTRIES` entries are kept, the least recently read
removed first. With the cache off (``DEVSIM_CACHE_DIR=off``), or for a split of fewer than
:data:`CACHE_MIN_IMAGES` images (quicker to make than to read), nothing is kept.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import time

import numpy as np

from devsim.cache_dir import cache_root
from devsim.data.cifar import CIFAR_SPECS, cifar_folder, load_cifar
from devsim.data.datasets import ImageDataset
from devsim.data.synthetic import GENERATOR_VERSION, make_synthetic

FOLDER = "splits"
"""The cache's subfolder holding the entries."""

KEEP_ENTRIES = 6
"""Most entries kept (a CIFAR-10 training split is 154 MB, the default synthetic one 62 MB); the least recently
read go first."""

CACHE_MIN_IMAGES = 1000
"""Images in a split below which it is made every time, not kept."""

STALE_WRITE_SECONDS = 3600.0
"""A temporary folder older than this is a dead writer's, removed when entries are pruned."""

_META_FILE = "meta.json"


def synthetic_key(seed: int, num_train: int, num_test: int, num_classes: int, train: bool) -> str:
    """The entry name of one split of :func:`make_synthetic`'s set: every input, its generator's version and
    NumPy's (whose random streams the images come from)."""
    split = "train" if train else "test"
    return f"synthetic-v{GENERATOR_VERSION}-np{np.__version__}-seed{seed}-{num_train}-{num_test}-c{num_classes}-{split}"


def cifar_key(root: str, name: str, train: bool) -> str | None:
    """The entry name of one split of a CIFAR folder, from its path and each batch file's size and modification
    time (a changed file is another entry); None when a file is missing."""
    spec = CIFAR_SPECS[name]
    folder = cifar_folder(root, name)
    files = spec.train_files if train else spec.test_files
    try:
        stats = [os.stat(os.path.join(folder, f)) for f in files]
    except OSError:
        return None
    identity = repr([folder, *((s.st_size, s.st_mtime_ns) for s in stats)])
    digest = hashlib.sha256(identity.encode()).hexdigest()[:16]
    return f"{name}-{'train' if train else 'test'}-{digest}"


def synthetic_split(seed: int, num_train: int, num_test: int, train: bool, num_classes: int = 10) -> ImageDataset:
    """The train (``train``) or test split of :func:`make_synthetic`'s set, read from the cache when it is there,
    else generated, both splits written there for the next reader. Equal, array for array, to the generated split."""
    keys = {split: synthetic_key(seed, num_train, num_test, num_classes, split) for split in (True, False)}
    wanted = num_train if train else num_test
    found = read_cached(keys[train]) if wanted >= CACHE_MIN_IMAGES else None
    if found is not None:
        return found
    made = dict(zip((True, False), make_synthetic(seed, num_train, num_test, num_classes), strict=True))
    for split, dataset in made.items():
        if len(dataset) >= CACHE_MIN_IMAGES:
            write_cached(keys[split], dataset)
    return made[train]


def cifar_split(root: str, name: str, train: bool, download: bool = False) -> ImageDataset:
    """:func:`~devsim.data.cifar.load_cifar`, read from the cache when the same files were decoded before."""
    key = cifar_key(root, name, train)
    found = None if key is None else read_cached(key)
    if found is not None:
        return found
    dataset = load_cifar(root, name, train, download=download)
    key = key or cifar_key(root, name, train)  # downloaded just now
    if key is not None and len(dataset) >= CACHE_MIN_IMAGES:
        write_cached(key, dataset)
    return dataset


def read_cached(key: str) -> ImageDataset | None:
    """The cached split ``key``, its images memory-mapped copy-on-write; None when the cache is off or has no whole
    entry of that name."""
    root = cache_root()
    if root is None:
        return None
    entry = os.path.join(root, FOLDER, key)
    found = read_entry(entry)
    if found is not None:
        with contextlib.suppress(OSError):
            os.utime(entry)  # most recently read: pruned last
    return found


def write_cached(key: str, dataset: ImageDataset, keep: int = KEEP_ENTRIES) -> None:
    """Keep ``dataset`` as entry ``key`` (nothing with the cache off), then prune the cache to ``keep`` entries."""
    root = cache_root()
    if root is None:
        return
    folder = os.path.join(root, FOLDER)
    write_entry(os.path.join(folder, key), dataset)
    prune(folder, keep, spare=key)


def read_entry(entry: str) -> ImageDataset | None:
    """The split in folder ``entry``; None when it is missing or not a whole entry."""
    try:
        with open(os.path.join(entry, _META_FILE), encoding="utf-8") as stream:
            meta = json.load(stream)
        images = np.asarray(np.load(os.path.join(entry, "images.npy"), mmap_mode="c"))  # a plain view of the map
        labels = np.load(os.path.join(entry, "labels.npy"))
        if len(images) != meta["count"] or len(labels) != meta["count"]:
            return None
        return ImageDataset(images, labels, meta["num_classes"], meta["name"], tuple(meta["mean"]), tuple(meta["std"]))
    except (OSError, ValueError, KeyError, TypeError, EOFError):
        return None


def write_entry(entry: str, dataset: ImageDataset) -> None:
    """Write ``dataset`` into a temporary folder beside ``entry``, renamed into place; a write that fails (a full
    disk, a read-only cache) leaves nothing behind, and a whole entry already there (another process's, or the large
    split of a set whose small split is made every time) is kept without writing."""
    if read_entry(entry) is not None:
        return
    partial = f"{entry}.tmp{os.getpid()}"
    try:
        os.makedirs(partial, exist_ok=True)
        np.save(os.path.join(partial, "images.npy"), dataset.images)
        np.save(os.path.join(partial, "labels.npy"), dataset.labels)
        meta = {
            "count": len(dataset),
            "num_classes": dataset.num_classes,
            "name": dataset.name,
            "mean": list(dataset.mean),
            "std": list(dataset.std),
        }
        with open(os.path.join(partial, _META_FILE), "w", encoding="utf-8") as stream:
            json.dump(meta, stream)
        if os.path.isdir(entry) and read_entry(entry) is None:
            shutil.rmtree(entry, ignore_errors=True)  # a broken entry (or none): replaced
        os.rename(partial, entry)
    except OSError:
        pass  # another process's entry is in place, or nothing can be written: the next reader loads it again
    finally:
        shutil.rmtree(partial, ignore_errors=True)


def prune(folder: str, keep: int, spare: str | None = None) -> None:
    """Remove all but the ``keep`` most recently read entries of ``folder`` (never ``spare``, just written), and
    temporary folders older than :data:`STALE_WRITE_SECONDS`."""
    try:
        names = os.listdir(folder)
    except OSError:
        return
    entries, now = [], time.time()
    for name in names:
        path = os.path.join(folder, name)
        with contextlib.suppress(OSError):
            modified = os.stat(path).st_mtime
            if ".tmp" not in name:
                entries.append((name == spare, modified, path))
            elif now - modified > STALE_WRITE_SECONDS:
                shutil.rmtree(path, ignore_errors=True)
    for *_, path in sorted(entries, reverse=True)[keep:]:
        shutil.rmtree(path, ignore_errors=True)
