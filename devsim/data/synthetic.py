"""A learnable synthetic 32x32 RGB image dataset, and a writer for CIFAR-10's on-disk format.

Each class has a smooth, periodic prototype image (a few low spatial frequencies per channel on top
of a class colour). A sample is its class prototype, circularly shifted by up to
:data:`MAX_SHIFT` pixels in each direction, scaled by a per-sample brightness factor, plus
per-pixel noise, rounded and clipped to ``uint8``.

The per-pixel noise is approximately Gaussian: a centred sum of four independent uniform bytes
(Irwin-Hall with n = 4), scaled to standard deviation :data:`NOISE_STD`. It is built from raw
64-bit random words with bit arithmetic, several times cheaper than ``standard_normal``.

The signal is weak against the noise (class colours within +-15 and patterns of standard
deviation 20, versus noise of standard deviation 70, all in 0..255 pixel units), so learning takes
some rounds: hierarchical FedAvg with the small CNN (20 devices x 100 samples per round, Dirichlet
alpha 0.5, SGD lr 0.05 momentum 0.9, batch 10) goes from chance (10%) to about 80% test accuracy
in 10 rounds.

Everything is a deterministic function of the seed: prototypes, train samples and test samples
come from three independent children of ``np.random.SeedSequence(seed)``.
"""

from __future__ import annotations

import os
import pickle

import numpy as np

from devsim.data.cifar import CIFAR_SPECS
from devsim.data.datasets import IMAGE_SHAPE, ImageDataset

MAX_SHIFT: int = 3
"""Largest circular shift of a prototype, in pixels, along each image axis."""

NOISE_STD: float = 70.0
"""Standard deviation of the per-pixel noise, in 0..255 pixel units."""

BRIGHTNESS_JITTER: float = 0.25
"""Per-sample brightness factor is uniform in [1 - BRIGHTNESS_JITTER, 1 + BRIGHTNESS_JITTER]."""

PATTERN_STD: float = 20.0
"""Standard deviation of a prototype's spatial pattern around its class colour, in pixel units."""

COLOUR_SPREAD: float = 15.0
"""Class colours are uniform in [128 - COLOUR_SPREAD, 128 + COLOUR_SPREAD] per channel (pixel units)."""

MAX_FREQUENCY: int = 2
"""Highest spatial frequency (cycles per image) in a prototype pattern."""

GENERATOR_VERSION: int = 1
"""Raised whenever a change here changes the images a seed gives: it names the entries of the on-disk cache
(:mod:`devsim.data.split_cache`), so that no run reads images of an older generator."""

_CHUNK: int = 64
"""Samples generated per vectorised chunk (keeps temporaries cache-sized)."""

_PIXELS: int = int(np.prod(IMAGE_SHAPE))
_LOW_BYTES = np.uint64(0x00FF00FF00FF00FF)
_IRWIN_HALL4_MEAN: float = 4 * 255 / 2
_IRWIN_HALL4_STD: float = float(np.sqrt(4 * (256**2 - 1) / 12))

_NUM_TRAIN_BATCHES: int = 5


def make_synthetic(
    seed: int, num_train: int, num_test: int, num_classes: int = 10
) -> tuple[ImageDataset, ImageDataset]:
    """Generate the synthetic train and test sets.

    Args:
        seed: Non-negative integer seed; the output is a deterministic function of all arguments.
        num_train: Number of training images (>= 1).
        num_test: Number of test images (>= 0).
        num_classes: Number of classes (>= 2).

    Returns:
        ``(train, test)`` datasets named ``"synthetic"``; labels are uniform over classes. Both
        carry the per-channel mean/std of the training images on the [0, 1] scale.
    """
    if num_train < 1 or num_test < 0:
        raise ValueError(f"need num_train >= 1 and num_test >= 0, got {num_train} and {num_test}")
    if num_classes < 2:
        raise ValueError(f"num_classes must be >= 2, got {num_classes}")
    proto_seq, train_seq, test_seq = np.random.SeedSequence(seed).spawn(3)
    shifted = _shifted_prototypes(_prototypes(np.random.default_rng(proto_seq), num_classes))
    train_images, train_labels = _sample(np.random.default_rng(train_seq), shifted, num_train)
    test_images, test_labels = _sample(np.random.default_rng(test_seq), shifted, num_test)
    mean, std = channel_stats(train_images)
    train = ImageDataset(train_images, train_labels, num_classes, "synthetic", mean, std)
    test = ImageDataset(test_images, test_labels, num_classes, "synthetic", mean, std)
    return train, test


def channel_stats(images: np.ndarray) -> tuple[tuple[float, float, float], tuple[float, float, float]]:
    """Per-channel mean and standard deviation of ``uint8`` images on the [0, 1] scale.

    Args:
        images: ``uint8`` array of shape ``(N, 3, H, W)``, N >= 1.

    Returns:
        ``(mean, std)``, each a 3-tuple (R, G, B); sums are accumulated in float64.
    """
    count, channels = images.shape[0], images.shape[1]
    flat = images.reshape(count, channels, -1)
    sums = np.zeros(channels)
    squares = np.zeros(channels)
    for start in range(0, count, _CHUNK):
        chunk = flat[start : start + _CHUNK].astype(np.float32)
        sums += chunk.sum(axis=(0, 2), dtype=np.float64)
        chunk *= chunk
        squares += chunk.sum(axis=(0, 2), dtype=np.float64)
    total = count * flat.shape[2]
    mean = sums / total
    std = np.sqrt(np.maximum(squares / total - mean**2, 0.0))
    m, s = mean / 255.0, std / 255.0
    return (float(m[0]), float(m[1]), float(m[2])), (float(s[0]), float(s[1]), float(s[2]))


def _prototypes(rng: np.random.Generator, num_classes: int) -> np.ndarray:
    """Smooth periodic class prototypes, float64 of shape ``(num_classes, 3, 32, 32)`` in pixel units.

    Each channel is a random combination of spatial frequencies up to :data:`MAX_FREQUENCY`
    (periodic, so circular shifts leave no seams), normalised to :data:`PATTERN_STD`, added to a
    random class colour.
    """
    height, width = IMAGE_SHAPE[1:]
    spectrum = np.zeros((num_classes, 3, height, width // 2 + 1), dtype=np.complex128)
    rows = np.r_[0 : MAX_FREQUENCY + 1, height - MAX_FREQUENCY : height]
    cols = np.arange(MAX_FREQUENCY + 1)
    coeff_shape = (num_classes, 3, rows.size, cols.size)
    coeffs = rng.standard_normal(coeff_shape) + 1j * rng.standard_normal(coeff_shape)
    spectrum[:, :, rows[:, None], cols[None, :]] = coeffs
    spectrum[:, :, 0, 0] = 0.0
    pattern = np.fft.irfft2(spectrum, s=(height, width))
    pattern *= PATTERN_STD / pattern.std(axis=(2, 3), keepdims=True)
    colours = rng.uniform(128.0 - COLOUR_SPREAD, 128.0 + COLOUR_SPREAD, size=(num_classes, 3, 1, 1))
    return colours + pattern


def _shifted_prototypes(prototypes: np.ndarray) -> np.ndarray:
    """All circular shifts of every prototype, ``uint8`` of shape ``(C * S, 3 * 32 * 32)``.

    Row ``c * S + s`` is class ``c`` under shift number ``s``, ``S = (2 * MAX_SHIFT + 1) ** 2``.
    """
    offsets = range(-MAX_SHIFT, MAX_SHIFT + 1)
    clipped = np.clip(np.rint(prototypes), 0, 255).astype(np.uint8)
    shifts = [np.roll(clipped, (dy, dx), axis=(2, 3)) for dy in offsets for dx in offsets]
    stacked = np.stack(shifts, axis=1)
    return np.ascontiguousarray(stacked.reshape(-1, _PIXELS))


def _sample(rng: np.random.Generator, shifted: np.ndarray, count: int) -> tuple[np.ndarray, np.ndarray]:
    """Draw ``count`` samples; returns ``uint8`` images ``(count, 3, 32, 32)`` and int64 labels.

    Per chunk: gather shifted prototypes, scale by brightness, add noise, round half up (by adding
    0.5 before truncation), clip to 0..255.
    """
    num_shifts = (2 * MAX_SHIFT + 1) ** 2
    num_classes = shifted.shape[0] // num_shifts
    labels = rng.integers(0, num_classes, size=count, dtype=np.int64)
    rows = labels * num_shifts + rng.integers(0, num_shifts, size=count)
    brightness = rng.uniform(1.0 - BRIGHTNESS_JITTER, 1.0 + BRIGHTNESS_JITTER, size=count).astype(np.float32)
    scale = np.float32(NOISE_STD / _IRWIN_HALL4_STD)
    offset = np.float32(0.5 - _IRWIN_HALL4_MEAN * scale)
    images = np.empty((count, _PIXELS), dtype=np.uint8)
    for start in range(0, count, _CHUNK):
        stop = min(start + _CHUNK, count)
        chunk = shifted[rows[start:stop]].astype(np.float32)
        chunk *= brightness[start:stop, None]
        noise = np.multiply(_irwin_hall4(rng, chunk.size).reshape(chunk.shape), scale)
        chunk += noise
        chunk += offset
        np.clip(chunk, 0.0, 255.0, out=chunk)
        images[start:stop] = chunk
    return images.reshape((count, *IMAGE_SHAPE)), labels


def _irwin_hall4(rng: np.random.Generator, size: int) -> np.ndarray:
    """``size`` sums of four independent uniform random bytes, ``uint16`` in 0..1020.

    Approximately Gaussian with mean :data:`_IRWIN_HALL4_MEAN` and standard deviation
    :data:`_IRWIN_HALL4_STD`. Bytes are summed in 16-bit lanes of raw 64-bit random words (SWAR):
    adjacent bytes within a word, then the lanes of the first half of the words with those of the
    second half.
    """
    half = (size + 3) // 4
    words = rng.bit_generator.random_raw(2 * half)
    sums = words & _LOW_BYTES
    words >>= np.uint64(8)
    words &= _LOW_BYTES
    sums += words
    sums[:half] += sums[half:]
    return sums[:half].view(np.uint16)[:size]


def write_cifar_format(root: str, train: ImageDataset, test: ImageDataset) -> str:
    """Write a dataset in CIFAR-10's python on-disk format under ``root/cifar-10-batches-py``.

    The train set is split into five consecutive ``data_batch_1..5`` files (sizes differ by at
    most one); the test set goes to ``test_batch``; ``batches.meta`` holds ``b'label_names'``,
    ``b'num_cases_per_batch'`` and ``b'num_vis'``. Each batch is a pickled dict with
    ``b'batch_label'``, ``b'labels'`` (list of int), ``b'data'`` (``uint8`` ``(n, 3072)``, row-major
    R, G, B planes) and ``b'filenames'``; keys and names are ``bytes``, as the official files read
    with ``pickle.load(..., encoding='bytes')``. Files are written with pickle protocol 4 (compact
    for byte arrays) via a temporary file and rename.

    Args:
        root: Directory to create the folder in (created if needed).
        train: Training set with 10 classes, any size (batches are empty when it has < 5 images).
        test: Test set with 10 classes.

    Returns:
        Path of the ``cifar-10-batches-py`` folder.
    """
    if train.num_classes != 10 or test.num_classes != 10:
        raise ValueError(
            f"the CIFAR-10 format holds 10 classes, got {train.num_classes} (train) and {test.num_classes} (test)"
        )
    folder = os.path.join(root, CIFAR_SPECS["cifar10"].folder)
    os.makedirs(folder, exist_ok=True)
    bounds = np.linspace(0, len(train), _NUM_TRAIN_BATCHES + 1).round().astype(int)
    for number in range(_NUM_TRAIN_BATCHES):
        lo, hi = int(bounds[number]), int(bounds[number + 1])
        label = f"training batch {number + 1} of {_NUM_TRAIN_BATCHES}"
        _write_batch(os.path.join(folder, f"data_batch_{number + 1}"), label, train, lo, hi)
    _write_batch(os.path.join(folder, "test_batch"), "testing batch 1 of 1", test, 0, len(test))
    meta = {
        b"label_names": [f"class_{c}".encode() for c in range(train.num_classes)],
        b"num_cases_per_batch": int(bounds[1] - bounds[0]),
        b"num_vis": _PIXELS,
    }
    _pickle_to(os.path.join(folder, "batches.meta"), meta)
    return folder


def _write_batch(path: str, batch_label: str, dataset: ImageDataset, lo: int, hi: int) -> None:
    """Pickle samples ``lo:hi`` of ``dataset`` as one CIFAR-10 batch dict at ``path``."""
    batch = {
        b"batch_label": batch_label.encode(),
        b"labels": [int(v) for v in dataset.labels[lo:hi]],
        b"data": dataset.images[lo:hi].reshape(hi - lo, _PIXELS).copy(),
        b"filenames": [f"synthetic_{i:06d}.png".encode() for i in range(lo, hi)],
    }
    _pickle_to(path, batch)


def _pickle_to(path: str, obj: object) -> None:
    """Write ``obj`` to ``path`` atomically (temporary file, then rename)."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as handle:
        pickle.dump(obj, handle, protocol=4)
    os.replace(tmp, path)
