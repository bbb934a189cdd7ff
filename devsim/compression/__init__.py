"""Update compression on the device -> leaf uplink: the codecs (``none``, ``fp16``, ``int8``, ``topk``) with
their exact byte counts (`codecs`), the bounded per-device error-feedback residual store (`residuals`),
the uplink step a leaf applies to each device's update (`uplink`), and the encoded rows a leaf forwards to
the server in asynchronous runs (`forwarding`). Pure PyTorch; no NVFlare import.

`settings` is the compression section of the run configuration. May import `devsim.config`; nothing else of
the project.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from devsim.lazy_exports import lazy_exports

if TYPE_CHECKING:
    from devsim.compression.codecs import CODECS, CodecSpec, Encoded, decode, encode, payload_bytes, round_payload_bytes
    from devsim.compression.forwarding import decode_row, row_of, split_rows, stack_rows
    from devsim.compression.residuals import ResidualStore
    from devsim.compression.uplink import UplinkCompressor, UplinkStats, keeps_state

__all__ = [
    "CODECS",
    "CodecSpec",
    "Encoded",
    "ResidualStore",
    "UplinkCompressor",
    "UplinkStats",
    "decode",
    "decode_row",
    "encode",
    "keeps_state",
    "payload_bytes",
    "round_payload_bytes",
    "row_of",
    "split_rows",
    "stack_rows",
]

_HOMES = {
    "CODECS": "devsim.compression.codecs",
    "CodecSpec": "devsim.compression.codecs",
    "Encoded": "devsim.compression.codecs",
    "decode": "devsim.compression.codecs",
    "encode": "devsim.compression.codecs",
    "payload_bytes": "devsim.compression.codecs",
    "round_payload_bytes": "devsim.compression.codecs",
    "decode_row": "devsim.compression.forwarding",
    "row_of": "devsim.compression.forwarding",
    "split_rows": "devsim.compression.forwarding",
    "stack_rows": "devsim.compression.forwarding",
    "ResidualStore": "devsim.compression.residuals",
    "UplinkCompressor": "devsim.compression.uplink",
    "UplinkStats": "devsim.compression.uplink",
    "keeps_state": "devsim.compression.uplink",
}
"""Where each exported name lives: imported on first use, so that importing one module of this package (e.g. its
settings, which the run configuration imports) does not import PyTorch."""


__getattr__ = lazy_exports(__name__, _HOMES)
