"""trace_theory: the NumPy core of TRACE, shared by the simulator and the trainer."""
from .contrast import *  # noqa: F401,F403
from .forest import Origin, RolloutForest  # noqa: F401
from ._forest_builder import ForestBuilder  # noqa: F401
from .allocate import PrefixAllocation, allocate_prefixes, allocate_roots, root_utility  # noqa: F401
from .policies import (  # noqa: F401
    POLICIES,
    PREFIX_RULES,
    ROOT_RULES,
    AllocationPolicy,
    RolloutBudget,
    RootAllocator,
    get_policy,
    top_up_roots,
)
from .dynamic_sampling import DynamicSamplingState, group_outcomes, mixed_groups  # noqa: F401
from .eager import EagerPlan, expected_flip_probability, expected_flip_probability_gain  # noqa: F401
from .expansion import EXPANSIONS, Expansion, get_expansion  # noqa: F401
from .step import KINDS, Prediction, Starts, StepRecord, round_shares, run_step  # noqa: F401
from .pipelined import Pending, PipelinedStep, run_pipelined_step  # noqa: F401
from .targets import VALUE_METHODS, node_targets, node_values, root_outcomes  # noqa: F401
from .advantages import ADVANTAGES, compute_advantages  # noqa: F401
from .metrics import (  # noqa: F401
    brier_score,
    budget_by_depth,
    contrast_pairs,
    contrast_yield,
    effective_ratio,
    expected_calibration_error,
    mixed_anchor_ratio,
    mixed_prompts,
)
