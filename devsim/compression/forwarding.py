"""Device updates a leaf forwards as they arrived: with a lossy codec, the encoded rows of the device -> leaf
uplink travel on to the server, which decodes them itself.

Asynchronous runs need this: the server takes each device's update on its own (FedBuff's buffer, FedRevive's
staleness), so a leaf that decoded the updates and sent them on as float32 would carry 4 bytes an element on
the leaf -> server hop, e.g. 66x what top-k 1% sent up from the device. The leaf stacks the rows part by part
(:func:`stack_rows`); the server decodes one job's row (:func:`decode_row`) into float32 entries equal, bit
for bit, to what the leaf decoded: :func:`~devsim.compression.codecs.decode_row_arrays` is the leaf's
arithmetic in NumPy. NumPy, not torch: in the README's FedBuff example (top-k 1%, 2 updates a version, 2 busy
cores) a torch decode cost the server thread 0.93 s a version and the NumPy one 0.14 s, against 83 and 28 us
for one 62k update alone; every torch call releases and retakes the GIL, and each retake can wait behind the
process's other threads. A row that does not fit the run's codec and model is refused with the reason
(``ValueError``), as a leaf reply that does not fit the model is.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import torch

from devsim.compression.codecs import CodecSpec, Encoded, decode_row_arrays, wire_parts

PART_PREFIX = "part"


def split_rows(chunks: Sequence[Encoded]) -> list[tuple[torch.Tensor, ...]]:
    """The rows of encoded chunks (each part with a leading row axis), in order: one tuple of parts a device."""
    return [tuple(part[row] for part in chunk.parts) for chunk in chunks for row in range(chunk.parts[0].shape[0])]


def stack_rows(rows: Sequence[Sequence[torch.Tensor]]) -> dict[str, np.ndarray]:
    """The wire form of jobs' encoded rows: ``{"part0": (jobs, ...), "part1": ...}`` as NumPy arrays (part j of
    every row stacked); empty for no rows."""
    if not rows:
        return {}
    return {f"{PART_PREFIX}{j}": np.stack([row[j].detach().cpu().numpy() for row in rows]) for j in range(len(rows[0]))}


def row_of(stacked: Mapping[str, np.ndarray], row: int) -> dict[str, np.ndarray]:
    """Row ``row`` of :func:`stack_rows`'s output, ``{"part0": ..., ...}`` (:func:`decode_row` checks the names)."""
    return {name: part[row] for name, part in stacked.items()}


def decode_row(
    parts: Mapping[str, np.ndarray] | Sequence[np.ndarray],
    keys: Sequence[str],
    model: Mapping[str, np.ndarray],
    spec: CodecSpec,
) -> dict[str, np.ndarray]:
    """One forwarded device update as float32 entries shaped like ``model``'s. ``parts``: the row's parts in
    order, or named ``part0``, ``part1``, ... (:func:`row_of`); ``keys``: the entries in the order the leaf
    flattened them. Raises ``ValueError`` naming what does not fit: the part names, the entry names, the
    number, dtypes or shapes of the parts, or a top-k index beyond the update."""
    if isinstance(parts, Mapping):
        names = [f"{PART_PREFIX}{j}" for j in range(len(parts))]
        if sorted(parts) != sorted(names):
            raise ValueError(f"forwarded parts are named {sorted(map(str, parts))}, expected {names}")
        parts = [parts[name] for name in names]
    keys = [str(key) for key in keys]
    if sorted(keys) != sorted(model):
        raise ValueError(f"forwarded entries {sorted(keys)} are not the model's {sorted(model)}")
    if spec.lossless:
        raise ValueError("the none codec is not forwarded encoded (only lossy codecs are)")
    shapes = [tuple(np.shape(model[key])) for key in keys]
    expected = wire_parts(shapes, spec)
    if len(parts) != len(expected):
        raise ValueError(f"{spec.name} update forwarded in {len(parts)} parts, expected {len(expected)}")
    arrays = []
    for j, (part, (dtype, shape)) in enumerate(zip(parts, expected, strict=True)):
        part = np.asarray(part)
        if part.dtype != dtype or part.shape != shape:
            raise ValueError(f"{spec.name} part {j} is {part.dtype} {part.shape}, expected {dtype} {shape}")
        arrays.append(part)
    sizes = [math.prod(shape) for shape in shapes]
    n = sum(sizes)
    if spec.name == "topk" and arrays[0].size and int(arrays[0].max()) >= n:
        raise ValueError(f"top-k index {int(arrays[0].max())} is beyond the update's {n} elements")
    flat = decode_row_arrays(arrays, spec, sizes)
    ends = np.cumsum(sizes).tolist()
    starts = [0, *ends[:-1]]
    return {
        key: flat[start:end].reshape(shape) for key, shape, start, end in zip(keys, shapes, starts, ends, strict=True)
    }
