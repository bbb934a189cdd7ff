"""Seed derivation: every random stream in a run is a pure function of the run seed and a path.

Streams are derived with NumPy's ``SeedSequence`` from ``(seed, purpose tag, *ids)`` so that the
same device trains on the same data in the same order no matter which process, thread or worker
runs it, and streams for different purposes never collide.
"""

from __future__ import annotations

import zlib

import numpy as np

_MASK_63 = (1 << 63) - 1


def _tag(purpose: str) -> int:
    return zlib.crc32(purpose.encode("utf-8"))


def derive_seed(seed: int, purpose: str, *ids: int) -> int:
    """A 63-bit integer seed for ``purpose`` (e.g. "select", "train") and integer ids (round, device)."""
    entropy = [int(seed), _tag(purpose), *(int(i) for i in ids)]
    state = np.random.SeedSequence(entropy).generate_state(2, dtype=np.uint64)
    return int((int(state[0]) << 32 ^ int(state[1])) & _MASK_63)


def derive_rng(seed: int, purpose: str, *ids: int) -> np.random.Generator:
    """A NumPy generator for ``purpose`` and ids; see :func:`derive_seed`."""
    return np.random.default_rng(np.random.SeedSequence([int(seed), _tag(purpose), *(int(i) for i in ids)]))
