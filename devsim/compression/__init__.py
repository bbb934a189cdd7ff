"""Update compression on the device -> leaf uplink: the codecs (``none``, ``fp16``, ``int8``, ``topk``) with
their exact byte counts (`codecs`), the bounded per-device error-feedback residual store (`residuals`),
the uplink step a leaf applies to each device's update (`uplink`), and the encoded rows a leaf forwards to
the server in asynchronous runs (`forwarding`). Pure PyTorch; no NVFlare import.

May import `devsim.config`; nothing else of the project.
"""

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
