"""Update compression on the device -> leaf uplink: the codecs (``none``, ``fp16``, ``int8``, ``topk``) with
their exact byte counts (`codecs`), the bounded per-device error-feedback residual store (`residuals`),
and the uplink step a leaf applies to each device's update (`uplink`). Pure PyTorch; no NVFlare import.

May import `devsim.config`; nothing else of the project.
"""

from devsim.compression.codecs import CODECS, CodecSpec, Encoded, decode, encode, payload_bytes, round_payload_bytes
from devsim.compression.residuals import ResidualStore
from devsim.compression.uplink import UplinkCompressor, UplinkStats

__all__ = [
    "CODECS",
    "CodecSpec",
    "Encoded",
    "ResidualStore",
    "UplinkCompressor",
    "UplinkStats",
    "decode",
    "encode",
    "payload_bytes",
    "round_payload_bytes",
]
