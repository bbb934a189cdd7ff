"""Aggregation settings: how the server combines updates, when it stops, which updates it refuses (the
``aggregation`` section), and the settings of the two methods built on it: cluster aggregation (``cluster``) and
FedRevive's distillation (``fedrevive``).

Fields are command-line flags (field ``global_lr`` is ``--global-lr``). :class:`AggregationSettings` is inherited
by every run configuration, :class:`BufferedAggregationSettings` (the B of the K/B/O scheduler, staleness and the
stopping versions) by the asynchronous ones, :class:`ClusterSettings` and :class:`FedReviveSettings` by their
methods' configurations. Units: norms are L2 norms of per-sample mean updates, times simulated seconds, FedRevive's
gate values count global versions, cosines and silhouettes lie in [0, 1].
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from devsim.aggregation.server_optimizers import BETA1, BETA2, SERVER_OPTIMIZERS, TAU
from devsim.config_errors import ConfigError
from devsim.sections import check_choice, check_fraction, check_min, check_positive_finite, meta

STALENESS_WEIGHTINGS = ("none", "polynomial")
SIMILARITY_SOURCES = (
    "model_drift",
    "layer_drift",
    "layer_updates",
    "last_layer_drift",
    "last_layer_weights",
    "last_layer_updates",
)
AGREE_ON = ("drift", "updates")
CLASS_PROPORTION_SOURCES = ("true", "estimated")


def _aggregation(text: str) -> dict[str, Any]:
    return meta("aggregation", text)


def _cluster(text: str) -> dict[str, Any]:
    return meta("cluster", text)


def _fedrevive(text: str) -> dict[str, Any]:
    return meta("fedrevive", text)


@dataclass
class AggregationSettings:
    """Rounds, the server learning rate, when a round or the run fails, and the update-norm checks."""

    num_rounds: int = field(
        default=20, metadata={"section": "aggregation", "help": "synchronous rounds", "sync_only": True}
    )
    global_lr: float = field(default=1.0, metadata=_aggregation("server learning rate applied to the mean delta"))
    server_optimizer: str = field(
        default="sgd",
        metadata=_aggregation(
            f"how the mean delta (a round's, or a full buffer's) moves the model, one of {', '.join(SERVER_OPTIMIZERS)}"
            " (sgd: plain --global-lr step; momentum: FedAvgM; adagrad / adam / yogi: Reddi et al.'s FedOpt, which "
            "want --global-lr near 0.01-0.1; with --dp it takes the noised mean); not with cluster aggregation"
        ),
    )
    server_momentum: float = field(
        default=BETA1, metadata=_aggregation("beta1 of --server-optimizer momentum, adagrad, adam and yogi")
    )
    server_beta2: float = field(default=BETA2, metadata=_aggregation("beta2 of --server-optimizer adam and yogi"))
    server_tau: float = field(
        default=TAU, metadata=_aggregation("adaptivity tau of --server-optimizer adagrad, adam and yogi")
    )
    min_devices_fraction: float = field(
        default=0.5,
        metadata=_aggregation(
            "a round fails unless this fraction of its selected devices answered (devices on leaves already lost "
            "count toward --min-leaves instead)"
        ),
    )
    min_leaves: int = field(default=1, metadata=_aggregation("the run stops when fewer leaves than this still answer"))
    max_update_norm: float | None = field(
        default=None, metadata=_aggregation("reject a device or leaf update whose mean delta L2 norm exceeds this")
    )
    max_update_ratio: float | None = field(
        default=10.0,
        metadata=_aggregation(
            "reject a device or leaf update whose L2 norm exceeds this times the global model's norm"
        ),
    )
    update_norm_factor: float | None = field(
        default=20.0,
        metadata=_aggregation(
            "also reject updates whose norm exceeds this times the median accepted norm (or, when larger, the lower "
            "median of the round's replies (sync) or of the last 100 checked jobs (async))"
        ),
    )

    def update_norm_limit(self, global_norm: float) -> float | None:
        """The absolute L2 limit on a (per-sample mean) update for a global model of norm ``global_norm``."""
        limits = [v for v in (self.max_update_norm,) if v is not None]
        if self.max_update_ratio is not None and global_norm > 0:
            limits.append(self.max_update_ratio * global_norm)
        return min(limits) if limits else None

    def refuse_server_optimizer(self, why: str) -> None:
        """Raise ConfigError unless ``server_optimizer`` is sgd: ``why`` says what the other optimizers do not
        support (e.g. "asynchronous jobs")."""
        if self.server_optimizer != "sgd":
            raise ConfigError(
                "server_optimizer", f"{self.server_optimizer!r} is not supported with {why}; allowed there: sgd"
            )

    def check_aggregation(self, population: bool = True) -> None:
        """Raise ConfigError naming the first bad aggregation flag (asynchronous runs have no rounds: 0 is allowed)."""
        check_min("num_rounds", self.num_rounds, 0 if hasattr(self, "buffer_size") else 1)
        check_positive_finite("global_lr", self.global_lr)
        check_choice("server_optimizer", self.server_optimizer, SERVER_OPTIMIZERS)
        check_fraction("server_momentum", self.server_momentum)
        check_fraction("server_beta2", self.server_beta2)
        check_positive_finite("server_tau", self.server_tau)
        check_fraction("min_devices_fraction", self.min_devices_fraction, closed=True)
        if not 1 <= self.min_leaves <= self.num_leaf_nodes:
            raise ConfigError("min_leaves", f"{self.min_leaves} is not allowed; allowed: 1..{self.num_leaf_nodes}")
        if self.max_update_norm is not None:
            check_positive_finite("max_update_norm", self.max_update_norm)
        if self.max_update_ratio is not None:
            check_positive_finite("max_update_ratio", self.max_update_ratio)
        if self.update_norm_factor is not None and not (
            math.isfinite(self.update_norm_factor) and self.update_norm_factor > 1
        ):
            raise ConfigError("update_norm_factor", f"{self.update_norm_factor} is not allowed; it must be > 1")


@dataclass
class BufferedAggregationSettings:
    """Asynchronous aggregation: a new global version every B accepted updates, weighted by staleness; the run stops
    at a version count or a simulated time."""

    buffer_size: int = field(default=2, metadata=_aggregation("B: accepted updates per new global version"))
    max_versions: int | None = field(default=100, metadata=_aggregation("stop after this many global versions"))
    max_sim_time: float | None = field(default=None, metadata=_aggregation("stop at this simulated time (seconds)"))
    staleness_weighting: str = field(
        default="none", metadata=_aggregation(f"FedBuff staleness weighting, one of {', '.join(STALENESS_WEIGHTINGS)}")
    )
    staleness_exponent: float = field(
        default=0.5, metadata=_aggregation("a in (1 + staleness)^-a for polynomial weighting")
    )

    def check_buffered_aggregation(self, population: bool = True) -> None:
        """Raise ConfigError naming the first bad buffer, staleness or stopping flag."""
        check_choice("staleness_weighting", self.staleness_weighting, STALENESS_WEIGHTINGS)
        check_min("buffer_size", self.buffer_size, 1)
        if self.max_versions is None and self.max_sim_time is None:
            raise ConfigError("max_versions", "set --max-versions or --max-sim-time (or both)")
        if self.max_versions is not None:
            check_min("max_versions", self.max_versions, 1)
        if self.max_sim_time is not None:
            check_positive_finite("max_sim_time", self.max_sim_time)
        if not (math.isfinite(self.staleness_exponent) and self.staleness_exponent >= 0):
            raise ConfigError("staleness_exponent", f"{self.staleness_exponent} is not allowed; it must be >= 0")


@dataclass
class ClusterSettings:
    """Cluster aggregation over leaf models at the server: what is compared, when a partition takes effect, and how
    leaves join or leave clusters (docs/concepts.md#cluster-aggregation)."""

    tau: float | None = field(
        default=None,
        metadata=_cluster(
            "link leaves whose absolute cosine similarity exceeds this; unset: chosen each round (silhouette)"
        ),
    )
    similarity_on: str = field(
        default="model_drift",
        metadata=_cluster(
            f"what is compared, one of {', '.join(SIMILARITY_SOURCES)} (drift: weights minus the initial model; "
            "model: all entries, layer: each layer normalised, last_layer: the classifier only)"
        ),
    )
    gate_margin: float | None = field(
        default=None,
        metadata=_cluster("accuracy gate: a leaf keeps its model when the cluster model is worse by more than this"),
    )
    min_silhouette: float = field(
        default=0.25,
        metadata=_cluster("unset --tau: a split is proposed when its mean silhouette reaches this, in [0, 1)"),
    )
    centre_similarity: bool = field(
        default=True,
        metadata=_cluster("unset --tau, drift sources: decide splits on cosines of drift minus the leaves' mean drift"),
    )
    confirm_rounds: int = field(
        default=3,
        metadata=_cluster("a new partition takes effect once proposed in this many consecutive rounds (1: at once)"),
    )
    resplit_silhouette: float | None = field(
        default=0.2,
        metadata=_cluster(
            "split a cluster of 3+ leaves again when its members' centred update cosines split with this "
            "silhouette in --confirm-rounds consecutive rounds; unset: never"
        ),
    )
    scale_entries: bool = field(
        default=True,
        metadata=_cluster(
            "centred cosines: scale each model entry by its spread across leaves first, so every entry counts "
            "by its number of values, not the size of its values"
        ),
    )
    agree_on: str = field(
        default="updates",
        metadata=_cluster(
            "one of drift, updates: unset --tau, drift sources, all leaves join at once when every pair's "
            "absolute cosine of this exceeds 0.5 (drift holds the shrink all leaves share, so it always does)"
        ),
    )
    confirm_pairs: bool = field(
        default=True,
        metadata=_cluster(
            "also join the pairs of leaves proposed together in each of the last --confirm-rounds rounds "
            "(a leaf that changes sides holds back only itself)"
        ),
    )
    pair_window: int | None = field(
        default=5,
        metadata=_cluster(
            "--confirm-pairs: join a pair proposed together in --confirm-rounds of the last this many rounds, "
            "counted across joins of other leaves (>= --confirm-rounds); unset: in each of the last --confirm-rounds"
        ),
    )
    pair_companion: int | None = field(
        default=2,
        metadata=_cluster(
            "--confirm-pairs: a lone leaf proposed with every member of a cluster that grows by pair votes in each "
            "of the last this many rounds joins it too (left alone, its group's shared model holds it apart); "
            "unset: never"
        ),
    )
    lone_pull: float | None = field(
        default=0.25,
        metadata=_cluster(
            "a leaf alone joins the cluster its update prefers over every other cluster in force by a cosine above "
            "this (and pulls towards above 0.15) in --confirm-rounds consecutive rounds; unset: never"
        ),
    )

    def check_cluster(self, population: bool = True) -> None:
        """Raise ConfigError naming the first bad cluster flag."""
        check_choice("similarity_on", self.similarity_on, SIMILARITY_SOURCES)
        check_fraction("min_silhouette", self.min_silhouette)
        check_min("confirm_rounds", self.confirm_rounds, 1)
        check_choice("agree_on", self.agree_on, AGREE_ON)
        if self.pair_window is not None and self.pair_window < self.confirm_rounds:
            raise ConfigError(
                "pair_window",
                f"{self.pair_window} is below --confirm-rounds ({self.confirm_rounds}); allowed: unset or an int >= it",
            )
        if self.pair_companion is not None:
            check_min("pair_companion", self.pair_companion, 1)
        for name in ("resplit_silhouette", "lone_pull"):
            if getattr(self, name) is not None:
                check_fraction(name, getattr(self, name))
        if self.tau is not None:
            check_fraction("tau", self.tau, closed=True)
        if self.gate_margin is not None and not math.isfinite(self.gate_margin):
            raise ConfigError("gate_margin", f"{self.gate_margin} is not allowed; it must be a finite number")


@dataclass
class FedReviveSettings:
    """FedRevive's server-side data-free knowledge distillation (DFKD): when it starts, how the generator, teachers
    and synthetic pool are sized, and how often it synthesises and distils.

    ``s_max`` unset means ``0.75 * K / B`` (at least 1), so KD engages at small concurrency too; the paper's value is
    75 at K = 100, B = 1.
    """

    s_max: float | None = field(default=None, metadata=_fedrevive("staleness at which beta = 0.5; unset: 0.75*K/B"))
    freeze_version: int = field(default=50, metadata=_fedrevive("no DFKD before this global version"))
    warmup_version: int = field(default=100, metadata=_fedrevive("KD and the adversarial term only after this version"))
    generation_interval: int = field(default=1, metadata=_fedrevive("synthesise every N-th global version"))
    teacher_capacity: int = field(default=8, metadata=_fedrevive("teacher buffer: newest client models kept"))
    class_proportions: str = field(
        default="true",
        metadata=_fedrevive(
            f"client class proportions, one of {', '.join(CLASS_PROPORTION_SOURCES)} (Gaussian probes)"
        ),
    )
    generator_width: int = field(default=128, metadata=_fedrevive("generator width (128 in the paper)"))
    synth_batch_size: int = field(default=64, metadata=_fedrevive("synthetic images per synthesis step"))
    kd_iterations: int = field(default=10, metadata=_fedrevive("KD steps per distillation"))
    kd_interval: int = field(
        default=1, metadata=_fedrevive("distil on one eligible arrival in N, reuse that KD delta between (1: paper)")
    )
    pool_capacity: int = field(default=16000, metadata=_fedrevive("synthetic image pool size (FIFO)"))
    distill_lag: int = field(
        default=0,
        metadata=_fedrevive(
            "synthesis and KD on a background thread, each reading version v and landing at v + N "
            "(kd-interval then counts versions); 0: inline on each arrival (paper)"
        ),
    )

    def check_fedrevive(self, population: bool = True) -> None:
        """Raise ConfigError naming the first bad FedRevive flag."""
        check_choice("class_proportions", self.class_proportions, CLASS_PROPORTION_SOURCES)
        if self.s_max is not None:
            check_positive_finite("s_max", self.s_max)
        for name in ("freeze_version", "warmup_version", "distill_lag"):
            check_min(name, getattr(self, name), 0)
        for name in (
            "generation_interval",
            "teacher_capacity",
            "generator_width",
            "synth_batch_size",
            "kd_iterations",
            "kd_interval",
            "pool_capacity",
        ):
            check_min(name, getattr(self, name), 1)
