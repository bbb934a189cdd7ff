"""FedRevive's SYNTHESIZE step: a meta-learned conditional generator that feeds a FIFO pool of synthetic inputs."""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from torch import nn
from torch.nn import functional as F
from torch.profiler import record_function

from devsim.aggregation.fedrevive._common import (
    TeacherModel,
    adam,
    check_abandoned,
    class_weight_matrix,
    frozen,
    kl_per_sample,
    proportions_tensor,
)
from devsim.aggregation.fedrevive.config import DFKDConfig
from devsim.aggregation.fedrevive.ensemble import TeacherEnsemble, loop_forward, stacked_running_stats
from devsim.aggregation.fedrevive.generator import build_generator
from devsim.aggregation.fedrevive.inputs import augment_inputs
from devsim.aggregation.fedrevive.pool import SyntheticPool

__all__ = ["Synthesizer"]


class Synthesizer:
    """Persistent generator ``G``, its Reptile meta-optimizer and the synthetic input pool.

    ``G`` is :func:`~devsim.aggregation.fedrevive.generator.build_generator`'s for ``config``: the conv generator
    for images, the MLP for other input shapes, or the task's generator (whose outputs are model inputs: the
    pool keeps them float32 and unclamped, and they are never augmented). Each :meth:`synthesize` call draws one
    batch of labels and latents, adapts a copy ``G'`` of ``G`` for ``config.synth_steps`` Adam steps, keeps the
    lowest-loss batch in the pool and moves ``G`` towards ``G'``. All random draws (labels, latents,
    augmentation) come from a CPU ``torch.Generator`` seeded with ``seed``.
    """

    def __init__(self, config: DFKDConfig | None = None, device: torch.device | str = "cpu", seed: int = 0) -> None:
        self.config = config if config is not None else DFKDConfig()
        cfg = self.config
        self.device = torch.device(device)
        self.generator = build_generator(cfg).to(self.device)
        self._meta_optimizer: torch.optim.Adam | None = None
        raw = cfg.task_generator is not None
        self.pool = SyntheticPool(
            capacity=cfg.pool_capacity,
            item_shape=None if raw else cfg.input_shape,
            dtype="float32" if raw else cfg.pool_dtype,
            device=self.device,
            clamp=not raw,
        )
        self.rng = torch.Generator().manual_seed(seed)
        self.mean = torch.tensor(cfg.normalize_mean, dtype=torch.float32, device=self.device)
        self.std = torch.tensor(cfg.normalize_std, dtype=torch.float32, device=self.device)
        self.calls = 0

    @property
    def meta_optimizer(self) -> torch.optim.Adam:
        """The generator's Reptile meta-optimizer, built on first use: PyTorch imports its compiler stack
        (``torch._dynamo``, seconds on a busy CPU) with the first optimizer of a process, so a server that
        synthesises on a background thread builds it there (:meth:`prepare`), off the start of its run."""
        if self._meta_optimizer is None:
            cfg = self.config
            self._meta_optimizer = adam(self.generator.parameters(), self.device, lr=cfg.meta_lr, betas=cfg.adam_betas)
        return self._meta_optimizer

    def prepare(self) -> None:
        """Build the meta-optimizer now (it draws no random numbers, so when does not change any result)."""
        _ = self.meta_optimizer

    def augment(self, outputs: torch.Tensor, crop_flip: bool = True) -> torch.Tensor:
        """Model inputs for generator outputs ``(B, *input_shape)``: crop / flip (images, when ``crop_flip``) and
        the affine map from the (0, 1) scale, as the clients normalise; a task generator's outputs as they are."""
        if self.config.task_generator is not None:
            return outputs
        crop_flip = crop_flip and self.config.image
        return augment_inputs(outputs, self.mean, self.std, self.config.augment_padding, self.rng, crop_flip)

    def _loss(
        self,
        inputs: torch.Tensor,
        labels: torch.Tensor,
        teachers: Sequence[nn.Module],
        ensemble: TeacherEnsemble | None,
        sample_weights: torch.Tensor,
        student: nn.Module | None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Weighted synthesis loss on model inputs ``(B, *input_shape)``; ``sample_weights`` is ``(T, B)``.

        Teachers run as one vectorised ``ensemble`` when given, else one by one (same values within float
        tolerance). Per teacher ``t`` with total weight > 0: ``L_feat += mean(w_t) * sum_layers(|mu_t - r_t| +
        |var_t - s_t|)`` with ``w_t``-weighted batch statistics; ``L_ce += mean(w_t * CE)``; ``L_adv -=
        mean(w_t * agree * KL(teacher || student))``.
        """
        cfg = self.config
        if ensemble is not None:
            logits, moments = ensemble.forward(inputs, shared=True, capture=True)
            running_means, running_vars = ensemble.running_means, ensemble.running_vars
        else:
            logits, moments = loop_forward(teachers, inputs, shared=True, capture=True)
            running_means, running_vars = stacked_running_stats(teachers)
        num_teachers, batch = sample_weights.shape
        totals = sample_weights.sum(dim=1)
        feat = inputs.new_zeros(())
        if moments:
            weights = (sample_weights / totals.clamp_min(torch.finfo(totals.dtype).tiny)[:, None]).to(inputs.dtype)
            layer_losses = inputs.new_zeros(num_teachers)
            for (sample_mean, sample_sq_mean), running_mean, running_var in zip(
                moments, running_means, running_vars, strict=True
            ):
                mean = torch.einsum("tb,tbc->tc", weights, sample_mean)
                var = (torch.einsum("tb,tbc->tc", weights, sample_sq_mean) - mean.square()).clamp_min(0.0)
                layer_losses = layer_losses + torch.linalg.vector_norm(mean - running_mean, dim=1)
                layer_losses = layer_losses + torch.linalg.vector_norm(var - running_var, dim=1)
            feat = torch.where(totals > 0, sample_weights.mean(dim=1) * layer_losses, 0.0).sum()
        flat_logits = logits.reshape(num_teachers * batch, -1)
        ce_each = F.cross_entropy(flat_logits, labels.repeat(num_teachers), reduction="none").view(num_teachers, batch)
        ce = (sample_weights * ce_each).mean(dim=1).sum()
        adv = inputs.new_zeros(())
        if student is not None:
            student_logits = student(inputs).unsqueeze(0).expand_as(logits)
            agree = (logits.argmax(dim=2) == student_logits.argmax(dim=2)).to(inputs.dtype)
            kl = kl_per_sample(flat_logits, student_logits.reshape(num_teachers * batch, -1)).view(num_teachers, batch)
            adv = -(sample_weights * agree * kl).mean(dim=1).sum()
        loss = cfg.feat_weight * feat + cfg.ce_weight * ce + cfg.adv_weight * adv
        parts = {"feat": feat.item(), "ce": ce.item(), "adv": adv.item()}
        return loss, parts

    def synthesize(
        self,
        teachers: Sequence[TeacherModel],
        student: nn.Module | None = None,
        warm: bool = False,
        ensemble: TeacherEnsemble | None = None,
        stop=None,
    ) -> dict[str, float]:
        """Run one synthesis round and push its best batch (``synth_batch_size`` inputs) into the pool.

        ``teachers``: ``(module, q)`` pairs; modules are used frozen in eval mode (modes and ``requires_grad``
        are restored). ``student``: the current global model, used for the adversarial term only when ``warm``.
        ``ensemble``: the same teachers stacked (built here unless ``config.teacher_batching`` is "off";
        used unless it is "off"). ``stop`` (a ``threading.Event``), once set, ends the round with
        :class:`~devsim.aggregation.fedrevive._common.WorkAbandoned` before its next inner step (the generator and the
        pool are then as before the round).
        Returns mean-over-inner-steps ``loss``, ``feat``, ``ce``, ``adv``, plus ``loss_first`` (loss of the
        meta-learned ``G`` before adaptation) and ``best_loss`` (the batch kept).
        """
        if not teachers:
            raise ValueError("synthesize needs at least one teacher")
        cfg = self.config
        modules = [module for module, _ in teachers]
        if cfg.teacher_batching == "off":
            ensemble = None
        elif ensemble is None:
            ensemble = TeacherEnsemble(modules)
        qs = proportions_tensor(teachers, self.device)
        if qs.shape[1] != cfg.num_classes:
            raise ValueError(f"teacher q has {qs.shape[1]} classes, config has {cfg.num_classes}")
        labels_cpu = torch.multinomial(qs.mean(dim=0).cpu(), cfg.synth_batch_size, replacement=True, generator=self.rng)
        labels = labels_cpu.to(self.device)
        sample_weights = class_weight_matrix(qs)[:, labels]
        z = torch.randn(cfg.synth_batch_size, cfg.latent_dim, generator=self.rng).to(self.device).requires_grad_(True)
        fast = copy.deepcopy(self.generator).train()
        optimizer = adam(_parameter_groups(fast, z, cfg), self.device, betas=cfg.adam_betas)
        adversary = student if warm and cfg.adv_weight != 0 else None
        frozen_modules = modules + ([adversary] if adversary is not None else [])
        history: list[dict[str, float]] = []
        best_loss, best_images = float("inf"), None
        with frozen(frozen_modules):
            for _ in range(cfg.synth_steps):
                check_abandoned(stop)  # before the generator, the pool and the meta-optimizer change
                with record_function("fedrevive.synth.generator"):
                    images = fast(z, labels)
                    inputs = self.augment(images)
                with record_function("fedrevive.synth.teachers_and_loss"):
                    loss, parts = self._loss(inputs, labels, modules, ensemble, sample_weights, adversary)
                value = loss.item()
                parts["loss"] = value
                history.append(parts)
                if value < best_loss or best_images is None:
                    best_loss, best_images = value, images.detach().clone()
                with record_function("fedrevive.synth.backward"):
                    optimizer.zero_grad(set_to_none=True)
                    loss.backward()
                with record_function("fedrevive.synth.optimizer"):
                    optimizer.step()
        with record_function("fedrevive.synth.optimizer"):
            self._meta_update(fast)
        self.pool.add(best_images, labels_cpu)
        self.calls += 1
        result = {key: sum(h[key] for h in history) / len(history) for key in ("loss", "feat", "ce", "adv")}
        result["loss_first"] = history[0]["loss"]
        result["best_loss"] = best_loss
        return result

    def _meta_update(self, fast: nn.Module) -> None:
        """Reptile: set ``G.grad = G - G'`` and step the meta-optimizer; copy ``G'``'s BatchNorm buffers into ``G``."""
        self.meta_optimizer.zero_grad(set_to_none=True)
        with torch.no_grad():
            for slow_param, fast_param in zip(self.generator.parameters(), fast.parameters(), strict=True):
                slow_param.grad = slow_param.detach() - fast_param.detach()
        self.meta_optimizer.step()
        self.meta_optimizer.zero_grad(set_to_none=True)
        with torch.no_grad():
            for slow_buffer, fast_buffer in zip(self.generator.buffers(), fast.buffers(), strict=True):
                slow_buffer.copy_(fast_buffer)

    def state_dict(self) -> dict:
        """Generator, meta-optimizer, pool, random-generator state and call counter."""
        return {
            "generator": self.generator.state_dict(),
            "meta_optimizer": self.meta_optimizer.state_dict(),
            "pool": self.pool.state_dict(),
            "rng": self.rng.get_state(),
            "calls": self.calls,
        }

    def load_state_dict(self, state: dict) -> None:
        """Restore from :meth:`state_dict` output."""
        self.generator.load_state_dict(state["generator"])
        self.meta_optimizer.load_state_dict(state["meta_optimizer"])
        self.pool.load_state_dict(state["pool"])
        self.rng.set_state(state["rng"])
        self.calls = int(state["calls"])


def _parameter_groups(generator: nn.Module, z: torch.Tensor, config: DFKDConfig) -> list[dict]:
    """Adam parameter groups of one synthesis round: the generator body at ``generator_lr``; the latents ``z``
    and the class embedding (built-in generators: ``embedding_parameters()``) at ``latent_lr``."""
    if hasattr(generator, "embedding_parameters") and hasattr(generator, "body_parameters"):
        body, embedding = list(generator.body_parameters()), list(generator.embedding_parameters())
    else:
        body, embedding = list(generator.parameters()), []
    groups = [{"params": [z, *embedding], "lr": config.latent_lr}]
    if body:
        groups.insert(0, {"params": body, "lr": config.generator_lr})
    return groups
