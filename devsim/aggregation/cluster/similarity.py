"""What cluster aggregation compares: one vector per leaf, built from its model, update or drift.

For a leaf that trained from ``model`` and sent ``update`` (``delta_sum``, ``total_weight``), the
leaf model is ``m = model + delta_sum / total_weight``. The sources:

* ``last_layer_drift``: ``m - w_0`` on the classifier's last layer (``w_0``: the initial model);
* ``last_layer_weights``: ``m`` on the last layer;
* ``last_layer_updates``: ``delta_sum / total_weight`` on the last layer;
* ``model_drift``: ``m - w_0`` on every entry, concatenated as is (layers weigh by their size);
* ``layer_drift``: ``m - w_0`` on every layer, each layer's block scaled to unit L2 norm before the
  blocks are concatenated, so the cosine of two vectors is the mean over layers of the per-layer
  cosines and the small early layers count as much as the large ones;
* ``layer_updates``: the same per-layer normalisation applied to ``delta_sum / total_weight``.

A layer is the set of entries sharing a module prefix (``conv1.weight`` and ``conv1.bias`` form
``conv1``). Vectors are float64 of shape ``(D,)``, ``D`` the number of entries compared.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from devsim.aggregation.base import LeafUpdate, Weights

LAST_LAYER_SOURCES: tuple[str, ...] = ("last_layer_drift", "last_layer_weights", "last_layer_updates")
LAYER_SOURCES: tuple[str, ...] = ("layer_drift", "layer_updates")
SIMILARITY_SOURCES: tuple[str, ...] = ("model_drift", *LAYER_SOURCES, *LAST_LAYER_SOURCES)
"""Values accepted for ``ClusterAggregation(similarity_on=...)``."""

SPLIT_SOURCES: tuple[str, ...] = ("layer_updates",)
"""Sources compared only between leaves that trained from the same model (clusters then only split)."""

DRIFT_SOURCES: tuple[str, ...] = ("model_drift", "last_layer_drift", "layer_drift")
"""Sources that need the initial model as reference."""


def layer_blocks(keys: Sequence[str]) -> list[list[str]]:
    """Model entries grouped by layer (module prefix before the last dot), in first-appearance order."""
    blocks: dict[str, list[str]] = {}
    for key in keys:
        blocks.setdefault(key.rpartition(".")[0] or key, []).append(key)
    return list(blocks.values())


UPDATE_COUNTERPARTS: dict[str, str] = {
    "model_drift": "model_updates",
    "layer_drift": "layer_updates",
    "layer_updates": "layer_updates",
    "last_layer_drift": "last_layer_updates",
    "last_layer_weights": "last_layer_updates",
    "last_layer_updates": "last_layer_updates",
}
"""For each source, the update vector on the same entries (what a cluster's re-split compares): ``model_updates``
is ``delta_sum / total_weight`` on every entry, concatenated as is; the others are sources of their own."""


def update_vector(source: str, model: Weights, update: LeafUpdate, *, last_layer_keys: Sequence[str]) -> np.ndarray:
    """The ``(D,)`` float64 update counterpart of ``source`` (:data:`UPDATE_COUNTERPARTS`) for a leaf.

    Unlike drift, an update says where the leaf's data pulls the model it trained from, so the updates of
    leaves that trained from one shared model (a cluster's members) are comparable with each other.
    """
    if source not in UPDATE_COUNTERPARTS:
        raise ValueError(f"similarity_on must be one of {', '.join(SIMILARITY_SOURCES)}, got {source!r}")
    return _vector(UPDATE_COUNTERPARTS[source], model, update, last_layer_keys, None)


def leaf_vector(
    source: str,
    model: Weights,
    update: LeafUpdate,
    *,
    last_layer_keys: Sequence[str],
    reference: Mapping[str, np.ndarray] | None = None,
) -> np.ndarray:
    """The ``(D,)`` float64 vector that ``source`` (one of :data:`SIMILARITY_SOURCES`) compares for a leaf."""
    if source not in SIMILARITY_SOURCES:
        raise ValueError(f"similarity_on must be one of {', '.join(SIMILARITY_SOURCES)}, got {source!r}")
    if source in DRIFT_SOURCES and reference is None:
        raise ValueError(f"similarity_on={source!r} needs the reference (initial) model")
    return _vector(source, model, update, last_layer_keys, reference)


def entry_sizes(source: str, model: Weights, update: LeafUpdate, *, last_layer_keys: Sequence[str]) -> list[int]:
    """Sizes of the model entries that make up ``source``'s vector (:func:`leaf_vector`, :func:`update_vector`,
    also ``model_updates``), in the order they are concatenated; they sum to the vector's length."""
    if source in LAST_LAYER_SOURCES:
        keys = list(last_layer_keys)
    elif source.startswith("model_"):
        keys = [k for k in model if k in update.delta_sum]
    else:
        keys = [key for block in layer_blocks([k for k in model if k in update.delta_sum]) for key in block]
    return [int(np.asarray(update.delta_sum[key]).size) for key in keys]


def scale_entries(vectors: np.ndarray, sizes: Sequence[int]) -> np.ndarray:
    """``vectors`` ``(L, D)`` with each entry's columns (consecutive blocks of ``sizes``) divided by that entry's
    spread across the rows: the root mean square of the block after subtracting the rows' mean.

    After this every entry that differs between leaves weighs by its number of values, not by the size of its
    values: a bias of 10 values whose drift varies a lot between leaves no longer outweighs a layer of 48,000
    weights whose drift varies less per value. Blocks equal in every row are left as they are (their centred
    cosine contribution is 0 anyway). Centred cosines of the result are unchanged by the mean (it is removed
    first), so this only sets how much each entry counts.
    """
    x = np.array(vectors, dtype=np.float64, copy=True)
    if sum(sizes) != x.shape[1]:
        raise ValueError(f"entry sizes sum to {sum(sizes)}, but the vectors have {x.shape[1]} values")
    start = 0
    for size in sizes:
        block = x[:, start : start + size]
        spread = float(np.sqrt(np.mean((block - block.mean(axis=0, keepdims=True)) ** 2))) if block.size else 0.0
        # A spread at rounding level (rows equal up to float error) is not a difference worth scaling up.
        if spread > 1e-9 * float(np.max(np.abs(block), initial=0.0)):
            x[:, start : start + size] = block / spread
        start += size
    return x


def _vector(
    source: str,
    model: Weights,
    update: LeafUpdate,
    last_layer_keys: Sequence[str],
    reference: Mapping[str, np.ndarray] | None,
) -> np.ndarray:
    """:func:`leaf_vector` without the checks; also takes ``model_updates`` (every entry's update, as is)."""
    if source.startswith("model_"):
        return np.concatenate(
            [_entry(source, k, model, update, reference).ravel() for k in model if k in update.delta_sum]
        )
    if source in LAST_LAYER_SOURCES:
        return np.concatenate([_entry(source, key, model, update, reference).ravel() for key in last_layer_keys])
    parts = []
    for block in layer_blocks([k for k in model if k in update.delta_sum]):
        values = np.concatenate([_entry(source, key, model, update, reference).ravel() for key in block])
        norm = float(np.linalg.norm(values))
        parts.append(values / norm if norm > 0 else values)
    return np.concatenate(parts)


def _entry(
    source: str, key: str, model: Weights, update: LeafUpdate, reference: Mapping[str, np.ndarray] | None
) -> np.ndarray:
    value = np.asarray(update.delta_sum[key], dtype=np.float64) / update.total_weight
    if source.endswith("_updates"):
        return value
    value = np.asarray(model[key], dtype=np.float64) + value
    if source in DRIFT_SOURCES and reference is not None:
        value = value - np.asarray(reference[key], dtype=np.float64)
    return value
