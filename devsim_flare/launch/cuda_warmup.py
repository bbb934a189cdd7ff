"""The job component that starts CUDA early in the server's and each leaf's process.

:class:`CudaWarmup` sits in the server's and every leaf's app configuration (:class:`devsim_flare.recipe.DevsimRecipe`
adds it). When NVFlare starts the job in a process (``START_RUN``, before the server waits for the leaves and before
a leaf's set-up), it starts :func:`devsim.resources.cuda_warmup.start_cuda_warmup` there: the CUDA context and
the cuBLAS and cuDNN handles are made on a background thread while NVFlare starts and connects the other
processes. Nothing happens without CUDA.
"""

from __future__ import annotations

from nvflare.apis.event_type import EventType
from nvflare.apis.fl_component import FLComponent
from nvflare.apis.fl_context import FLContext


class CudaWarmup(FLComponent):
    """Starts the CUDA warm-up of its process when the job starts there."""

    def handle_event(self, event_type: str, fl_ctx: FLContext) -> None:
        if event_type == EventType.START_RUN:
            from devsim.resources.cuda_warmup import start_cuda_warmup

            start_cuda_warmup()
