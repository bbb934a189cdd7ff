"""FedRevive (arXiv 2511.00655): server-side data-free knowledge distillation for stale asynchronous updates.

Pure PyTorch, no NVFlare: :class:`Reviver` turns each accepted client model into the delta the asynchronous
server buffers, supplementing stale updates with a KD update distilled from recent client models on inputs
from a meta-learned generator (:class:`Synthesizer`, :func:`distill`). :func:`input_space` says what that
generator makes for a task (images, any other continuous input shape, or the task's own generator's output);
:func:`generator_obstacle` why it cannot (integer inputs without a task generator).
"""

from devsim.aggregation.fedrevive.class_proportions import (
    GaussianProbeEstimator,
    proportions_from_counts,
    proportions_from_labels,
)
from devsim.aggregation.fedrevive.config import DFKDConfig
from devsim.aggregation.fedrevive.distill import distill
from devsim.aggregation.fedrevive.generator import Generator, MLPGenerator
from devsim.aggregation.fedrevive.inputs import InputSpace, generator_obstacle, input_space
from devsim.aggregation.fedrevive.pool import SyntheticPool
from devsim.aggregation.fedrevive.reviver import FedReviveServerState, Reviver, ReviverConfig
from devsim.aggregation.fedrevive.staleness import beta, scaled_s_max
from devsim.aggregation.fedrevive.synthesis import Synthesizer
from devsim.aggregation.fedrevive.teachers import Teacher, TeacherBuffer

__all__ = [
    "DFKDConfig",
    "FedReviveServerState",
    "GaussianProbeEstimator",
    "Generator",
    "InputSpace",
    "MLPGenerator",
    "Reviver",
    "ReviverConfig",
    "SyntheticPool",
    "Synthesizer",
    "Teacher",
    "TeacherBuffer",
    "beta",
    "distill",
    "generator_obstacle",
    "input_space",
    "proportions_from_counts",
    "proportions_from_labels",
    "scaled_s_max",
]
