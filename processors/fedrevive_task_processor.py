"""Device task processor for FedRevive (and FedBuff in the paper's setting).

As the paper's clients: Adam recreated for every job (fresh state), a fixed number of local iterations and the
task's augmentation (random crop and flip for the built-in images) applied on the device's tensor device; a
built-in model carries feature-statistic trackers after each convolution, whose running statistics travel with
the weights and feed the server's synthesis loss (a user's model is trained as its task builds it).
"""

from __future__ import annotations

from processors.task_processor import TaskDeviceProcessor


class FedReviveDeviceProcessor(TaskDeviceProcessor):
    """Adam, fixed iterations, augmentation, tracked features; plain-value constructor like its parent."""

    track_features = True

    def __init__(
        self,
        optimizer: str = "adam",
        lr: float = 3e-4,
        local_iterations: int | None = 25,
        batch_size: int = 32,
        augment: bool = True,
        **kwargs,
    ):
        super().__init__(
            optimizer=optimizer,
            lr=lr,
            local_iterations=local_iterations,
            batch_size=batch_size,
            augment=augment,
            **kwargs,
        )
