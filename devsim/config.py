"""Run configuration for hierarchical device simulation, validated before anything starts.

A configuration is a flat dataclass of plain values (str, int, float, bool, None) so that it
travels unchanged through NVFlare's job configuration (JSON) to every process. Every field maps
to one command-line flag: field ``device_selection_size`` is flag ``--device-selection-size``.
Validation errors name that flag and the allowed values.

This module is longer than 400 lines on purpose: each field is one command-line flag with its help
text, and one class per method keeps every flag of that method, and its checks, in one place.
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field
from typing import Any

from devsim.config_errors import ConfigError, flag_name  # noqa: F401  (flag_name: imported from here by many)
from devsim.privacy.settings import PrivacySettings

DATASETS = ("synthetic", "digits", "cifar10", "cifar100")
MODELS = ("cnn", "resnet18", "resnet18_nonorm")
DEVICE_BATCH_WORDS = ("auto", "off")
COMPILE_SETTINGS = ("off", "auto", "on")
PARTITIONS = ("auto", "natural", "iid", "dirichlet")
OPTIMIZERS = ("sgd", "adam")
STALENESS_WEIGHTINGS = ("none", "polynomial")
GROUP_KINDS = ("label_permutation", "input_transform")
FAULT_KINDS = ("nan", "inf", "norm", "shape", "keys", "dtype")
AVAILABILITY_MODES = ("always", "diurnal", "trace")
SPEED_DISTRIBUTIONS = ("profile", "lognormal", "trace")
DATASET_CLASSES = {"synthetic": 10, "digits": 10, "cifar10": 10, "cifar100": 100}
UPDATE_CODECS = ("none", "fp16", "int8", "topk")
TOPK_VALUE_TYPES = ("float32", "float16", "int8")
TENSOR_TRANSFERS = ("auto", "inline", "download")
SHARED_MEMORY_MODES = ("auto", "on", "off")
INLINE_TENSOR_MAX_BYTES = 2 * 2**20
"""``--tensor-transfer auto`` sends tensors inline for models whose float32 state is at most this many bytes (NVFlare's
own download chunk size). Measured (benchmarks/collab_echo_memory.py, 2-core CPU): inline is 1.7x faster at 4 MB
and 1.5x at 12 MB each way but costs 30-150 MB more server memory, and at 45 MB it is 1.7x slower and holds 0.5 GB
more; async calls stack several versions and return one delta per job, so the bound sits well below the crossing."""


def _help(text: str) -> dict[str, str]:
    return {"help": text}


@dataclass
class SimulationConfig(PrivacySettings):
    """Everything that defines a synchronous hierarchical FedAvg run (the ``--dp-*`` section: PrivacySettings).

    Units: learning rates are plain multipliers; sizes are counts; timeouts are seconds.
    """

    task: str | None = field(
        default=None,
        metadata=_help(
            "your task: a Python file (path/to/my_task.py) or module (package.module) defining model() and data(), "
            "optionally loss(), metrics(), prepare(), augment() (docs/tasks.md); unset: the built-in task of "
            "--dataset and --model"
        ),
    )
    dataset: str = field(
        default="synthetic", metadata=_help(f"built-in dataset (without --task), one of {', '.join(DATASETS)}")
    )
    data_root: str | None = field(
        default=None, metadata=_help("folder holding the CIFAR python-format data (required for cifar*)")
    )
    download: bool = field(default=False, metadata=_help("download CIFAR into --data-root when missing"))
    data_seed: int = field(default=0, metadata=_help("seed of the synthetic dataset's images"))
    synthetic_train_size: int = field(default=20000, metadata=_help("synthetic training images"))
    synthetic_test_size: int = field(default=2000, metadata=_help("synthetic test images"))
    hidden_groups: int = field(
        default=1,
        metadata=_help("leaves form this many hidden groups whose data differ (leaf i is in group i mod N); 1: none"),
    )
    group_kind: str = field(
        default="label_permutation",
        metadata=_help(f"how hidden groups differ, one of {', '.join(GROUP_KINDS)}"),
    )
    num_leaf_nodes: int = field(default=2, metadata=_help("leaf nodes (NVFlare clients) under the server"))
    devices_per_leaf: int = field(
        default=50,
        metadata=_help("simulated devices owned by each leaf (natural partition: owners / leaves, set from the task)"),
    )
    device_selection_size: int = field(
        default=20, metadata={"help": "devices sampled per round, over all leaves", "sync_only": True}
    )
    samples_per_device: int = field(
        default=100,
        metadata=_help("training samples in each device's shard (iid, dirichlet; natural: set to the mean owner's)"),
    )
    partition: str = field(
        default="auto",
        metadata=_help(
            f"data partition, one of {', '.join(PARTITIONS)} (natural: one device per owner in the task's "
            "owner_train, the population size follows from it; auto: natural when the task names owners, "
            "else dirichlet)"
        ),
    )
    alpha: float = field(default=0.5, metadata=_help("Dirichlet concentration (> 0) for --partition dirichlet"))
    num_rounds: int = field(default=20, metadata={"help": "synchronous rounds", "sync_only": True})
    local_epochs: int = field(default=1, metadata=_help("local epochs per device (ignored with --local-iterations)"))
    local_iterations: int | None = field(
        default=None, metadata=_help("fixed local SGD steps per device; overrides --local-epochs")
    )
    batch_size: int = field(default=10, metadata=_help("local batch size"))
    optimizer: str = field(default="sgd", metadata=_help(f"local optimizer, one of {', '.join(OPTIMIZERS)}"))
    lr: float = field(default=0.05, metadata=_help("local learning rate"))
    momentum: float = field(default=0.9, metadata=_help("local SGD momentum in [0, 1) (--optimizer sgd)"))
    augment: bool = field(default=False, metadata=_help("random crop (4 px reflect padding) and flip locally"))
    global_lr: float = field(default=1.0, metadata=_help("server learning rate applied to the mean delta"))
    model: str = field(default="cnn", metadata=_help(f"built-in model (without --task), one of {', '.join(MODELS)}"))
    num_workers: int | None = field(
        default=None,
        metadata=_help("device-training threads per leaf; unset: sized from CPU cores and free VRAM"),
    )
    device_batch: int | str = field(
        default="auto",
        metadata=_help(
            "devices a worker trains at once as one batched (torch.func.vmap) computation, same updates as one "
            "at a time: auto (batch where exact and worthwhile: models up to 2M parameters on the CPU, any on a "
            "GPU; sized from free RAM/VRAM; each leaf logs its choice), off (thread pool, one at a time) or N"
        ),
    )
    compile: str = field(
        default="auto",
        metadata=_help(
            "the batched step compiled for a few bucketed group sizes (padded devices never change real updates): "
            "auto (CUDA graphs on a GPU where the probe finds them exact and faster; eager on the CPU), on, off"
        ),
    )
    tf32: bool = field(
        default=False,
        metadata=_help(
            "on a GPU, let float32 matmuls and convolutions use TF32 tensor cores (faster, ~1e-3 relative rounding); "
            "off: full float32 (cuDNN's own default is on; this switches it off unless set)"
        ),
    )
    eval_frequency: int = field(
        default=1, metadata=_help("evaluate the global model every N rounds (async: every N model versions)")
    )
    log_every: int = field(
        default=1, metadata=_help("print a progress line every N rounds or evaluations (and the last)")
    )
    eval_batch_size: int = field(default=500, metadata=_help("batch size of central evaluation"))
    seed: int = field(default=0, metadata=_help("seed of model init, device sampling, partitions and training"))
    round_timeout: float | None = field(
        default=None,
        metadata=_help(
            "seconds the server waits for a leaf's reply; unset: 10x the slowest reply so far, at least 60 "
            "(600 before the first); a leaf whose process dies is dropped at once either way"
        ),
    )
    server_threads: int | None = field(
        default=None,
        metadata=_help(
            "PyTorch threads of the server process (its evaluations, FedRevive's synthesis and distillation); "
            "unset: 1 where the server shares the machine with the leaves (--env sim, poc), PyTorch's default "
            "on a deployment"
        ),
    )
    tensor_transfer: str = field(
        default="auto",
        metadata=_help(
            "how model arrays travel in NVFlare's messages: inline (inside the message, one exchange: a 62k-parameter "
            "call takes 5 ms instead of 24), download (NVFlare's default: the receiver fetches them from the sender "
            "in 2 MiB chunks, less memory for large models) or auto (inline for models up to 2 MiB of float32 state)"
        ),
    )
    shared_memory: str = field(
        default="auto",
        metadata=_help(
            "the model arrays of leaf calls and replies go through files in /dev/shm and only their names through "
            "NVFlare (on: the server and its leaves must share one host), inside NVFlare's "
            "messages (off), or auto (on for --env sim where /dev/shm is writable, off elsewhere); results are the "
            "same bit for bit"
        ),
    )
    device_dropout: float = field(
        default=0.0, metadata=_help("probability that a selected device fails mid-task (its work is discarded)")
    )
    device_never_answer: float = field(default=0.0, metadata=_help("probability that a selected device never answers"))
    min_devices_fraction: float = field(
        default=0.5,
        metadata=_help(
            "a round fails unless this fraction of its selected devices answered (devices on leaves already lost "
            "count toward --min-leaves instead)"
        ),
    )
    min_leaves: int = field(default=1, metadata=_help("the run stops when fewer leaves than this still answer"))
    max_update_norm: float | None = field(
        default=None, metadata=_help("reject a device or leaf update whose mean delta L2 norm exceeds this")
    )
    max_update_ratio: float | None = field(
        default=10.0,
        metadata=_help("reject a device or leaf update whose L2 norm exceeds this times the global model's norm"),
    )
    update_norm_factor: float | None = field(
        default=20.0, metadata=_help("also reject updates whose norm exceeds this times the median accepted norm")
    )
    inject_faults: str = field(
        default="",
        metadata=_help(f"testing: corrupt updates with these faults (comma list of {', '.join(FAULT_KINDS)})"),
    )
    fault_probability: float = field(default=0.0, metadata=_help("testing: probability of each injected fault"))
    checkpoint_frequency: int = field(
        default=5,
        metadata=_help("save a checkpoint every N rounds or evaluations (and at the end); 0: only at the end"),
    )
    stop_after_round: int | None = field(
        default=None,
        metadata={
            "help": "save a checkpoint and stop after this round (continue later with --resume RUN_DIR)",
            "sync_only": True,
        },
    )
    resume_from: str | None = field(
        default=None,
        metadata={"help": "run folder whose checkpoint the server continues from (set by --resume)", "internal": True},
    )
    output_dir: str | None = field(
        default=None,
        metadata=_help("where results.json and final_model.pt go; unset: a folder in the server's run dir"),
    )
    update_codec: str = field(
        default="none",
        metadata=_help(f"device->leaf update codec, one of {', '.join(UPDATE_CODECS)} (topk: with error feedback)"),
    )
    topk_fraction: float = field(
        default=0.01,
        metadata=_help("--update-codec topk: fraction in (0, 1] of the update's elements sent (largest first)"),
    )
    int8_block: int = field(
        default=0, metadata=_help("--update-codec int8: elements per scale (0: one scale per model entry)")
    )
    topk_values: str = field(
        default="float32",
        metadata=_help(
            f"--update-codec topk: type of the values sent, one of {', '.join(TOPK_VALUE_TYPES)} "
            "(float16: 2 bytes a value; int8: 1 byte a value and one float32 scale max(abs(v))/127 per update; "
            "the rounding stays in the residual)"
        ),
    )
    topk_warmup_rounds: int = field(
        default=0,
        metadata={
            "help": "--update-codec topk: warm-up rounds W (Deep Gradient Compression): round r < W keeps "
            "topk_fraction ** ((r + 1) / (W + 1)) of the elements, then topk_fraction; 0: no warm-up",
            "sync_only": True,
        },
    )
    topk_momentum: float = field(
        default=0.0,
        metadata={
            "help": "--update-codec topk: momentum beta in [0, 1) each leaf keeps on the mean of its devices' "
            "decoded sparse updates (v = beta * v + mean, reported in place of the mean; no extra bytes); 0: none",
            "sync_only": True,
        },
    )
    residual_capacity: int = field(
        default=10000, metadata=_help("topk error feedback: device residuals each leaf keeps at most (oldest evicted)")
    )
    residual_memory_mb: float = field(
        default=1024.0,
        metadata=_help("topk error feedback: MiB of residuals each leaf keeps at most (oldest evicted)"),
    )
    residual_max_age: int = field(
        default=50,
        metadata=_help("topk error feedback: drop a device's residual after this many rounds/versions unseen"),
    )
    uplink_mbps: float | None = field(
        default=None, metadata=_help("median device uplink in Mbit/s on the virtual clock; unset: uploads take no time")
    )
    downlink_mbps: float | None = field(
        default=None,
        metadata=_help("median device downlink in Mbit/s on the virtual clock; unset: downloads take no time"),
    )
    latency_ms: float = field(default=0.0, metadata=_help("median latency added to each transfer, milliseconds"))
    bandwidth_spread: float = field(
        default=0.0, metadata=_help("log-normal sigma of per-device bandwidth and latency around the medians")
    )
    delay_schedule: str = field(
        default="paper_default",
        metadata=_help("device delay preset in app_configs/device_profiles (or a JSON file path)"),
    )
    availability: str = field(
        default="always",
        metadata=_help(
            f"when devices are online, one of {', '.join(AVAILABILITY_MODES)} (diurnal: seeded sessions; "
            "trace: --trace-file); see docs/device_traces.md"
        ),
    )
    trace_file: str | None = field(
        default=None, metadata=_help("device trace (.csv or .npz) for --availability trace (docs/device_traces.md)")
    )
    speed_distribution: str = field(
        default="profile",
        metadata=_help(
            f"device compute speeds, one of {', '.join(SPEED_DISTRIBUTIONS)} (profile: --delay-schedule tiers; "
            "lognormal: median 1, --speed-sigma; trace: the trace's speed column)"
        ),
    )
    speed_sigma: float = field(default=0.5, metadata=_help("log-sd of --speed-distribution lognormal"))
    samples_per_second: float = field(
        default=10.0, metadata=_help("simulated training samples per second of a speed-1.0 device")
    )

    @property
    def num_devices(self) -> int:
        """Devices in the whole population."""
        return self.num_leaf_nodes * self.devices_per_leaf

    def update_norm_limit(self, global_norm: float) -> float | None:
        """The absolute L2 limit on a (per-sample mean) update for a global model of norm ``global_norm``."""
        limits = [v for v in (self.max_update_norm,) if v is not None]
        if self.max_update_ratio is not None and global_norm > 0:
            limits.append(self.max_update_ratio * global_norm)
        return min(limits) if limits else None

    @property
    def fault_kinds(self) -> list[str]:
        """The kinds listed in ``inject_faults``."""
        return [k.strip() for k in self.inject_faults.split(",") if k.strip()]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any], population: bool = True) -> SimulationConfig:
        """Build and validate; unknown keys and wrongly typed values raise ConfigError. ``population=False``
        leaves out the checks against the population size, for a configuration whose task has yet to set it
        (a natural partition; see :func:`devsim.tasks.fit.fit_config`)."""
        if not isinstance(values, dict):
            raise ConfigError("config", f"expected a mapping of field names to values, got {type(values).__name__}")
        known = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise ConfigError(
                str(unknown[0]), f"unknown setting {unknown}; allowed settings: {', '.join(sorted(known))}"
            )
        config = cls(**values)
        config.validate(population=population)
        return config

    def validate(self, population: bool = True) -> SimulationConfig:
        """Check every field; raise ConfigError naming the first bad flag. Returns self. ``population=False``
        skips the checks against ``num_devices`` (see :meth:`from_dict`)."""
        _check_types(self)
        _check_choice("dataset", self.dataset, DATASETS)
        _check_choice("model", self.model, MODELS)
        _check_choice("partition", self.partition, PARTITIONS)
        _check_choice("optimizer", self.optimizer, OPTIMIZERS)
        _check_choice("group_kind", self.group_kind, GROUP_KINDS)
        _check_choice("tensor_transfer", self.tensor_transfer, TENSOR_TRANSFERS)
        _check_choice("shared_memory", self.shared_memory, SHARED_MEMORY_MODES)
        if self.server_threads is not None:
            _check_min("server_threads", self.server_threads, 1)
        if not 1 <= self.hidden_groups <= self.num_leaf_nodes:
            raise ConfigError(
                "hidden_groups",
                f"{self.hidden_groups} is not allowed; allowed: 1..{self.num_leaf_nodes} (--num-leaf-nodes)",
            )
        for name in (
            "num_leaf_nodes",
            "devices_per_leaf",
            "device_selection_size",
            "samples_per_device",
            "local_epochs",
            "batch_size",
            "eval_frequency",
            "log_every",
            "eval_batch_size",
            "synthetic_train_size",
            "synthetic_test_size",
        ):
            _check_min(name, getattr(self, name), 1)
        _check_min("num_rounds", self.num_rounds, 0 if isinstance(self, AsyncConfig) else 1)
        _check_min("seed", self.seed, 0)
        _check_min("data_seed", self.data_seed, 0)
        _check_min("checkpoint_frequency", self.checkpoint_frequency, 0)
        if self.local_iterations is not None:
            _check_min("local_iterations", self.local_iterations, 1)
        if self.stop_after_round is not None:
            _check_min("stop_after_round", self.stop_after_round, 1)
        if self.num_workers is not None:
            _check_min("num_workers", self.num_workers, 1)
        if population and self.device_selection_size > self.num_devices:
            raise ConfigError(
                "device_selection_size",
                f"{self.device_selection_size} is larger than the population of {self.num_devices} devices "
                f"(--num-leaf-nodes {self.num_leaf_nodes} x --devices-per-leaf {self.devices_per_leaf}); "
                f"allowed: 1..{self.num_devices}",
            )
        _check_positive_finite("lr", self.lr)
        _check_positive_finite("global_lr", self.global_lr)
        if self.round_timeout is not None:
            _check_positive_finite("round_timeout", self.round_timeout)
        for name in ("device_dropout", "device_never_answer", "fault_probability"):
            value = getattr(self, name)
            if not (math.isfinite(value) and 0.0 <= value < 1.0):
                raise ConfigError(name, f"{value} is outside the allowed range [0, 1)")
        if self.device_dropout + self.device_never_answer >= 1.0:
            raise ConfigError("device_dropout", "--device-dropout + --device-never-answer must be < 1")
        if not (math.isfinite(self.min_devices_fraction) and 0.0 <= self.min_devices_fraction <= 1.0):
            raise ConfigError(
                "min_devices_fraction", f"{self.min_devices_fraction} is outside the allowed range [0, 1]"
            )
        if not 1 <= self.min_leaves <= self.num_leaf_nodes:
            raise ConfigError("min_leaves", f"{self.min_leaves} is not allowed; allowed: 1..{self.num_leaf_nodes}")
        if self.max_update_norm is not None:
            _check_positive_finite("max_update_norm", self.max_update_norm)
        if self.max_update_ratio is not None:
            _check_positive_finite("max_update_ratio", self.max_update_ratio)
        if self.update_norm_factor is not None and not (
            math.isfinite(self.update_norm_factor) and self.update_norm_factor > 1
        ):
            raise ConfigError("update_norm_factor", f"{self.update_norm_factor} is not allowed; it must be > 1")
        for kind in self.fault_kinds:
            _check_choice("inject_faults", kind, FAULT_KINDS)
        _check_positive_finite("alpha", self.alpha)
        if not (0.0 <= self.momentum < 1.0):
            raise ConfigError("momentum", f"{self.momentum} is outside the allowed range [0, 1)")
        _check_device_batch(self)
        _check_choice("compile", self.compile, COMPILE_SETTINGS)
        _check_codec_and_network(self)
        _check_heterogeneity(self)
        self.check_privacy(population)
        if self.task is not None:
            if not self.task.strip():
                raise ConfigError("task", "give a file path (my_task.py) or a module name (package.module)")
        elif self.dataset == "digits":
            _check_digits(self)
        elif self.dataset != "synthetic":
            if not self.data_root:
                raise ConfigError(
                    "data_root",
                    f"--dataset {self.dataset} needs --data-root (a folder for the CIFAR python-format "
                    "data); for an offline run use --dataset synthetic",
                )
            if not self.download and not os.path.isdir(self.data_root):
                raise ConfigError(
                    "data_root",
                    f"folder {self.data_root!r} does not exist; create it and pass --download, "
                    "or use --dataset synthetic for an offline run",
                )
        return self


def _check_digits(config: SimulationConfig) -> None:
    """Flags that cannot apply to scikit-learn's digits (real, built in, 1,437 grey training images)."""
    from devsim.data.digits import DIGITS_TRAIN_SIZE, INSTALL_HINT, digits_available

    if config.data_root or config.download:
        name = "data_root" if config.data_root else "download"
        raise ConfigError(name, "--dataset digits reads no files: drop --data-root and --download (for cifar*)")
    if config.samples_per_device > DIGITS_TRAIN_SIZE:
        raise ConfigError(
            "samples_per_device",
            f"{config.samples_per_device} is more than the {DIGITS_TRAIN_SIZE} digits training images; "
            f"allowed: 1..{DIGITS_TRAIN_SIZE}",
        )
    if config.group_kind == "input_transform" and config.hidden_groups > 8:
        raise ConfigError(
            "hidden_groups",
            f"{config.hidden_groups} is not allowed with --dataset digits --group-kind input_transform: digits are "
            "grey, so only the 8 rotation/inversion transforms differ; allowed: 1..8",
        )
    if not digits_available():
        raise ConfigError("dataset", INSTALL_HINT)


def _check_types(config: SimulationConfig) -> None:
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        allowed = f.type if isinstance(f.type, str) else str(f.type)
        optional = "None" in allowed
        if value is None:
            if not optional:
                raise ConfigError(f.name, f"a value is required (type {allowed})")
            continue
        base = allowed.replace("| None", "").strip()
        if base == "bool":
            ok = isinstance(value, bool)
        elif base == "int":
            ok = isinstance(value, int) and not isinstance(value, bool)
        elif base == "float":
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        elif base == "str":
            ok = isinstance(value, str)
        else:
            ok = True
        if not ok:
            raise ConfigError(f.name, f"{value!r} has type {type(value).__name__}; expected {allowed}")


def device_batch_value(value: int | str) -> int | str:
    """``--device-batch`` as ``"auto"``, ``"off"`` or an int (digit strings, e.g. from JSON, become ints)."""
    return int(value) if isinstance(value, str) and value.strip().isdigit() else value


def _check_codec_and_network(config: SimulationConfig) -> None:
    """Update codec, error-feedback store and network model (see devsim.compression, devsim.clock.network)."""
    _check_choice("update_codec", config.update_codec, UPDATE_CODECS)
    if not (math.isfinite(config.topk_fraction) and 0.0 < config.topk_fraction <= 1.0):
        raise ConfigError("topk_fraction", f"{config.topk_fraction} is outside the allowed range (0, 1]")
    _check_min("int8_block", config.int8_block, 0)
    _check_choice("topk_values", config.topk_values, TOPK_VALUE_TYPES)
    _check_min("topk_warmup_rounds", config.topk_warmup_rounds, 0)
    if not (math.isfinite(config.topk_momentum) and 0.0 <= config.topk_momentum < 1.0):
        raise ConfigError("topk_momentum", f"{config.topk_momentum} is outside the allowed range [0, 1)")
    if config.topk_momentum and config.update_codec != "topk":
        raise ConfigError(
            "topk_momentum", f"{config.topk_momentum} needs update_codec topk (got {config.update_codec}); allowed: 0"
        )
    _check_min("residual_capacity", config.residual_capacity, 1)
    _check_min("residual_max_age", config.residual_max_age, 0)
    _check_positive_finite("residual_memory_mb", config.residual_memory_mb)
    for name in ("uplink_mbps", "downlink_mbps"):
        if getattr(config, name) is not None:
            _check_positive_finite(name, getattr(config, name))
    for name in ("latency_ms", "bandwidth_spread"):
        value = getattr(config, name)
        if not (math.isfinite(value) and value >= 0):
            raise ConfigError(name, f"{value} is not allowed; it must be a finite number >= 0")
    from devsim.clock import load_schedule

    try:
        load_schedule(config.delay_schedule)
    except (ValueError, OSError) as error:
        raise ConfigError("delay_schedule", str(error)) from error


def _check_device_batch(config: SimulationConfig) -> None:
    """``--device-batch`` is auto, off or an integer >= 1."""
    value = device_batch_value(config.device_batch)
    if isinstance(value, str):
        _check_choice("device_batch", value, DEVICE_BATCH_WORDS)
    else:
        _check_min("device_batch", value, 1)


def _check_heterogeneity(config: SimulationConfig) -> None:
    """``--availability``, ``--trace-file``, ``--speed-distribution`` and their numbers fit together; a
    trace file is read and checked here so that a bad one stops the run before anything starts."""
    _check_choice("availability", config.availability, AVAILABILITY_MODES)
    _check_choice("speed_distribution", config.speed_distribution, SPEED_DISTRIBUTIONS)
    _check_positive_finite("samples_per_second", config.samples_per_second)
    if not (math.isfinite(config.speed_sigma) and config.speed_sigma >= 0):
        raise ConfigError("speed_sigma", f"{config.speed_sigma} is not allowed; it must be a finite number >= 0")
    if config.availability == "trace" and not config.trace_file:
        raise ConfigError("trace_file", "--availability trace needs --trace-file (a .csv or .npz trace)")
    if config.availability != "trace" and config.trace_file:
        raise ConfigError("trace_file", f"is only used with --availability trace, not {config.availability}")
    if config.speed_distribution == "trace" and config.availability != "trace":
        raise ConfigError("speed_distribution", "trace needs --availability trace and a trace with a 'speed' column")
    if config.trace_file:
        from devsim.population.traces import load_trace

        try:
            trace = load_trace(config.trace_file)
        except ValueError as error:
            raise ConfigError("trace_file", str(error)) from error
        if config.speed_distribution == "trace" and trace.speed is None:
            raise ConfigError("speed_distribution", f"trace needs a 'speed' column in {config.trace_file}")


def _check_choice(name: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ConfigError(name, f"{value!r} is not one of the allowed values: {', '.join(allowed)}")


def _check_min(name: str, value: int, minimum: int) -> None:
    if value < minimum:
        raise ConfigError(name, f"{value} is below the minimum of {minimum}")


def _check_positive_finite(name: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(name, f"{value} is not allowed; it must be a finite number > 0")


@dataclass
class AsyncConfig(SimulationConfig):
    """An asynchronous run (FedBuff, FedRevive) on the seeded virtual clock: the K/B/O scheduler.

    ``concurrency`` (K) device jobs are in flight, a new global version follows every
    ``buffer_size`` (B) accepted updates, and new jobs are dispatched once ``min_open_slots`` (O)
    slots are free. Times are simulated seconds.
    """

    concurrency: int = field(default=20, metadata=_help("K: device jobs in flight"))
    buffer_size: int = field(default=2, metadata=_help("B: accepted updates per new global version"))
    min_open_slots: int = field(default=1, metadata=_help("O: dispatch new jobs once this many slots are open"))
    max_versions: int | None = field(default=100, metadata=_help("stop after this many global versions"))
    max_sim_time: float | None = field(default=None, metadata=_help("stop at this simulated time (seconds)"))
    delay_schedule: str = field(
        default="paper_default",
        metadata=_help("device delay preset in app_configs/device_profiles (or a JSON file path)"),
    )
    staleness_weighting: str = field(
        default="none", metadata=_help(f"FedBuff staleness weighting, one of {', '.join(STALENESS_WEIGHTINGS)}")
    )
    staleness_exponent: float = field(default=0.5, metadata=_help("a in (1 + staleness)^-a for polynomial weighting"))
    stop_after_version: int | None = field(
        default=None,
        metadata=_help("save a checkpoint and stop at the first evaluation at or after this version (see --resume)"),
    )
    dispatch_batch: int | None = field(
        default=None,
        metadata=_help(
            "device jobs the server gathers before sending them on, one call per leaf carrying every base version "
            "they need (sooner when the next arrival is one of them, or when the call would carry more than 64 MiB of "
            "models); unset: max(B, ceil(K / 2)); 1: each dispatch at once; 'none' unsets it"
        ),
    )

    dispatch_lookahead: bool = field(
        default=True,
        metadata=_help(
            "gather, as soon as a version is made, the jobs the seeded scheduler will dispatch from it (a guess that "
            "assumes every update is accepted; a wrong guess only wastes training), so they train early"
        ),
    )

    lose_leaf: str = field(
        default="",
        metadata=_help(
            "faults: drop leaves from the run at a global version, as if their host died then, e.g. "
            "site-3@20,site-1@40 (its jobs arriving after that version are lost); a loss at a version, unlike a "
            "killed process, is the same in every run of the seed"
        ),
    )

    def leaf_losses(self) -> dict[str, int]:
        """``--lose-leaf`` as {leaf site name: global version at which it is lost}."""
        losses = {}
        for entry in (e.strip() for e in self.lose_leaf.split(",")):
            if not entry:
                continue
            site, _, version = entry.rpartition("@")
            if not site.startswith("site-") or not site[5:].isdigit() or not version.isdigit() or int(version) < 1:
                raise ConfigError(
                    "lose_leaf", f"{entry!r} is not SITE@VERSION (a leaf site-N and a version >= 1, e.g. site-3@20)"
                )
            if int(site[5:]) not in range(1, self.num_leaf_nodes + 1):
                raise ConfigError(
                    "lose_leaf", f"{entry!r}: no leaf {site}; the leaves are site-1..site-{self.num_leaf_nodes}"
                )
            losses[site] = int(version)
        return losses

    def dispatch_batch_size(self) -> int:
        """The number of gathered jobs that triggers a send (``--dispatch-batch``, or its automatic value)."""
        if self.dispatch_batch is not None:
            return min(self.dispatch_batch, self.concurrency)
        return min(self.concurrency, max(self.buffer_size, -(-self.concurrency // 2)))

    def validate(self, population: bool = True) -> AsyncConfig:
        super().validate(population)
        if self.topk_warmup_rounds:
            raise ConfigError(
                "topk_warmup_rounds", f"{self.topk_warmup_rounds} is not allowed in asynchronous runs; allowed: 0"
            )
        if self.topk_momentum:
            raise ConfigError("topk_momentum", f"{self.topk_momentum} is not allowed in asynchronous runs; allowed: 0")
        _check_choice("staleness_weighting", self.staleness_weighting, STALENESS_WEIGHTINGS)
        _check_min("concurrency", self.concurrency, 1)
        _check_min("buffer_size", self.buffer_size, 1)
        if population and self.concurrency > self.num_devices:
            raise ConfigError(
                "concurrency", f"{self.concurrency} is larger than the population; allowed: 1..{self.num_devices}"
            )
        if not 1 <= self.min_open_slots <= self.concurrency:
            raise ConfigError(
                "min_open_slots", f"{self.min_open_slots} is not allowed; allowed: 1..{self.concurrency} (K)"
            )
        if self.max_versions is None and self.max_sim_time is None:
            raise ConfigError("max_versions", "set --max-versions or --max-sim-time (or both)")
        if self.max_versions is not None:
            _check_min("max_versions", self.max_versions, 1)
        if self.stop_after_version is not None:
            _check_min("stop_after_version", self.stop_after_version, 1)
        if self.dispatch_batch is not None:
            _check_min("dispatch_batch", self.dispatch_batch, 1)
        if len(self.leaf_losses()) >= self.num_leaf_nodes:
            raise ConfigError("lose_leaf", f"{self.lose_leaf!r} loses every leaf; at least one must remain")
        if self.max_sim_time is not None:
            _check_positive_finite("max_sim_time", self.max_sim_time)
        if not (math.isfinite(self.staleness_exponent) and self.staleness_exponent >= 0):
            raise ConfigError("staleness_exponent", f"{self.staleness_exponent} is not allowed; it must be >= 0")
        from devsim.clock import load_schedule

        try:
            load_schedule(self.delay_schedule)
        except (ValueError, OSError) as error:
            raise ConfigError("delay_schedule", str(error)) from error
        return self


SIMILARITY_SOURCES = (
    "model_drift",
    "layer_drift",
    "layer_updates",
    "last_layer_drift",
    "last_layer_weights",
    "last_layer_updates",
)


@dataclass
class ClusterConfig(SimulationConfig):
    """A synchronous run with cluster aggregation over leaf models at the server."""

    tau: float | None = field(
        default=None,
        metadata=_help(
            "link leaves whose absolute cosine similarity exceeds this; unset: chosen each round (silhouette)"
        ),
    )
    similarity_on: str = field(
        default="model_drift",
        metadata=_help(
            f"what is compared, one of {', '.join(SIMILARITY_SOURCES)} (drift: weights minus the initial model; "
            "model: all entries, layer: each layer normalised, last_layer: the classifier only)"
        ),
    )
    gate_margin: float | None = field(
        default=None,
        metadata=_help("accuracy gate: a leaf keeps its model when the cluster model is worse by more than this"),
    )
    min_silhouette: float = field(
        default=0.25,
        metadata=_help("unset --tau: a split is proposed when its mean silhouette reaches this, in [0, 1)"),
    )
    centre_similarity: bool = field(
        default=True,
        metadata=_help("unset --tau, drift sources: decide splits on cosines of drift minus the leaves' mean drift"),
    )
    confirm_rounds: int = field(
        default=3,
        metadata=_help("a new partition takes effect once proposed in this many consecutive rounds (1: at once)"),
    )
    resplit_silhouette: float | None = field(
        default=0.2,
        metadata=_help(
            "split a cluster of 3+ leaves again when its members' centred update cosines split with this "
            "silhouette in --confirm-rounds consecutive rounds; unset: never"
        ),
    )
    scale_entries: bool = field(
        default=True,
        metadata=_help(
            "centred cosines: scale each model entry by its spread across leaves first, so every entry counts "
            "by its number of values, not the size of its values"
        ),
    )
    agree_on: str = field(
        default="updates",
        metadata=_help(
            "one of drift, updates: unset --tau, drift sources, all leaves join at once when every pair's "
            "absolute cosine of this exceeds 0.5 (drift holds the shrink all leaves share, so it always does)"
        ),
    )
    confirm_pairs: bool = field(
        default=True,
        metadata=_help(
            "also join the pairs of leaves proposed together in each of the last --confirm-rounds rounds "
            "(a leaf that changes sides holds back only itself)"
        ),
    )
    pair_window: int | None = field(
        default=5,
        metadata=_help(
            "--confirm-pairs: join a pair proposed together in --confirm-rounds of the last this many rounds, "
            "counted across joins of other leaves (>= --confirm-rounds); unset: in each of the last --confirm-rounds"
        ),
    )
    pair_companion: int | None = field(
        default=2,
        metadata=_help(
            "--confirm-pairs: a lone leaf proposed with every member of a cluster that grows by pair votes in each "
            "of the last this many rounds joins it too (left alone, its group's shared model holds it apart); "
            "unset: never"
        ),
    )
    lone_pull: float | None = field(
        default=0.25,
        metadata=_help(
            "a leaf alone joins the cluster its update prefers over every other cluster in force by a cosine above "
            "this (and pulls towards above 0.15) in --confirm-rounds consecutive rounds; unset: never"
        ),
    )

    def validate(self, population: bool = True) -> ClusterConfig:
        super().validate(population)
        _check_choice("similarity_on", self.similarity_on, SIMILARITY_SOURCES)
        if not (math.isfinite(self.min_silhouette) and 0.0 <= self.min_silhouette < 1.0):
            raise ConfigError("min_silhouette", f"{self.min_silhouette} is outside the allowed range [0, 1)")
        _check_min("confirm_rounds", self.confirm_rounds, 1)
        _check_choice("agree_on", self.agree_on, ("drift", "updates"))
        if self.pair_window is not None and self.pair_window < self.confirm_rounds:
            raise ConfigError(
                "pair_window",
                f"{self.pair_window} is below --confirm-rounds ({self.confirm_rounds}); allowed: unset or an int >= it",
            )
        if self.pair_companion is not None:
            _check_min("pair_companion", self.pair_companion, 1)
        if self.resplit_silhouette is not None and not (
            math.isfinite(self.resplit_silhouette) and 0.0 <= self.resplit_silhouette < 1.0
        ):
            raise ConfigError("resplit_silhouette", f"{self.resplit_silhouette} is outside the allowed range [0, 1)")
        if self.lone_pull is not None and not (math.isfinite(self.lone_pull) and 0.0 <= self.lone_pull < 1.0):
            raise ConfigError("lone_pull", f"{self.lone_pull} is outside the allowed range [0, 1)")
        if self.tau is not None and not (math.isfinite(self.tau) and 0.0 <= self.tau <= 1.0):
            raise ConfigError("tau", f"{self.tau} is outside the allowed range [0, 1]")
        if self.gate_margin is not None and not math.isfinite(self.gate_margin):
            raise ConfigError("gate_margin", f"{self.gate_margin} is not allowed; it must be a finite number")
        return self


CLASS_PROPORTION_SOURCES = ("true", "estimated")


@dataclass
class FedReviveConfig(AsyncConfig):
    """FedRevive: FedBuff-style aggregation plus server-side data-free knowledge distillation (DFKD).

    Gate values count global versions. ``s_max`` unset means ``0.75 * K / B`` (at least 1), so KD
    engages at small concurrency too; the paper's value is 75 at K = 100, B = 1.
    """

    s_max: float | None = field(default=None, metadata=_help("staleness at which beta = 0.5; unset: 0.75*K/B"))
    freeze_version: int = field(default=50, metadata=_help("no DFKD before this global version"))
    warmup_version: int = field(default=100, metadata=_help("KD and the adversarial term only after this version"))
    generation_interval: int = field(default=1, metadata=_help("synthesise every N-th global version"))
    teacher_capacity: int = field(default=8, metadata=_help("teacher buffer: newest client models kept"))
    class_proportions: str = field(
        default="true",
        metadata=_help(f"client class proportions, one of {', '.join(CLASS_PROPORTION_SOURCES)} (Gaussian probes)"),
    )
    generator_width: int = field(default=128, metadata=_help("generator width (128 in the paper)"))
    synth_batch_size: int = field(default=64, metadata=_help("synthetic images per synthesis step"))
    kd_iterations: int = field(default=10, metadata=_help("KD steps per distillation"))
    kd_interval: int = field(
        default=1, metadata=_help("distil on one eligible arrival in N, reuse that KD delta between (1: paper)")
    )
    pool_capacity: int = field(default=16000, metadata=_help("synthetic image pool size (FIFO)"))
    distill_lag: int = field(
        default=0,
        metadata=_help(
            "synthesis and KD on a background thread, each reading version v and landing at v + N "
            "(kd-interval then counts versions); 0: inline on each arrival (paper)"
        ),
    )

    def validate(self, population: bool = True) -> FedReviveConfig:
        super().validate(population)
        _check_choice("class_proportions", self.class_proportions, CLASS_PROPORTION_SOURCES)
        if self.s_max is not None:
            _check_positive_finite("s_max", self.s_max)
        for name in ("freeze_version", "warmup_version"):
            _check_min(name, getattr(self, name), 0)
        for name in (
            "generation_interval",
            "teacher_capacity",
            "generator_width",
            "synth_batch_size",
            "kd_iterations",
            "kd_interval",
            "pool_capacity",
        ):
            _check_min(name, getattr(self, name), 1)
        _check_min("distill_lag", self.distill_lag, 0)
        return self
