"""Bounded FIFO pool of synthetic inputs and their labels (a preallocated ring buffer)."""

from __future__ import annotations

import torch

__all__ = ["SyntheticPool"]

_DTYPES = {"float16": torch.float16, "float32": torch.float32, "uint8": torch.uint8}


class SyntheticPool:
    """Up to ``capacity`` items of ``item_shape`` (images ``(C, H, W)``, or any input shape) with integer labels;
    the oldest are overwritten.

    Items are generator outputs, on the [0, 1] scale and clamped to it (``clamp``, the built-in generators) or
    stored as they are (``clamp=False``: a task generator's model inputs, which need ``dtype`` "float32").
    They live on ``device`` in one tensor ``(capacity, *item_shape)`` of ``dtype`` ("float16", "float32" or
    "uint8", the latter quantised to 1/255), allocated at the first :meth:`add`; labels are an int64 CPU
    tensor ``(capacity,)``. Memory is therefore fixed: ``capacity * prod(item_shape)`` elements plus 8 bytes a
    label. ``item_shape`` None takes the shape of the first items added. Sampling randomness comes from a
    caller-supplied CPU ``torch.Generator``.
    """

    def __init__(
        self,
        capacity: int = 16_000,
        item_shape: tuple[int, ...] | None = (3, 32, 32),
        dtype: str = "float16",
        device: torch.device | str = "cpu",
        clamp: bool = True,
    ) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        if dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {tuple(_DTYPES)}, got {dtype!r}")
        if not clamp and dtype == "uint8":
            raise ValueError("an unclamped pool cannot quantise to uint8; use float16 or float32")
        self.capacity = capacity
        self.item_shape = None if item_shape is None else tuple(item_shape)
        self.clamp = clamp
        self.dtype = dtype
        self.device = torch.device(device)
        self._images: torch.Tensor | None = None
        self._labels = torch.zeros(capacity, dtype=torch.int64)
        self._next = 0
        self._size = 0
        self.total_added = 0

    def __len__(self) -> int:
        return self._size

    def _encode(self, images: torch.Tensor) -> torch.Tensor:
        images = images.detach().to(self.device, torch.float32)
        if self.clamp:
            images = images.clamp(0.0, 1.0)
        if self.dtype == "uint8":
            return (images * 255.0).round().to(torch.uint8)
        return images.to(_DTYPES[self.dtype])

    def _decode(self, stored: torch.Tensor) -> torch.Tensor:
        if self.dtype == "uint8":
            return stored.to(torch.float32) / 255.0
        return stored.to(torch.float32)

    def _add_stored(self, stored: torch.Tensor, labels: torch.Tensor) -> None:
        stored, labels = stored[-self.capacity :], labels[-self.capacity :]
        if self.item_shape is None:
            self.item_shape = tuple(stored.shape[1:])
        if self._images is None:
            self._images = torch.zeros((self.capacity, *self.item_shape), dtype=_DTYPES[self.dtype], device=self.device)
        index = (self._next + torch.arange(len(labels))) % self.capacity
        self._images[index.to(self.device)] = stored.to(self.device)
        self._labels[index] = labels
        self._next = (self._next + len(labels)) % self.capacity
        self._size = min(self.capacity, self._size + len(labels))

    def add(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        """Append items ``(N, *item_shape)`` (clamped to [0, 1] when ``clamp``) with int labels ``(N,)``, dropping
        the oldest."""
        shape_ok = self.item_shape is None or tuple(images.shape[1:]) == self.item_shape
        if not shape_ok or images.shape[0] != labels.shape[0]:
            raise ValueError(
                f"expected items (N, *{self.item_shape}) and labels (N,), got {tuple(images.shape)}, "
                f"{tuple(labels.shape)}"
            )
        self.total_added += int(labels.shape[0])
        self._add_stored(self._encode(images), labels.detach().to("cpu", torch.int64))

    def _ordered_index(self) -> torch.Tensor:
        start = (self._next - self._size) % self.capacity
        return (start + torch.arange(self._size)) % self.capacity

    @property
    def labels(self) -> torch.Tensor:
        """Labels ``(len,)`` (int64, CPU) oldest first."""
        return self._labels[self._ordered_index()]

    def items(self) -> tuple[torch.Tensor, torch.Tensor]:
        """All items ``(len, *item_shape)`` as float32 on ``device`` and labels ``(len,)``, oldest first."""
        index = self._ordered_index()
        if self._images is None:
            return torch.zeros((0, *(self.item_shape or ())), device=self.device), self._labels[:0]
        return self._decode(self._images[index.to(self.device)]), self._labels[index]

    def sample(
        self, n: int, class_weights: torch.Tensor | None = None, generator: torch.Generator | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Draw ``n`` items with replacement: float32 items ``(n, *item_shape)`` on ``device`` and labels ``(n,)``.

        With ``class_weights`` (``(num_classes,)``, non-negative) an item of class ``c`` is drawn with probability
        proportional to ``class_weights[c]``; if the pool holds no class with positive weight, or without weights,
        sampling is uniform. Raises ValueError on an empty pool.
        """
        if self._size == 0 or self._images is None:
            raise ValueError("cannot sample from an empty pool")
        labels = self._labels[: self._size]
        weights = torch.ones(self._size, dtype=torch.float64)
        if class_weights is not None:
            per_item = class_weights.detach().to("cpu", torch.float64)[labels]
            if float(per_item.sum()) > 0:
                weights = per_item
        index = torch.multinomial(weights, n, replacement=True, generator=generator)
        return self._decode(self._images[index.to(self.device)]), labels[index]

    def sample_each(
        self, n: int, class_weights: torch.Tensor, generator: torch.Generator | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Draw ``n`` items with replacement for each of ``R`` rows of ``class_weights`` ``(R, num_classes)``.

        Returns float32 items ``(R, n, *item_shape)`` on ``device`` and labels ``(R, n)``; row ``r`` draws an item
        of class ``c`` with probability proportional to ``class_weights[r, c]`` (uniformly when the pool holds
        no class with positive weight for that row), in one ``torch.multinomial`` call. Raises ValueError on an
        empty pool.
        """
        if self._size == 0 or self._images is None:
            raise ValueError("cannot sample from an empty pool")
        labels = self._labels[: self._size]
        weights = class_weights.detach().to("cpu", torch.float64)[:, labels]
        empty = weights.sum(dim=1) <= 0
        weights[empty] = 1.0
        index = torch.multinomial(weights, n, replacement=True, generator=generator)
        images = self._decode(self._images[index.flatten().to(self.device)])
        return images.view(len(weights), n, *self.item_shape), labels[index]

    def state_dict(self) -> dict:
        """CPU copy of the stored items oldest first (in the storage dtype) plus counters."""
        index = self._ordered_index()
        images = self._images[index.to(self.device)].cpu() if self._images is not None else None
        return {
            "dtype": self.dtype,
            "images": images,
            "labels": self._labels[index].clone(),
            "total_added": self.total_added,
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore from :meth:`state_dict` output; keeps this pool's capacity (the newest items win)."""
        self._images, self._next, self._size = None, 0, 0
        self._labels.zero_()
        if state["images"] is not None and len(state["labels"]) > 0:
            images = state["images"]
            if self.item_shape is not None and tuple(images.shape[1:]) != self.item_shape:
                raise ValueError(f"the saved pool holds items {tuple(images.shape[1:])}, this one {self.item_shape}")
            if state.get("dtype", self.dtype) != self.dtype:
                images = self._encode(images.to(torch.float32) / (255.0 if state["dtype"] == "uint8" else 1.0))
            self._add_stored(images, state["labels"].to(torch.int64))
        self.total_added = int(state["total_added"])
