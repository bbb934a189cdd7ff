"""Aggregation strategies: one class per method behind one interface."""

from __future__ import annotations

from typing import TYPE_CHECKING

from devsim.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from devsim.aggregation.base import LeafUpdate, SyncStrategy
    from devsim.aggregation.fedavg import FedAvg

__all__ = ["FedAvg", "LeafUpdate", "SyncStrategy"]

_HOMES = {
    "LeafUpdate": "devsim.aggregation.base",
    "SyncStrategy": "devsim.aggregation.base",
    "FedAvg": "devsim.aggregation.fedavg",
}
"""Where each exported name lives: imported on first use, so that importing one module of this package (e.g. its
settings, which the run configuration imports) does not import PyTorch."""


__getattr__ = lazy_exports(__name__, _HOMES)
