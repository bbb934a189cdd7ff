"""The server's side of user-level DP-FedAvg and DP-FedBuff: noise on the round's (the buffer's) sum, the fixed
denominator, adaptive clipping's noised count, and the accountant fed one event per applied round or version.

Sums run in float64 over the leaves in the order given (leaf-name order), so the result does not depend on which
leaf answered first; every noise draw is a pure function of ``(seed, round)`` (:mod:`devsim.privacy.noise`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from devsim.privacy.accountant import RunAccountant
from devsim.privacy.clipping import next_clip
from devsim.privacy.device import DevicePrivacy
from devsim.privacy.noise import gaussian_like
from devsim.privacy.plan import PrivacyPlan
from devsim.seeding import derive_rng

if TYPE_CHECKING:
    from devsim.aggregation.server_optimizers import ServerOptimizer

Weights = dict[str, np.ndarray]


@dataclass(frozen=True)
class LeafSum:
    """One leaf's contribution: the sum of its devices' clipped (noised, with leaf placement) updates, how many
    devices it holds and how many of them had norms within the clip norm (adaptive clipping)."""

    delta_sum: Weights
    devices: int
    below_clip: int = 0


class PrivateAggregator:
    """DP-FedAvg at the server: ``w <- w + global_lr * (sum_leaves + noise) / expected_devices``; with a
    ``server_optimizer`` (DP-FedAvgM, DP-FedAdam, ...) the noised mean ``(sum_leaves + noise) / expected_devices`` goes
    through it instead (post-processing of the noised sum: the guarantee is the same).

    ``num_leaves`` is L, the leaves that share the noise with ``noise_at == "leaves"``: each adds standard deviation
    ``z_sum * S / sqrt(L)``, and the server adds the shares of leaves whose sum did not arrive (none selected, lost,
    rejected), so the total variance is ``(z_sum * S)^2`` in every round. In an asynchronous run (DP-FedBuff) the
    shares are the B updates of a buffer (``num_leaves`` = B, ``share`` "update"): each leaf adds one share to each
    device update it forwards, and a buffer always holds B of them; :meth:`buffer_noise` and :meth:`account` replace
    :meth:`aggregate` there (FedBuff sums and divides by B).
    """

    def __init__(
        self,
        plan: PrivacyPlan,
        seed: int,
        num_leaves: int,
        global_lr: float = 1.0,
        share: str = "leaf_sum",
        server_optimizer: ServerOptimizer | None = None,
    ):
        if plan.target_quantile is not None and plan.noise_at == "leaves":
            raise ValueError("adaptive clipping counts at the server; use server noise placement")
        self.plan, self.seed, self.num_leaves, self.global_lr = plan, int(seed), int(num_leaves), float(global_lr)
        self.share = share
        self.server_optimizer = server_optimizer
        """Applies the noised mean when set (its state is its owner's: the strategy saves it)."""
        self.clip = plan.clip
        self.accountant = plan.new_accountant()
        self.leaf_accountant = None  # leaf placement: one share alone carries 1/L of the noise variance
        if plan.mode == "central" and plan.noise_at == "leaves" and self.num_leaves > 1:
            leaf_z = plan.noise_multiplier / math.sqrt(self.num_leaves)
            self.leaf_accountant = RunAccountant(plan.event(leaf_z), plan.delta, plan.accountant, plan.replace_one)

    def device_privacy(self) -> DevicePrivacy:
        """What each device applies this round: clip to the current S; local DP: noise std ``z * S``."""
        local = self.plan.noise_multiplier * self.clip if self.plan.mode == "local" else 0.0
        return DevicePrivacy(self.clip, local, self.seed)

    def leaf_noise_std(self) -> float:
        """The standard deviation each leaf adds to its own sum this round (0 unless noise is at the leaves)."""
        if self.plan.mode != "central" or self.plan.noise_at != "leaves":
            return 0.0
        return self.plan.sum_noise_multiplier * self.clip / math.sqrt(self.num_leaves)

    def server_noise_std(self, noised_leaves: int) -> float:
        """The standard deviation the server adds given ``noised_leaves`` leaf sums that carry their share."""
        if self.plan.mode != "central":
            return 0.0
        full = self.plan.sum_noise_multiplier * self.clip
        if self.plan.noise_at == "server":
            return full
        missing = max(self.num_leaves - noised_leaves, 0)
        return full * math.sqrt(missing / self.num_leaves)

    def would_exceed(self, budget: float | None) -> float | None:
        """Epsilon after one more round when it would exceed ``budget`` (None: within budget, or no budget)."""
        if budget is None:
            return None
        after = self.accountant.epsilon_at(self.accountant.rounds + 1)
        return after if after > budget else None

    def aggregate(self, round_num: int, global_weights: Weights, leaves: list[LeafSum]) -> tuple[Weights, dict]:
        """New global weights from this round's leaf sums, and the round record's ``dp_*`` fields."""
        plan, clip = self.plan, self.clip
        std = self.server_noise_std(len(leaves))
        shapes = {name: value.shape for name, value in global_weights.items()}
        noise = gaussian_like(shapes, std, self.seed, "dp-noise", round_num) if std else None
        scale = self.global_lr / plan.denominator
        new_weights: Weights = {}
        means: Weights = {}
        for name, value in global_weights.items():
            summed = np.zeros(value.shape, dtype=np.float64)
            for leaf in leaves:
                summed += leaf.delta_sum[name]
            if noise is not None:
                summed += noise[name]
            if self.server_optimizer is not None:
                means[name] = summed / plan.denominator
            else:
                new_weights[name] = (value + scale * summed).astype(np.float32)
        if self.server_optimizer is not None:
            new_weights = self.server_optimizer.apply(global_weights, means)
        devices = sum(leaf.devices for leaf in leaves)
        record = {"dp_devices": devices}
        if plan.target_quantile is not None:
            below = sum(leaf.below_clip for leaf in leaves)
            centred = below - devices / 2.0 + derive_rng(self.seed, "dp-count", round_num).normal(0.0, plan.count_noise)
            fraction = centred / plan.denominator + 0.5
            self.clip = next_clip(clip, fraction, plan.target_quantile, plan.clip_lr)
            record["dp_noised_fraction_below"] = float(fraction)
        return new_weights, {**self.account(clip), **record}

    def buffer_noise(self, version: int, shapes: dict[str, tuple[int, ...]]) -> Weights | None:
        """DP-FedBuff: the server's noise on the sum of the buffer that makes ``version`` (float32 per entry of
        ``shapes``; None when the leaves added every share or in local DP), a pure function of (seed, version)."""
        std = self.server_noise_std(self.num_leaves)
        return gaussian_like(shapes, std, self.seed, "dp-buffer-noise", version) if std else None

    def account(self, clip: float | None = None) -> dict:
        """Compose one more event (a round or version was applied); the record's ``dp_*`` fields: the clip norm
        ``clip`` (default: the current one), the sum's noise std, epsilon so far (and one share's alone)."""
        plan, clip = self.plan, self.clip if clip is None else clip
        record = {"dp_clip": clip, "dp_noise_std": plan.sum_noise_multiplier * clip if plan.mode == "central" else 0.0}
        if plan.mode == "local":
            record["dp_local_noise_std"] = plan.noise_multiplier * clip
        record["dp_epsilon"] = self.accountant.step()
        if self.leaf_accountant is not None:
            record[f"dp_epsilon_one_{self.share}"] = self.leaf_accountant.step()
        return record

    def state(self) -> dict:
        """What a checkpoint keeps: the accountant's state and the current clip norm."""
        state = {"accountant": self.accountant.state(), "clip": self.clip}
        if self.leaf_accountant is not None:
            state["leaf_accountant"] = self.leaf_accountant.state()
        return state

    def load_state(self, state: dict) -> None:
        """Restore :meth:`state` (``--resume``)."""
        self.accountant.load_state(state["accountant"])
        if self.leaf_accountant is not None:
            self.leaf_accountant.load_state(state["leaf_accountant"])
        self.clip = float(state["clip"])

    def noise_to_clip(self, num_params: int) -> float:
        """The norm of the noise on one applied mean update, over the clip norm ``S`` (which bounds the mean of the
        clipped updates): ``z_sum sqrt(d) / denominator`` for central noise, ``z sqrt(m d) / denominator`` when each
        of the ``m`` expected devices adds its own (local DP), for a model of ``d = num_params`` entries."""
        plan = self.plan
        if plan.mode == "local":
            return plan.noise_multiplier * math.sqrt(plan.expected * num_params) / plan.denominator
        return plan.sum_noise_multiplier * math.sqrt(num_params) / plan.denominator

    def noise_note(self, num_params: int) -> str:
        """One line on how loud the noise is against the updates it hides (:meth:`noise_to_clip`), with what would
        quieten it when it is louder than the largest possible mean update."""
        ratio = self.noise_to_clip(num_params)
        line = (
            f"DP noise on each applied mean update: norm about {ratio:.3g} x S ({num_params:,} parameters, "
            f"denominator {self.plan.denominator:g}); a mean of clipped updates has norm at most S"
        )
        if ratio > 1:
            line += (
                "; the noise is the louder, so the model learns only as far as many rounds average it out "
                "(more devices per aggregate, a larger epsilon or fewer rounds quieten it)"
            )
        return line

    def describe(self) -> str:
        """One line: the mechanism and what it costs."""
        plan = self.plan
        sampling = {
            "poisson": f"Poisson q={plan.rate:.4g}",
            "fixed": f"fixed {plan.expected}/{plan.population}",
            "buffer": f"buffers of {plan.expected} from {plan.population} idle devices",
        }[plan.sampling]
        where = f"noise at the {plan.noise_at}" if plan.mode == "central" else "noise on each device"
        clip = (
            f"adaptive S from {plan.clip:g} (quantile {plan.target_quantile:g})"
            if plan.target_quantile
            else f"S={plan.clip:g}"
        )
        step = f", then {self.server_optimizer.name}" if self.server_optimizer is not None else ""
        return (
            f"DP {plan.mode}: {clip}, z={plan.noise_multiplier:.4g}, {where}, {sampling}, denominator "
            f"{plan.denominator:g}{step}, delta={plan.delta:.3g}, {plan.accountant.upper()} accountant"
        )
