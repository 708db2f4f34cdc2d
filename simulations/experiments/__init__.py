"""The experiments, registered by name in the order of the issue; ``trace-sim list`` shows their claims."""

from . import ablation, contrast_identities, effective_ratio, propositions  # noqa: F401  (registers)
from .base import EXPERIMENTS, Experiment, get_experiment  # noqa: F401
