"""Compression settings: the device -> leaf update codec and its error-feedback store (the ``compression`` section).

Fields are command-line flags (field ``topk_fraction`` is ``--topk-fraction``) inherited by every run
configuration; the codecs themselves are :mod:`devsim.compression.codecs`. Units: fractions of an update's
elements, residual memory in MiB, residual age in rounds (asynchronous runs: versions).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from devsim.config_errors import ConfigError
from devsim.sections import check_choice, check_min, check_positive_finite, meta

UPDATE_CODECS = ("none", "fp16", "int8", "topk")
TOPK_VALUE_TYPES = ("float32", "float16", "int8")


def _compression(text: str) -> dict[str, Any]:
    return meta("compression", text)


@dataclass
class CompressionSettings:
    """How a device's update is encoded before it reaches its leaf, and what top-k keeps for later rounds."""

    update_codec: str = field(
        default="none",
        metadata=_compression(
            f"device->leaf update codec, one of {', '.join(UPDATE_CODECS)} (topk: with error feedback)"
        ),
    )
    topk_fraction: float = field(
        default=0.01,
        metadata=_compression("--update-codec topk: fraction in (0, 1] of the update's elements sent (largest first)"),
    )
    int8_block: int = field(
        default=0, metadata=_compression("--update-codec int8: elements per scale (0: one scale per model entry)")
    )
    topk_values: str = field(
        default="float32",
        metadata=_compression(
            f"--update-codec topk: type of the values sent, one of {', '.join(TOPK_VALUE_TYPES)} "
            "(float16: 2 bytes a value; int8: 1 byte a value and one float32 scale max(abs(v))/127 per update; "
            "the rounding stays in the residual)"
        ),
    )
    topk_warmup_rounds: int = field(
        default=0,
        metadata={
            "section": "compression",
            "help": "--update-codec topk: warm-up rounds W (Deep Gradient Compression): round r < W keeps "
            "topk_fraction ** ((r + 1) / (W + 1)) of the elements, then topk_fraction; 0: no warm-up",
            "sync_only": True,
        },
    )
    topk_momentum: float = field(
        default=0.0,
        metadata={
            "section": "compression",
            "help": "--update-codec topk: momentum beta in [0, 1) each leaf keeps on the mean of its devices' "
            "decoded sparse updates (v = beta * v + mean, reported in place of the mean; no extra bytes); 0: none",
            "sync_only": True,
        },
    )
    residual_capacity: int = field(
        default=10000,
        metadata=_compression("topk error feedback: device residuals each leaf keeps at most (oldest evicted)"),
    )
    residual_memory_mb: float = field(
        default=1024.0,
        metadata=_compression("topk error feedback: MiB of residuals each leaf keeps at most (oldest evicted)"),
    )
    residual_max_age: int = field(
        default=50,
        metadata=_compression("topk error feedback: drop a device's residual after this many rounds/versions unseen"),
    )

    def check_compression(self, population: bool = True) -> None:
        """Raise ConfigError naming the first bad codec flag (warm-up and momentum count synchronous rounds: an
        asynchronous run refuses them)."""
        check_choice("update_codec", self.update_codec, UPDATE_CODECS)
        if not (math.isfinite(self.topk_fraction) and 0.0 < self.topk_fraction <= 1.0):
            raise ConfigError("topk_fraction", f"{self.topk_fraction} is outside the allowed range (0, 1]")
        check_min("int8_block", self.int8_block, 0)
        check_choice("topk_values", self.topk_values, TOPK_VALUE_TYPES)
        check_min("topk_warmup_rounds", self.topk_warmup_rounds, 0)
        if not (math.isfinite(self.topk_momentum) and 0.0 <= self.topk_momentum < 1.0):
            raise ConfigError("topk_momentum", f"{self.topk_momentum} is outside the allowed range [0, 1)")
        if self.topk_momentum and self.update_codec != "topk":
            raise ConfigError(
                "topk_momentum", f"{self.topk_momentum} needs update_codec topk (got {self.update_codec}); allowed: 0"
            )
        check_min("residual_capacity", self.residual_capacity, 1)
        check_min("residual_max_age", self.residual_max_age, 0)
        check_positive_finite("residual_memory_mb", self.residual_memory_mb)
        if hasattr(self, "buffer_size"):
            if self.topk_warmup_rounds:
                raise ConfigError(
                    "topk_warmup_rounds", f"{self.topk_warmup_rounds} is not allowed in asynchronous runs; allowed: 0"
                )
            if self.topk_momentum:
                raise ConfigError(
                    "topk_momentum", f"{self.topk_momentum} is not allowed in asynchronous runs; allowed: 0"
                )
