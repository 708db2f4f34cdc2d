"""The experiments, registered by name in the order of the issue; ``trace-sim list`` shows their claims."""

from . import ablation, contrast_identities, effective_ratio, learning_curves, predictor_quality, propositions, target_bias  # noqa: F401,E501
from .base import EXPERIMENTS, Experiment, get_experiment  # noqa: F401
