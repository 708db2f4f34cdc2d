"""The experiments, registered by name in the order of the issue; ``trace-sim list`` shows their claims."""

from . import effective_ratio  # noqa: F401  (registers)
from .base import EXPERIMENTS, Experiment, get_experiment  # noqa: F401
