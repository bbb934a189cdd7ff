"""A faster device runner for NVFlare 2.9's edge leaves, configured as a component (no NVFlare patch).

NVFlare's stock ``TPORunner`` drives a ``Simulator`` that

- pauses a fixed 0.5 s after every selected device it dispatches, so a leaf starts at most two
  devices per second whatever its worker pool could train;
- polls for a selection once a second when it has nothing to do;
- deep-copies the task processor for every device it creates and for every selection poll.

:class:`FastEdgeRunner` replaces the runner widget on the leaf (same events, same edge requests to the
leaf's ``EdgeTaskReceiver``): every selected device is dispatched at once, an idle leaf polls with a
backoff from ``min_poll_interval`` to ``max_poll_interval``, and all devices share one task processor
(it must implement ``process_device_task(device_id, task)``, as
:class:`~processors.edge_task_processor.EdgeTaskProcessor` does). The worker pool is sized
with :func:`devsim.resources.workers.plan_workers` (CPU cores, or free VRAM on a GPU) unless ``num_workers`` is
given.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from nvflare.apis.event_type import EventType
from nvflare.apis.fl_constant import FLContextKey
from nvflare.apis.fl_context import FLContext
from nvflare.apis.job_def import JobMetaKey
from nvflare.edge.constants import CookieKey, EdgeApiStatus, SpecialDeviceId
from nvflare.edge.simulation.simulated_device import DeviceFactory, DeviceState, SimulatedDevice
from nvflare.edge.simulation.simulator import Simulator
from nvflare.edge.web.models.device_info import DeviceInfo
from nvflare.edge.web.models.task_response import TaskResponse
from nvflare.edge.web.models.user_info import UserInfo
from nvflare.edge.widgets.runner import SimulationRunner

from devsim.resources.workers import plan_workers
from devsim_flare.edge.selection import leaf_device_prefix, leaf_index_of

DEFAULT_MIN_POLL_S = 0.02
DEFAULT_MAX_POLL_S = 0.5


class SharedProcessorDevice(SimulatedDevice):
    """A simulated device that hands its tasks to a processor shared by every device of the leaf."""

    def __init__(self, device_id: str, processor: Any):
        SimulatedDevice.__init__(self, device_id)
        self.processor = processor
        self._device_info = DeviceInfo(device_id, "devsim", "1.0")
        self._user_info = UserInfo(device_id, "devsim")

    def get_device_info(self) -> DeviceInfo:
        return self._device_info

    def get_user_info(self) -> UserInfo:
        return self._user_info

    def do_task(self, task: TaskResponse) -> dict:
        return self.processor.process_device_task(self.device_id, task)


class SharedProcessorFactory(DeviceFactory):
    """Creates :class:`SharedProcessorDevice` objects around one processor (no copies)."""

    def __init__(self, processor: Any):
        if not callable(getattr(processor, "process_device_task", None)):
            raise TypeError(
                f"the fast edge runner needs a processor with process_device_task(device_id, task); "
                f"{type(processor).__name__} has none (use runner='stock' for other processors)"
            )
        self.processor = processor

    def make_device(self, device_id: str) -> SimulatedDevice:
        return SharedProcessorDevice(device_id, self.processor)

    def shutdown(self) -> None:
        self.processor.shutdown()


def summarise_arrays_in_this_thread() -> None:
    """Print NumPy arrays as one item per axis edge, in the calling thread only.

    NVFlare's edge code builds debug messages with f-strings that format whole requests and replies
    (the global model with every task, the delta with every result) even when debug logging is off:
    about 60 ms per device for the 62k-parameter CNN, twice its training time. NumPy's print options
    are context-local, so setting them in the simulator's own threads makes that formatting cheap
    without changing how anything else in the process prints arrays.
    """
    np.set_printoptions(threshold=0, edgeitems=1)


class FastDeviceSimulator(Simulator):
    """NVFlare's edge ``Simulator`` with immediate dispatch and a backoff poll instead of fixed pauses.

    Args:
        min_poll_interval, max_poll_interval: seconds between selection polls while the leaf has no new
            device to start; the interval doubles from the minimum after each empty poll and resets when
            a device starts.
        device_id_prefix: stable prefix of this leaf's device ids
            (:func:`devsim_flare.edge.selection.leaf_device_prefix`); None keeps NVFlare's per-run UUID.
        Other arguments as NVFlare's ``Simulator``.
    """

    def __init__(
        self,
        *args,
        min_poll_interval: float = DEFAULT_MIN_POLL_S,
        max_poll_interval: float = DEFAULT_MAX_POLL_S,
        device_id_prefix: str | None = None,
        **kwargs,
    ):
        Simulator.__init__(self, *args, **kwargs)
        if device_id_prefix is not None:
            self.device_id_prefix = device_id_prefix
        self.worker_pool.shutdown(wait=False)  # no thread started yet: replace it to set the initializer
        self.worker_pool = ThreadPoolExecutor(self.num_workers, initializer=summarise_arrays_in_this_thread)
        self.min_poll_interval = float(min_poll_interval)
        self.max_poll_interval = float(max_poll_interval)
        self.dispatched = 0

    def _wait_for_job(self):
        """The edge job's ``JobResponse``, or None when none comes within ``get_job_timeout`` seconds."""
        device = self.device_factory.make_device(SpecialDeviceId.DUMMY)
        deadline = time.monotonic() + self.get_job_timeout
        interval = self.min_poll_interval
        while not self.done:
            resp = self._ask_for_job(device)
            if resp and resp.status == EdgeApiStatus.OK:
                return resp
            if resp and resp.status not in (EdgeApiStatus.RETRY, EdgeApiStatus.NO_JOB):
                self.logger.info(f"no edge job: status {resp.status}")
                return None
            if time.monotonic() > deadline:
                self.logger.info(f"no edge job within {self.get_job_timeout} s - device runner exits")
                return None
            time.sleep(interval)
            interval = min(self.max_poll_interval, interval * 2)
        return None

    def _start_device(self, job, did: str, sid) -> bool | None:
        """Ask the leaf for ``did``'s task and queue its training.

        Returns True when the device started, None when it did not (retry later, or done), False
        when the job is over.
        """
        device = self.all_devices.get(did) or self._make_new_device(did)
        device.set_job(job_id=job.job_id, job_name=job.job_name, job_data=job.job_data, method=job.method)
        resp = self._ask_for_task(device)
        if resp.status == EdgeApiStatus.OK:
            device.state = DeviceState.LEARNING
            device.cookie = resp.cookie
            if isinstance(resp.cookie, dict):
                sid = resp.cookie.get(CookieKey.DEVICE_SELECTION_ID, sid)
            with self.update_lock:
                self.busy_devices[did] = sid
            self.worker_pool.submit(self._do_learn, task_data=resp, device=device, selection_id=sid)
            self.dispatched += 1
            return True
        if resp.status == EdgeApiStatus.DONE:
            device.job_id = None
            return None
        if resp.status == EdgeApiStatus.RETRY:
            return None
        self.logger.info(f"device runner stops: task response status {resp.status}")
        return False

    def _control_flow(self):
        summarise_arrays_in_this_thread()
        job = self._wait_for_job()
        if job is None:
            return
        range_id = f"{self.device_id_prefix}{SpecialDeviceId.MAX_INDICATOR}{self.num_devices}"
        interval = self.min_poll_interval
        while not self.done:
            resp = self._ask_for_selection(job.job_id, range_id)
            mine = {}
            if resp:
                if resp.status == EdgeApiStatus.NO_JOB:
                    self.logger.info(f"job {job.job_id} is gone - device runner exits")
                    return
                if resp.status == EdgeApiStatus.OK:
                    range_id = SpecialDeviceId.DUMMY
                if isinstance(resp.selection, dict) and resp.selection:
                    with self.update_lock:
                        mine = self._determine_my_devices(resp.selection)
            started = 0
            for did, sid in mine.items():
                outcome = False if self.done else self._start_device(job, did, sid)
                if outcome is False:
                    return
                started += outcome is True
            if started:
                interval = self.min_poll_interval
                continue
            time.sleep(interval)
            interval = min(self.max_poll_interval, interval * 2)


class FastEdgeRunner(SimulationRunner):
    """Leaf widget that simulates this leaf's devices with :class:`FastDeviceSimulator`.

    Args:
        task_processor_id: id of the leaf's task processor component (shared by all devices).
        num_devices: simulated devices on this leaf.
        num_workers: training threads; None sizes the pool with :func:`devsim.resources.workers.plan_workers`.
        leaves_on_host: leaf processes sharing this host's cores (for the automatic sizing).
        job_timeout: seconds to wait for the edge job to appear on this leaf.
        min_poll_interval, max_poll_interval: see :class:`FastDeviceSimulator`.
    """

    def __init__(
        self,
        task_processor_id: str,
        num_devices: int = 1000,
        num_workers: int | None = None,
        leaves_on_host: int = 1,
        job_timeout: float = 60.0,
        min_poll_interval: float = DEFAULT_MIN_POLL_S,
        max_poll_interval: float = DEFAULT_MAX_POLL_S,
    ):
        SimulationRunner.__init__(self)
        if num_workers is not None and int(num_workers) < 1:
            raise ValueError(f"num_workers must be >= 1 or None (automatic), got {num_workers}")
        if not 0 < min_poll_interval <= max_poll_interval:
            raise ValueError("poll intervals must satisfy 0 < min_poll_interval <= max_poll_interval")
        self.task_processor_id = task_processor_id
        self.num_devices = int(num_devices)
        self.num_workers = num_workers
        self.leaves_on_host = int(leaves_on_host)
        self.job_timeout = float(job_timeout)
        self.min_poll_interval = float(min_poll_interval)
        self.max_poll_interval = float(max_poll_interval)
        self.processor = None
        self.register_event_handler(EventType.ABOUT_TO_START_RUN, self._find_processor)

    def _find_processor(self, event_type: str, fl_ctx: FLContext):
        processor = fl_ctx.get_engine().get_component(self.task_processor_id)
        if processor is None:
            raise ValueError(f"no component {self.task_processor_id!r} for the fast edge runner")
        if hasattr(processor, "leaf_index"):
            processor.leaf_index = leaf_index_of(fl_ctx.get_identity_name())
        self.processor = processor

    def _worker_count(self, fl_ctx: FLContext) -> int:
        describe = getattr(self.processor, "describe_compute", None)
        device, num_params, batch_size = describe() if callable(describe) else ("cpu", 1, 1)
        plan = plan_workers(
            device=device,
            num_params=num_params,
            batch_size=batch_size,
            leaves_on_host=self.leaves_on_host,
            override=self.num_workers,
        )
        import torch

        torch.set_num_threads(plan.threads_per_worker)
        self.log_info(fl_ctx, f"fast edge runner: {self.num_devices} devices; {plan.reason}")
        return plan.num_workers

    def create_simulator(self, fl_ctx: FLContext) -> FastDeviceSimulator:
        job_name = fl_ctx.get_prop(FLContextKey.JOB_META).get(JobMetaKey.JOB_NAME)
        return FastDeviceSimulator(
            job_name=job_name,
            device_factory=SharedProcessorFactory(self.processor),
            num_devices=self.num_devices,
            num_workers=self._worker_count(fl_ctx),
            get_job_timeout=self.job_timeout,
            min_poll_interval=self.min_poll_interval,
            max_poll_interval=self.max_poll_interval,
            device_id_prefix=leaf_device_prefix(fl_ctx.get_identity_name()),
        )


__all__ = ["FastDeviceSimulator", "FastEdgeRunner", "SharedProcessorDevice", "SharedProcessorFactory"]
