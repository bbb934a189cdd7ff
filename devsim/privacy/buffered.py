"""DP-FedBuff: user-level DP for asynchronous buffered aggregation, the server's side (docs/privacy.md).

Each device's update is clipped to L2 norm ``S`` on its leaf (:class:`~devsim.privacy.device.DevicePrivacy`), every
applied buffer of exactly B updates gets Gaussian noise of standard deviation ``z * S`` on its sum (added by the
server, or as B shares of ``z * S / sqrt(B)``, one on each update its leaf forwards), FedBuff divides by B, and the
accountant composes one event per applied version. A buffer holds at most one update per device: a second update of
a device already in the buffer is dropped (a choice of the seeded scheduler, not of any data), so one device's
contribution to a version's sum stays within ``S``.
"""

from __future__ import annotations

import math

import numpy as np

from devsim.privacy.accountant import RunAccountant
from devsim.privacy.plan import PrivacyPlan, make_event
from devsim.privacy.server import PrivateAggregator

Weights = dict[str, np.ndarray]


class BufferedPrivacy:
    """The mechanism of one DP-FedBuff run: what each job applies on its leaf, the buffer's noise, the one-update-
    per-device rule and the accountant (its state goes into the run's checkpoint)."""

    def __init__(self, plan: PrivacyPlan, seed: int, global_lr: float = 1.0):
        if plan.sampling != "buffer":
            raise ValueError(f"DP-FedBuff accounts buffers (sampling 'buffer'), not {plan.sampling!r}")
        self.plan = plan
        self.aggregator = PrivateAggregator(plan, seed, plan.expected, global_lr, share="update")
        if self.aggregator.leaf_accountant is not None:
            # leaf placement: the server sees each update with its share and knows which device sent it, so one
            # update alone is accounted as local DP with z / sqrt(B) (no sampling amplification), once per version
            share_z = plan.noise_multiplier / math.sqrt(plan.expected)
            event = make_event("local", plan.sampling, share_z, plan.rate, plan.population, plan.expected)
            self.aggregator.leaf_accountant = RunAccountant(event, plan.delta, plan.accountant, replace_one=True)
        self.buffer_devices: set[int] = set()
        """Devices with an update in the buffer being filled (at most B)."""
        self.last: dict = {}
        """Record fields (``dp_*``) of the latest applied version."""
        self.stopped: str | None = None
        """Why ``--dp-budget`` stopped the run, once it has."""

    def job_privacy(self) -> dict[str, float]:
        """What a leaf applies to each update before forwarding it (``LeafNode.train_jobs``'s ``dp``): the clip norm
        and the noise std (local DP: ``z * S``; leaf placement: ``z * S / sqrt(B)``; server placement: 0)."""
        device = self.aggregator.device_privacy()
        return {"clip": device.clip, "noise_std": device.local_noise_std or self.aggregator.leaf_noise_std()}

    def repeats(self, device_id: int) -> bool:
        """Whether ``device_id`` already has an update in the buffer being filled (its new one is then dropped)."""
        return device_id in self.buffer_devices

    def accepted(self, device_id: int) -> None:
        """An update of ``device_id`` entered the buffer."""
        self.buffer_devices.add(int(device_id))

    def over_budget(self, budget: float | None, version: int) -> str | None:
        """The message that stops the run when applying ``version`` would take epsilon above ``budget``, else None."""
        after = self.aggregator.would_exceed(budget)
        if after is None:
            return None
        self.stopped = (
            f"stopped before version {version}: its epsilon {after:.4g} would exceed --dp-budget {budget:g} "
            f"(epsilon after {version - 1} versions: {self.aggregator.accountant.epsilon:.4g})"
        )
        return self.stopped

    def noise(self, version: int, shapes: dict[str, tuple[int, ...]]) -> Weights | None:
        """The server's noise on the sum of the buffer that makes ``version`` (None: the leaves added it)."""
        return self.aggregator.buffer_noise(version, shapes)

    def applied(self) -> dict:
        """A version was applied: account it, start a new buffer; returns its record fields (``dp_epsilon``...)."""
        self.buffer_devices.clear()
        self.last = self.aggregator.account()
        return self.last

    def summary(self) -> dict:
        """The results summary's ``dp_*`` fields."""
        accountant = self.aggregator.accountant
        return {
            "dp_epsilon": accountant.epsilon,
            "dp_delta": self.plan.delta,
            "dp_noise_multiplier": self.plan.noise_multiplier,
            "dp_rounds_accounted": accountant.rounds,
            "dp_stopped": self.stopped,
        }

    def state(self) -> dict:
        """What a checkpoint keeps: the accountant's state and the devices in the buffer being filled."""
        return {**self.aggregator.state(), "buffer_devices": sorted(self.buffer_devices), "last": dict(self.last)}

    def load_state(self, state: dict) -> None:
        """Restore :meth:`state` (``--resume``)."""
        self.aggregator.load_state(state)
        self.buffer_devices = {int(d) for d in state["buffer_devices"]}
        self.last = dict(state["last"])

    def describe(self) -> str:
        """One line: the mechanism."""
        return self.aggregator.describe().replace("DP ", "DP-FedBuff ", 1)

    def noise_note(self, num_params: int) -> str:
        """How loud the noise on each applied version is (:meth:`PrivateAggregator.noise_note`)."""
        return self.aggregator.noise_note(num_params)
