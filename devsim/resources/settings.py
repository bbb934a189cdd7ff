"""Environment settings: how the simulation uses the machine and the network between its processes (the
``environment`` section). They change speed and memory, not results (TF32 aside: it rounds differently).

Fields are command-line flags (field ``num_workers`` is ``--num-workers``); :class:`EnvironmentSettings` is
inherited by every run configuration, :class:`AsyncEnvironmentSettings` (how the server gathers and sends device
jobs) by the asynchronous ones. Units: timeouts in seconds, sizes in bytes unless named otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from devsim.sections import check_choice, check_min, check_positive_finite, meta

DEVICE_BATCH_WORDS = ("auto", "off")
COMPILE_SETTINGS = ("off", "auto", "graphs", "on")
TENSOR_TRANSFERS = ("auto", "inline", "download")
SHARED_MEMORY_MODES = ("auto", "on", "off")
INLINE_TENSOR_MAX_BYTES = 2 * 2**20
"""``--tensor-transfer auto`` sends tensors inline for models whose float32 state is at most this many bytes (NVFlare's
own download chunk size). Measured (the retired benchmark collab_echo_memory.py, 2-core CPU;
docs/benchmark_history.md): inline is 1.7x faster at 4 MB and 1.5x at 12 MB each way but costs 30-150 MB more
server memory, and at 45 MB it is 1.7x slower and holds 0.5 GB more; async calls stack several versions and return
one delta per job, so the bound sits well below the crossing."""


def _environment(text: str) -> dict[str, Any]:
    return meta("environment", text)


def device_batch_value(value: int | str) -> int | str:
    """``--device-batch`` as ``"auto"``, ``"off"`` or an int (digit strings, e.g. from JSON, become ints)."""
    return int(value) if isinstance(value, str) and value.strip().isdigit() else value


@dataclass
class EnvironmentSettings:
    """Worker threads, batched and compiled training, server threads, timeouts and how model arrays travel."""

    num_workers: int | None = field(
        default=None,
        metadata=_environment("device-training threads per leaf; unset: sized from CPU cores and free VRAM"),
    )
    device_batch: int | str = field(
        default="auto",
        metadata=_environment(
            "devices a worker trains at once as one batched (torch.func.vmap) computation, same updates as one "
            "at a time: auto (batch where exact and worthwhile: models up to 2M parameters on the CPU, any on a "
            "GPU; sized from free RAM/VRAM; each leaf logs its choice), off (thread pool, one at a time) or N"
        ),
    )
    compile: str = field(
        default="auto",
        metadata=_environment(
            "the batched step replayed or compiled for a few bucketed group sizes (padded devices never change real "
            "updates): auto (CUDA graphs of the eager step on a GPU where the probe finds them exact and faster; "
            "eager on the CPU), graphs (CUDA graphs, no probe), on (torch.compile: fused kernels, seconds of "
            "compilation per bucket), off"
        ),
    )
    tf32: bool = field(
        default=False,
        metadata=_environment(
            "on a GPU, let float32 matmuls and convolutions use TF32 tensor cores (faster, ~1e-3 relative rounding); "
            "off: full float32 (cuDNN's own default is on; this switches it off unless set)"
        ),
    )
    cudnn_benchmark: bool = field(
        default=False,
        metadata=_environment(
            "on a GPU, let cuDNN time its convolution algorithms at each new shape and keep the fastest "
            "(torch.backends.cudnn.benchmark; a search at each batched group size, rounding may differ run to run); "
            "off: cuDNN's heuristic choice"
        ),
    )
    server_threads: int | None = field(
        default=None,
        metadata=_environment(
            "PyTorch threads of the server process (its evaluations, FedRevive's synthesis and distillation); "
            "unset: 1 where the server shares the machine with the leaves (--env sim, poc), PyTorch's default "
            "on a deployment"
        ),
    )
    round_timeout: float | None = field(
        default=None,
        metadata=_environment(
            "seconds the server waits for a leaf's reply; unset: 10x the slowest reply so far, at least 60 "
            "(600 before the first); a leaf whose process dies is dropped at once either way"
        ),
    )
    tensor_transfer: str = field(
        default="auto",
        metadata=_environment(
            "how model arrays travel in NVFlare's messages: inline (inside the message, one exchange: a 62k-parameter "
            "call takes 5 ms instead of 24), download (NVFlare's default: the receiver fetches them from the sender "
            "in 2 MiB chunks, less memory for large models) or auto (inline for models up to 2 MiB of float32 state, "
            "and for any model when --shared-memory is on: the model arrays then go through files)"
        ),
    )
    shared_memory: str = field(
        default="auto",
        metadata=_environment(
            "the model arrays of leaf calls and replies go through files in /dev/shm and only their names through "
            "NVFlare (on: the server and its leaves must share one host), inside NVFlare's "
            "messages (off), or auto (on for --env sim where /dev/shm is writable, off elsewhere); results are the "
            "same bit for bit"
        ),
    )

    def check_environment(self, population: bool = True) -> None:
        """Raise ConfigError naming the first bad environment flag."""
        if self.num_workers is not None:
            check_min("num_workers", self.num_workers, 1)
        value = device_batch_value(self.device_batch)
        if isinstance(value, str):
            check_choice("device_batch", value, DEVICE_BATCH_WORDS)
        else:
            check_min("device_batch", value, 1)
        check_choice("compile", self.compile, COMPILE_SETTINGS)
        if self.server_threads is not None:
            check_min("server_threads", self.server_threads, 1)
        if self.round_timeout is not None:
            check_positive_finite("round_timeout", self.round_timeout)
        check_choice("tensor_transfer", self.tensor_transfer, TENSOR_TRANSFERS)
        check_choice("shared_memory", self.shared_memory, SHARED_MEMORY_MODES)


@dataclass
class AsyncEnvironmentSettings:
    """How an asynchronous server gathers device jobs into one call per leaf."""

    dispatch_batch: int | None = field(
        default=None,
        metadata=_environment(
            "device jobs the server gathers before sending them on, one call per leaf carrying every base version "
            "they need (sooner when the next arrival is one of them, or when the call would carry more than 64 MiB of "
            "models); unset: max(B, ceil(K / 2)); 1: each dispatch at once"
        ),
    )
    dispatch_lookahead: bool = field(
        default=True,
        metadata=_environment(
            "gather, as soon as a version is made, the jobs the seeded scheduler will dispatch from it (a guess that "
            "assumes every update is accepted; a wrong guess only wastes training), so they train early"
        ),
    )

    def dispatch_batch_size(self) -> int:
        """The number of gathered jobs that triggers a send (``--dispatch-batch``, or its automatic value)."""
        if self.dispatch_batch is not None:
            return min(self.dispatch_batch, self.concurrency)
        return min(self.concurrency, max(self.buffer_size, -(-self.concurrency // 2)))

    def check_async_environment(self, population: bool = True) -> None:
        """Raise ConfigError for a bad ``--dispatch-batch``."""
        if self.dispatch_batch is not None:
            check_min("dispatch_batch", self.dispatch_batch, 1)
