"""Pipelined expansion (``"pipelined"``): a step's continuations are the barrier's, grown in the next
step's generation wave.

The decisions are the barrier's (:mod:`.barrier`, one round); what differs is when they are grown, which
takes a driver of its own across two steps: ``trace_theory.pipelined.run_pipelined_step`` (its
:class:`~trace_theory.pipelined.Pending` carries a step's decided starts to the next wave). A world grows
a wave with ``plant(prompts, counts, events)`` where ``events`` is a :class:`Wave`: this step's roots and,
in the same wave, the pending step's starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..forest import RolloutForest
from ..policies import AllocationPolicy, RolloutBudget
from .base import EXPANSIONS, Expansion

__all__ = ["Pipelined", "Wave", "pipelines"]


@EXPANSIONS.register("pipelined")
class Pipelined(Expansion):
    """The barrier's decisions, deferred to the next step's wave (see the module)."""

    name = "pipelined"
    defers = True


@dataclass
class Wave:
    """The events of one pipelined wave: the pending step's ``starts`` to grow below its forest, from the
    world's state ``carried`` (``Pending.carried``), beside this step's bare rollouts. The world sets
    :attr:`grown` to the pending forest with its new rollouts (ids after the old ones, in the starts'
    order) before ``plant`` returns; None where nothing was pending."""

    pending: Any = None
    """The previous step's :class:`~trace_theory.pipelined.Pending`, or None."""
    grown: RolloutForest | None = None
    boundaries = False


def pipelines(policy: AllocationPolicy, budget: RolloutBudget, expansion_rounds: int = 1) -> bool:
    """Whether ``policy`` defers anything under pipelined expansion: it branches, has continuation budget,
    one expansion round and a prefix rule that is not randomised. Otherwise a pipelined step is an
    ordinary step (:func:`~trace_theory.step.run_step`), trained at once."""
    per_root = RolloutBudget(*policy.split(budget)).continuations_per_root
    return bool(policy.branches and not policy.dynamic_sampling and per_root > 0 and expansion_rounds == 1
                and policy.streams_prefixes)
