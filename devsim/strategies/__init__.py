"""Aggregation strategies: one class per method behind one interface."""

from devsim.strategies.base import LeafUpdate, SyncStrategy
from devsim.strategies.fedavg import FedAvg

__all__ = ["FedAvg", "LeafUpdate", "SyncStrategy"]
