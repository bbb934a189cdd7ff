"""Constants of FedRevive's server-side data-free knowledge distillation, with the paper's defaults."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from torch import nn

from devsim.aggregation.fedrevive.inputs import is_image_shape
from devsim.data.datasets import CIFAR10_MEAN, CIFAR10_STD

__all__ = ["TEACHER_BATCHING", "DFKDConfig", "ReviverConfig"]

TEACHER_BATCHING = ("off", "synthesis", "all")


@dataclass
class DFKDConfig:
    """Synthesis (generator, pool) and distillation (KD) settings.

    Inputs: ``input_shape`` of one model input (default ``(3, 32, 32)``). An image ``(C, H, W)`` with H and W
    multiples of 4 (:func:`~devsim.aggregation.fedrevive.inputs.is_image_shape`, :attr:`image`) gets the conv
    generator and crop / flip augmentation; any other shape the MLP generator. ``task_generator`` (a task's
    ``generator(latent_dim, num_classes)`` hook) replaces both: its module's outputs are model inputs as they
    are (stored float32 unclamped, never augmented or normalised).

    Generator: ``latent_dim`` (256), ``generator_width`` (128: channels 256 / 128 in the two conv stages, or
    hidden units 256 in the MLP), ``embedding_weight`` (0.2), for ``num_classes`` classes.

    Synthesis (per call): ``synth_batch_size`` (64) images, ``synth_steps`` (K_synth = 2) Adam steps with
    ``generator_lr`` (3e-3) on the generator copy and ``latent_lr`` (1e-3) on the latents and class embedding;
    loss ``feat_weight * L_feat + ce_weight * L_ce + adv_weight * L_adv`` (0.003, 1.0, 0.1); Reptile meta-update
    through Adam with ``meta_lr`` (3e-3). All Adam optimizers use ``adam_betas`` (0.5, 0.999).

    Pool: ``pool_capacity`` (16,000) generator outputs on the (0, 1) scale kept FIFO, stored as ``pool_dtype``
    ("float16": 98 MB at full capacity for 3x32x32; "float32" doubles that, "uint8" halves it with 1/255
    quantisation; a ``task_generator``'s outputs are always float32).

    Augmentation (synthesis and KD): for images, random crop after ``augment_padding`` (4) pixels of reflect
    padding and horizontal flip with probability 0.5; then ``(x - normalize_mean) / normalize_std``, per channel
    (``C`` values) or per element (``prod(input_shape)`` values): the affine map from the generator's (0, 1)
    outputs to model inputs (CIFAR-10 statistics by default; must match how the clients normalise their
    inputs). ``kd_augment`` toggles crop / flip for KD inputs (normalisation always applies).

    KD (per call): ``kd_iterations`` (K_KD = 10) Adam steps with ``kd_lr`` (1e-4) and L2 ``kd_weight_decay``
    (1e-5); each teacher draws ``kd_batch_per_teacher`` (32) pool images sampled by its ``q``; KL at
    ``kd_temperature`` (1).

    ``teacher_batching`` picks where the teacher buffer runs as one vectorised ensemble
    (:class:`devsim.aggregation.fedrevive.ensemble.TeacherEnsemble`) instead of a loop over teachers (same values
    within float tolerance): "synthesis" (default: all teachers see the same batch, and the vmapped forward and
    backward measured faster on CPU), "all" (KD too, where each teacher has its own batch: grouped convolutions,
    measured slower than the loop on a 2-core CPU for the CNN), or "off".
    """

    num_classes: int = 10
    input_shape: tuple[int, ...] = (3, 32, 32)
    latent_dim: int = 256
    generator_width: int = 128
    embedding_weight: float = 0.2
    synth_batch_size: int = 64
    synth_steps: int = 2
    generator_lr: float = 3e-3
    latent_lr: float = 1e-3
    meta_lr: float = 3e-3
    adam_betas: tuple[float, float] = (0.5, 0.999)
    feat_weight: float = 0.003
    ce_weight: float = 1.0
    adv_weight: float = 0.1
    pool_capacity: int = 16_000
    pool_dtype: str = "float16"
    augment_padding: int = 4
    normalize_mean: tuple[float, ...] = CIFAR10_MEAN
    normalize_std: tuple[float, ...] = CIFAR10_STD
    kd_augment: bool = True
    kd_lr: float = 1e-4
    kd_weight_decay: float = 1e-5
    kd_iterations: int = 10
    kd_batch_per_teacher: int = 32
    kd_temperature: float = 1.0
    teacher_batching: str = "synthesis"
    task_generator: Callable[[int, int], nn.Module] | None = field(default=None, repr=False)

    @property
    def image(self) -> bool:
        """The conv generator and crop / flip augmentation apply (image inputs, no task generator)."""
        return self.task_generator is None and is_image_shape(self.input_shape)

    def __post_init__(self) -> None:
        self.input_shape = tuple(int(side) for side in self.input_shape)
        if not self.input_shape or min(self.input_shape) < 1:
            raise ValueError(f"input_shape must be a non-empty tuple of sizes >= 1, got {self.input_shape}")
        positive_ints = ("num_classes", "latent_dim", "generator_width", "synth_batch_size")
        positive_ints += ("synth_steps", "pool_capacity", "kd_batch_per_teacher")
        for name in positive_ints:
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.kd_iterations < 0 or self.augment_padding < 0:
            raise ValueError("kd_iterations and augment_padding must be >= 0")
        if self.image and self.augment_padding >= min(self.input_shape[1:]):
            raise ValueError("augment_padding must be smaller than the image height and width (reflect padding)")
        if self.teacher_batching not in TEACHER_BATCHING:
            raise ValueError(f"teacher_batching must be one of {TEACHER_BATCHING}, got {self.teacher_batching!r}")
        if self.pool_dtype not in ("float16", "float32", "uint8"):
            raise ValueError(f"pool_dtype must be float16, float32 or uint8, got {self.pool_dtype!r}")
        if self.task_generator is None:
            self._check_normalisation()
        if min(self.generator_lr, self.latent_lr, self.meta_lr, self.kd_temperature) <= 0 or self.kd_lr <= 0:
            raise ValueError("learning rates and kd_temperature must be > 0")

    def _check_normalisation(self) -> None:
        """``normalize_mean`` / ``normalize_std``: one value per channel or per element, finite, std > 0."""
        allowed = {self.input_shape[0], math.prod(self.input_shape)}
        if len(self.normalize_mean) not in allowed or len(self.normalize_std) != len(self.normalize_mean):
            raise ValueError(
                f"normalize_mean and normalize_std need one value per channel ({self.input_shape[0]}) or per "
                f"element ({math.prod(self.input_shape)}) of input_shape {self.input_shape}; got "
                f"{len(self.normalize_mean)} and {len(self.normalize_std)}"
            )
        values = (*self.normalize_mean, *self.normalize_std)
        if not all(math.isfinite(v) for v in values) or min(self.normalize_std) <= 0:
            raise ValueError("normalize_mean must be finite and normalize_std finite and > 0")


@dataclass
class ReviverConfig:
    """Gates and schedule around the DFKD machinery.

    ``s_max`` (75 versions; see :func:`devsim.aggregation.fedrevive.staleness.scaled_s_max` for small concurrency);
    synthesis and KD only when ``beta > 0`` and ``version >= freeze_version`` (50); synthesis when
    ``version % generation_interval == 0`` (T_gen, default 1: every eligible arrival); KD and the adversarial
    synthesis term only when ``version > warmup_version`` (100); ``teacher_capacity`` (8) newest client models.

    ``kd_interval`` (default 1, the paper: distil on every eligible arrival): distil afresh on one eligible arrival
    in ``kd_interval`` and blend the most recent ``delta_KD`` into the eligible arrivals between (each with its
    own ``beta``). The reused ``delta_KD`` is at most ``kd_interval - 1`` eligible arrivals old: it was distilled
    from a global model that many versions older and misses the newest teachers (docs/concepts.md, FedRevive).

    ``distill_lag`` (versions; default 0, inline): with N >= 1 synthesis and KD run in the background, once per
    version interval instead of per arrival: synthesis from every version ``v >= freeze_version`` with
    ``v % generation_interval == 0``, KD from every ``v > warmup_version`` with ``v % kd_interval == 0`` (here
    ``kd_interval`` counts versions), both reading ``w_v`` and the teachers of that moment; the result lands at
    version ``v + N``, from which stale arrivals blend it.
    """

    s_max: float = 75.0
    freeze_version: int = 50
    warmup_version: int = 100
    generation_interval: int = 1
    teacher_capacity: int = 8
    kd_interval: int = 1
    distill_lag: int = 0
    dfkd: DFKDConfig = field(default_factory=DFKDConfig)

    def __post_init__(self) -> None:
        if not self.s_max > 0:
            raise ValueError(f"s_max must be > 0, got {self.s_max}")
        if self.distill_lag < 0:
            raise ValueError(f"distill_lag must be >= 0 versions, got {self.distill_lag}")
        if self.generation_interval < 1 or self.teacher_capacity < 1 or self.kd_interval < 1:
            raise ValueError("generation_interval, teacher_capacity and kd_interval must be >= 1")
