"""Reader and downloader for CIFAR-10 / CIFAR-100 in their official "python version" format.

On-disk layout (as extracted from the official archives):

* CIFAR-10: ``cifar-10-batches-py/`` with ``data_batch_1`` .. ``data_batch_5``, ``test_batch`` and
  ``batches.meta``. Each batch is a pickled dict with ``b'data'`` (``uint8`` ``(n, 3072)``: per
  image, the 1024 red, then green, then blue values of a 32x32 image in row-major order) and
  ``b'labels'`` (n ints in 0..9).
* CIFAR-100: ``cifar-100-python/`` with ``train``, ``test`` and ``meta``; label key
  ``b'fine_labels'`` (ints in 0..99).

No torchvision: files are unpickled with ``encoding='bytes'``. Unpickling executes code from the
file, so only point ``root`` at data you trust (the official archive is checked by MD5 on download).
"""

from __future__ import annotations

import hashlib
import os
import pickle
import shutil
import tarfile
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from devsim.data.datasets import (
    CIFAR10_MEAN,
    CIFAR10_STD,
    CIFAR100_MEAN,
    CIFAR100_STD,
    IMAGE_SHAPE,
    DatasetUnavailableError,
    ImageDataset,
)

DOWNLOAD_TIMEOUT_S: float = 60.0
"""Socket timeout for the download, in seconds (per blocking network operation)."""

_READ_CHUNK: int = 1 << 20
_PIXELS: int = int(np.prod(IMAGE_SHAPE))


@dataclass(frozen=True)
class CifarSpec:
    """Static description of one CIFAR variant."""

    name: str
    folder: str
    train_files: tuple[str, ...]
    test_files: tuple[str, ...]
    meta_file: str
    label_key: str
    num_classes: int
    url: str
    md5: str
    mean: tuple[float, float, float]
    std: tuple[float, float, float]

    @property
    def archive_name(self) -> str:
        """File name of the downloaded archive, e.g. ``cifar-10-python.tar.gz``."""
        return self.url.rsplit("/", 1)[-1]


CIFAR_SPECS: dict[str, CifarSpec] = {
    "cifar10": CifarSpec(
        name="cifar10",
        folder="cifar-10-batches-py",
        train_files=tuple(f"data_batch_{i}" for i in range(1, 6)),
        test_files=("test_batch",),
        meta_file="batches.meta",
        label_key="labels",
        num_classes=10,
        url="https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
        md5="c58f30108f718f92721af3b95e74349a",
        mean=CIFAR10_MEAN,
        std=CIFAR10_STD,
    ),
    "cifar100": CifarSpec(
        name="cifar100",
        folder="cifar-100-python",
        train_files=("train",),
        test_files=("test",),
        meta_file="meta",
        label_key="fine_labels",
        num_classes=100,
        url="https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz",
        md5="eb9058c3a382ffc7106e4002c42a8d85",
        mean=CIFAR100_MEAN,
        std=CIFAR100_STD,
    ),
}


def _spec(name: str) -> CifarSpec:
    if name not in CIFAR_SPECS:
        raise ValueError(f"unknown CIFAR dataset {name!r}; allowed values: {', '.join(CIFAR_SPECS)}")
    return CIFAR_SPECS[name]


def cifar_folder(root: str, name: str) -> str:
    """The extracted-data folder for ``name`` given ``root``.

    ``root`` may be the folder itself (its base name is ``cifar-10-batches-py`` or
    ``cifar-100-python``) or the directory containing it.
    """
    spec = _spec(name)
    root = os.path.abspath(os.path.expanduser(root))
    if os.path.basename(os.path.normpath(root)) == spec.folder:
        return root
    return os.path.join(root, spec.folder)


def _required_files(spec: CifarSpec) -> tuple[str, ...]:
    return (*spec.train_files, *spec.test_files, spec.meta_file)


def _is_present(folder: str, spec: CifarSpec) -> bool:
    return all(os.path.isfile(os.path.join(folder, f)) for f in _required_files(spec))


def _how_to_get(spec: CifarSpec, folder: str, downloading: bool = False) -> str:
    fetch = (
        f"To get it, fetch {spec.url} where the network allows and extract it"
        if downloading
        else f"To get it, pass --download (fetches {spec.url})"
    )
    return (
        f"{fetch}, or place the extracted python-version folder '{spec.folder}' at {folder}. "
        "To run offline without files, use --dataset synthetic."
    )


def load_cifar(root: str, name: str, train: bool, download: bool = False) -> ImageDataset:
    """Load one split of CIFAR-10 or CIFAR-100 from the python-version files.

    Args:
        root: The directory containing the extracted folder, or the folder itself.
        name: ``"cifar10"`` or ``"cifar100"``.
        train: True for the 50,000-image training split, False for the 10,000-image test split.
        download: When the files are missing, download and extract the official archive into
            ``root`` first.

    Returns:
        The split as an :class:`ImageDataset` (images ``uint8`` ``(N, 3, 32, 32)``).

    Raises:
        DatasetUnavailableError: Files missing (and ``download`` False or the download failed),
            or a file is unreadable or malformed.
        ValueError: Unknown ``name``.
    """
    spec = _spec(name)
    folder = cifar_folder(root, name)
    if not _is_present(folder, spec):
        if not download:
            missing = [f for f in _required_files(spec) if not os.path.isfile(os.path.join(folder, f))]
            raise DatasetUnavailableError(
                f"{name} data not found: looked in {folder} (missing: {', '.join(missing)}). "
                + _how_to_get(spec, folder)
            )
        download_cifar(root, name)
    files = spec.train_files if train else spec.test_files
    parts = [_read_batch(os.path.join(folder, f), spec) for f in files]
    images = np.concatenate([p[0] for p in parts]) if len(parts) > 1 else parts[0][0]
    labels = np.concatenate([p[1] for p in parts]) if len(parts) > 1 else parts[0][1]
    return ImageDataset(
        images=np.ascontiguousarray(images),
        labels=labels,
        num_classes=spec.num_classes,
        name=name,
        mean=spec.mean,
        std=spec.std,
    )


def _read_batch(path: str, spec: CifarSpec) -> tuple[np.ndarray, np.ndarray]:
    """Read one pickled batch: ``uint8`` images ``(n, 3, 32, 32)`` and int64 labels ``(n,)``."""
    try:
        with open(path, "rb") as handle:
            raw = pickle.load(handle, encoding="bytes")
    except Exception as exc:
        raise DatasetUnavailableError(f"cannot read CIFAR batch file {path}: {exc!r}") from exc
    if not isinstance(raw, dict):
        raise DatasetUnavailableError(f"corrupt CIFAR batch file {path}: expected a dict")
    entry = {k.decode("latin1") if isinstance(k, bytes) else k: v for k, v in raw.items()}
    if "data" not in entry or spec.label_key not in entry:
        raise DatasetUnavailableError(
            f"corrupt CIFAR batch file {path}: keys 'data' and '{spec.label_key}' required, "
            f"found {sorted(map(str, entry))}"
        )
    data = np.asarray(entry["data"])
    labels = np.asarray(entry[spec.label_key])
    if data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != _PIXELS:
        raise DatasetUnavailableError(
            f"corrupt CIFAR batch file {path}: data must be uint8 (n, {_PIXELS}), got {data.dtype} {data.shape}"
        )
    if labels.shape != (data.shape[0],) or (labels.size and not np.issubdtype(labels.dtype, np.integer)):
        raise DatasetUnavailableError(
            f"corrupt CIFAR batch file {path}: {labels.shape[0] if labels.ndim else 0} labels "
            f"for {data.shape[0]} images"
        )
    labels = labels.astype(np.int64)
    if labels.size and (labels.min() < 0 or labels.max() >= spec.num_classes):
        raise DatasetUnavailableError(f"corrupt CIFAR batch file {path}: labels outside [0, {spec.num_classes})")
    return data.reshape(-1, *IMAGE_SHAPE), labels


def download_cifar(root: str, name: str) -> str:
    """Download, verify and extract the official archive for ``name`` into ``root``.

    The archive is streamed to a temporary file next to the destination, its MD5 is checked
    against the published value *before* anything is extracted, members are checked to be plain
    files or directories inside the destination, and the folder is extracted into a temporary
    directory then renamed into place (so concurrent downloaders never see a partial folder).

    Args:
        root: The directory to hold the extracted folder, or the folder path itself.
        name: ``"cifar10"`` or ``"cifar100"``.

    Returns:
        Path of the extracted folder.

    Raises:
        DatasetUnavailableError: Network failure, checksum mismatch, unsafe or incomplete archive.
    """
    spec = _spec(name)
    folder = cifar_folder(root, name)
    if _is_present(folder, spec):
        return folder
    try:
        os.makedirs(os.path.dirname(folder), exist_ok=True)
        work = tempfile.mkdtemp(prefix=f".{spec.name}-download-", dir=os.path.dirname(folder))
    except OSError as exc:
        raise DatasetUnavailableError(f"cannot write to {folder}: {exc}. " + _fetch_hint(spec, folder)) from exc
    try:
        _download_and_extract(spec, work, folder)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return folder


def _download_and_extract(spec: CifarSpec, work: str, folder: str) -> None:
    """Download into the scratch directory ``work``, verify, extract, and move to ``folder``."""
    archive = os.path.join(work, spec.archive_name)
    digest = _download_to(spec, archive, folder)
    if digest != spec.md5:
        raise DatasetUnavailableError(
            f"checksum mismatch for {spec.url}: MD5 {digest}, expected {spec.md5}; nothing was extracted. "
            + _fetch_hint(spec, folder)
        )
    extracted = os.path.join(work, "extract")
    _safe_extract(archive, extracted, spec, folder)
    if not _is_present(os.path.join(extracted, spec.folder), spec):
        raise DatasetUnavailableError(
            f"archive {spec.url} lacks {spec.folder}/ with {', '.join(_required_files(spec))}. "
            + _fetch_hint(spec, folder)
        )
    try:
        _move_into_place(os.path.join(extracted, spec.folder), folder)
    except OSError as exc:
        raise DatasetUnavailableError(f"cannot move extracted data to {folder}: {exc}") from exc


def _download_to(spec: CifarSpec, path: str, folder: str) -> str:
    """Stream ``spec.url`` to ``path``; returns the hex MD5 of the bytes written.

    ``folder`` (the data folder being filled) only appears in the error message.
    """
    md5 = hashlib.md5()
    try:
        with open(path, "wb") as out:
            for chunk in _fetch(spec.url, DOWNLOAD_TIMEOUT_S):
                md5.update(chunk)
                out.write(chunk)
    except (urllib.error.URLError, OSError) as exc:
        raise DatasetUnavailableError(f"download of {spec.url} failed: {exc}. " + _fetch_hint(spec, folder)) from exc
    return md5.hexdigest()


def _fetch(url: str, timeout: float) -> Iterator[bytes]:
    """Yield the body of ``url`` in chunks (the only network access in devsim; tests replace it)."""
    with urllib.request.urlopen(url, timeout=timeout) as response:
        while chunk := response.read(_READ_CHUNK):
            yield chunk


def _safe_extract(archive: str, dest: str, spec: CifarSpec, folder: str) -> None:
    """Extract ``archive`` into ``dest`` after rejecting unsafe members.

    Only regular files and directories are accepted; names must be relative, free of ``..``
    components, and lie under ``spec.folder``. ``folder`` only appears in error messages.
    """
    try:
        with tarfile.open(archive, "r:gz") as tar:
            members = tar.getmembers()
            _check_members(members, spec)
            os.makedirs(dest, exist_ok=True)
            if hasattr(tarfile, "data_filter"):
                tar.extractall(dest, members=members, filter="data")
            else:
                tar.extractall(dest, members=members)
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise DatasetUnavailableError(f"cannot extract {spec.url}: {exc!r}. " + _fetch_hint(spec, folder)) from exc


def _check_members(members: Iterable[tarfile.TarInfo], spec: CifarSpec) -> None:
    """Raise DatasetUnavailableError on any member that could write outside the destination."""
    for member in members:
        name = member.name
        parts = [p for p in name.replace("\\", "/").split("/") if p not in ("", ".")]
        unsafe = (
            name.startswith(("/", "\\"))
            or os.path.isabs(name)
            or os.path.splitdrive(name)[0] != ""
            or ".." in parts
            or not parts
            or parts[0] != spec.folder
            or not (member.isfile() or member.isdir())
        )
        if unsafe:
            raise DatasetUnavailableError(f"refusing to extract unsafe archive member {name!r} from {spec.url}")


def _move_into_place(source: str, folder: str) -> None:
    """Move the extracted ``source`` folder to ``folder``.

    The whole folder is renamed when ``folder`` does not exist; otherwise (a partial folder, or
    another process finishing first) each file ``folder`` lacks is renamed in, one at a time.
    """
    if not os.path.isdir(folder):
        try:
            os.replace(source, folder)
            return
        except OSError:
            if not os.path.isdir(folder):
                raise
    for entry in os.listdir(source):
        target = os.path.join(folder, entry)
        if not os.path.exists(target):
            os.replace(os.path.join(source, entry), target)


def _fetch_hint(spec: CifarSpec, folder: str) -> str:
    """What to do when a requested download could not complete."""
    return _how_to_get(spec, folder, downloading=True)
