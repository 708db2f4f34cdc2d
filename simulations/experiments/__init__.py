"""The experiments, registered by name; ``trace-sim list`` shows their claims.

Importing a module registers it; the order below is the issue's (and what ``trace-sim run all`` runs).
"""
# isort: skip_file

from . import contrast_identities  # noqa: F401  (1)
from . import propositions  # noqa: F401  (2)
from . import effective_ratio  # noqa: F401  (3)
from . import ablation  # noqa: F401  (4)
from . import learning_curves  # noqa: F401  (5)
from . import predictor_quality  # noqa: F401  (6)
from . import target_bias  # noqa: F401  (7)
from . import expansion_rounds  # noqa: F401  (8, issue 15)
from . import sensitivity  # noqa: F401  (9)
from . import regime_map  # noqa: F401  (10)
from . import eager_expansion  # noqa: F401  (11, issue 35)
from . import key_lock  # noqa: F401  (12, issue 56)
from .base import EXPERIMENTS, Experiment, get_experiment  # noqa: F401
