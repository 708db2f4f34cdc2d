"""Expansion modes: when a step's continuations start, one registered module per mode.

================  ==============================================================================
``"barrier"``     after every bare rollout of the step (:mod:`.barrier`; the paper's algorithm)
``"streamed"``    as soon as the tree's own bare rollouts have ended (:mod:`.streamed`: eager with
                  the whole budget in reserve)
``"eager"``       from the turn boundary where their prefix forms (:mod:`.eager`)
``"pipelined"``   the barrier's, grown in the next step's wave (:mod:`.pipelined`)
================  ==============================================================================

The registry :data:`EXPANSIONS` is what the step driver, the trainer's config and the simulator read
(:func:`get_expansion`); every world reports a streaming mode's events (:mod:`.events`) from its one
``plant``. A new mode is one module here that registers itself, plus its tests.
"""

from .base import EXPANSIONS, Expansion, Settled, get_expansion  # noqa: F401
from .events import KINDS, Branch, Kind, PlantEvents, Prediction, Start, Starts, in_rollout_order  # noqa: F401
from .barrier import Barrier, hindsight_continuations, round_shares  # noqa: F401
from .eager import Eager, TreeDecisions  # noqa: F401
from .streamed import streamed  # noqa: F401
from .pipelined import Pipelined, Wave, pipelines  # noqa: F401
