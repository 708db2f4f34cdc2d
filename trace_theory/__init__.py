"""trace_theory: the NumPy core of TRACE, shared by the simulator and the trainer."""
from .contrast import *  # noqa: F401,F403
from .forest import ForestBuilder, Origin, RolloutForest  # noqa: F401
from .allocate import PrefixAllocation, allocate_prefixes, allocate_roots, root_utility  # noqa: F401
