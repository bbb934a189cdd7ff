"""The edge job's update screen: each device update is checked where a leaf sums it, before it reaches the model.

In NVFlare's edge hierarchy a leaf sums its devices' updates per model version (an ``Aggregator`` made by the
job's ``AggregatorFactory``) and reports the sums up to the server. A stock leaf adds whatever a device sent, so
one NaN update turned the global model into NaN. :class:`ScreenedUpdateAggregator` runs this project's
:class:`~devsim.aggregation.update_checks.UpdateValidator` on every device's update as it arrives: the model's
entry names and shapes, float32, finite, and the norm limits (``--max-update-norm``, ``--update-norm-factor``, the
latter as for asynchronous jobs: the accepted history's median or the last checked updates' lower median). A
rejected update adds nothing; its device still counts as reported, so versions keep coming (NVFlare's updater
requires every contribution to be accepted). Sums carry their rejections up (``rejected`` beside ``count``), and
the server's manager adds them up per version for the results. Every sum is kept in float64, so it is the same
whatever order the devices finish in (a FedAvg-mode edge run repeats bit for bit; float32 sums did not).
"""

from __future__ import annotations

import threading

import numpy as np
import torch
from nvflare.apis.dxo import DXO, DataKind, from_shareable
from nvflare.apis.fl_context import FLContext
from nvflare.apis.shareable import Shareable
from nvflare.edge.aggregators.model_update_dxo import ModelUpdateDXOAggregator
from nvflare.edge.updaters.emd import AggregatorFactory

from devsim.aggregation.update_checks import UpdateValidator
from devsim.codec import float_state_keys
from devsim.tasks import task_from_settings

PRINTED_PER_LEAF = 10
"""Rejections a leaf prints (the rest are counted: ``rejected_updates`` in the edge results)."""


class LeafScreen:
    """One leaf's check of its devices' updates, shared by the leaf's aggregators: an
    :class:`~devsim.aggregation.update_checks.UpdateValidator` built at the first device update from the task's
    model (``settings``: the processor settings; the leaf has loaded the task by then), so a relay, which only
    sums sums, never loads it. ``max_update_norm``: absolute limit on a device's delta norm (model-parameter
    units; None: none); ``update_norm_factor``: the adaptive limit's factor (> 1; None: none)."""

    def __init__(self, settings: dict, max_update_norm: float | None, update_norm_factor: float | None):
        self.settings = settings
        self.max_update_norm = max_update_norm
        self.update_norm_factor = update_norm_factor
        self.reference: dict[str, np.ndarray] | None = None
        """Float32 zeros of every entry of a device's update, once a device update was seen."""
        self._validator: UpdateValidator | None = None
        self._lock = threading.Lock()
        self._printed = 0

    def check(self, delta: object, num_samples: object, source: str, site: str) -> bool:
        """Whether a device's update may be added; a rejection is printed (the first :data:`PRINTED_PER_LEAF`)."""
        with self._lock:
            if self._validator is None:
                self.reference = model_zeros(self.settings)
                self._validator = UpdateValidator(
                    self.reference, max_norm=self.max_update_norm, max_norm_factor=self.update_norm_factor
                )
        rejection = self._validator.check_job_result(delta, num_samples, source)
        if rejection is None:
            return True
        with self._lock:
            self._printed += 1
            printed = self._printed
        if printed < PRINTED_PER_LEAF:
            print(f"[{site}] {rejection}", flush=True)
        elif printed == PRINTED_PER_LEAF:
            print(f"[{site}] {rejection} (further rejections are counted in rejected_updates, not printed)", flush=True)
        return False


class ScreenedUpdateAggregator(ModelUpdateDXOAggregator):
    """NVFlare's edge sum of model updates that leaves out the device updates ``screen`` rejects.

    A child's sum (from this class's :meth:`aggregate`: its data has ``rejected`` beside ``dict`` and ``count``)
    passes unchecked, since its parts were checked, and adds its ``rejected`` count; anything else is a device's
    update (this project's simulated devices or real ones) and goes through ``screen``. ``screen`` None checks
    nothing (the server's per-version sums). A sum of nothing reports the screen's zeros, or no dict at all when
    there is no screen: NVFlare's own aggregator refuses a missing dict, this one takes it as nothing.
    """

    def __init__(self, screen: LeafScreen | None = None):
        ModelUpdateDXOAggregator.__init__(self)
        self.screen = screen
        self.rejected = 0
        """Updates left out of this sum, those below it included."""

    def reset(self, fl_ctx: FLContext) -> None:
        ModelUpdateDXOAggregator.reset(self, fl_ctx)
        self.rejected = 0

    def accept(self, shareable: Shareable, fl_ctx: FLContext) -> bool:
        """Add an update (or a child's sum) unless it is a rejected device update; True either way (NVFlare's
        updater ends the job on False)."""
        dxo = from_shareable(shareable)
        data = dxo.data if isinstance(dxo.data, dict) else {}
        if "rejected" in data:  # a child's sum (this class's aggregate), whose parts were checked
            self.rejected += int(data.pop("rejected") or 0)
            if data.get("dict") is None and data.get("count") == 0:
                return True  # only rejected updates below
        else:  # a device's update
            delta = data.get("dict")
            if isinstance(delta, dict):  # NVFlare's list payloads arrive as lists
                delta = {k: np.asarray(v, dtype=np.float32) if isinstance(v, list) else v for k, v in delta.items()}
            if self.screen is not None:
                source = f"device {dxo.get_meta_prop('device', '?')}"
                num_samples = dxo.get_meta_prop("num_samples", 1)  # checked: finite and > 0
                if not self.screen.check(delta, num_samples, source, fl_ctx.get_identity_name() or "leaf"):
                    self.rejected += 1
                    return True
            if isinstance(delta, dict):  # summed in float64: the same sum in any order
                data["dict"] = {k: np.asarray(v, dtype=np.float64) for k, v in delta.items()}
        return ModelUpdateDXOAggregator.accept(self, dxo.to_shareable(), fl_ctx)

    def aggregate(self, fl_ctx: FLContext) -> Shareable:
        """The sum, its update count and the rejections below it (zeros, or no dict, when nothing was added)."""
        summed = self.dict
        if summed is None and self.screen is not None and self.screen.reference is not None:
            summed = {k: np.zeros_like(v) for k, v in self.screen.reference.items()}
        dxo = DXO(data_kind=DataKind.WEIGHT_DIFF, data={"dict": summed, "count": self.count, "rejected": self.rejected})
        self.reset(fl_ctx)
        return dxo.to_shareable()


class ScreenedUpdateAggrFactory(AggregatorFactory):
    """The leaves' (and relays') aggregator factory: every aggregator it makes shares one :class:`LeafScreen`
    (``settings``, ``max_update_norm``, ``update_norm_factor``: see there)."""

    def __init__(self, settings: dict, max_update_norm: float | None = None, update_norm_factor: float | None = 20.0):
        AggregatorFactory.__init__(self)
        # NVFlare's job export reads each constructor argument back from the attribute of the same name
        self.settings = dict(settings)
        self.max_update_norm = max_update_norm
        self.update_norm_factor = update_norm_factor
        self._screen = LeafScreen(self.settings, max_update_norm, update_norm_factor)

    def get_aggregator(self) -> ScreenedUpdateAggregator:
        return ScreenedUpdateAggregator(self._screen)


def model_zeros(settings: dict) -> dict[str, np.ndarray]:
    """Float32 zeros of every entry a device's update carries (the model's floating-point state), by name."""
    with torch.random.fork_rng(devices=[]):  # building a model draws from torch's global generator: put it back
        model = task_from_settings(settings).build_model()
    state = model.state_dict()
    return {k: np.zeros(tuple(state[k].shape), dtype=np.float32) for k in float_state_keys(model)}
