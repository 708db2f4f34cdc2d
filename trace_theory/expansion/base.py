"""The expansion registry and what a mode is.

An expansion mode decides *when* a step's continuations start; the allocation (which prefixes get how
many) is the policy's. Every mode is one module of this package that registers a factory
``EXPANSIONS.register(name)``: called with the mode's settings (keyword-only) it returns an
:class:`Expansion`. The step driver (``trace_theory.step.run_step``), the trainer's config
(``rollout.expansion``) and the simulator read this registry, and every world has one ``plant`` that
reports a streaming mode's events (:mod:`.events`). A new mode is one file plus its tests: the decision
test ``tests/theory/test_expansion.py`` runs every registered name against the barrier.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from .._registry import Registry
from ..forest import RolloutForest
from .events import PlantEvents

__all__ = ["EXPANSIONS", "Expansion", "Settled", "get_expansion"]

EXPANSIONS: Registry[Callable[..., "Expansion"]] = Registry("expansion mode")
"""Expansion modes by name: ``EXPANSIONS[name](**settings) -> Expansion``."""


class Settled:
    """What a streaming mode's events decided, once the world's forest is whole (:meth:`Expansion.settle`).

    ``v``, ``concentration``: the predictions at the planted anchors (rollout order); ``continuations``:
    how many were started; ``top_ups``: per tree, bare rollouts added at its root; ``fields``: the mode's
    own :class:`~trace_theory.step.StepRecord` fields (``node_phase``, the eager threshold, ...).
    """

    def __init__(self, v: np.ndarray, concentration: np.ndarray | None, continuations: int, top_ups: np.ndarray,
                 fields: dict | None = None):
        self.v, self.concentration, self.continuations = v, concentration, int(continuations)
        self.top_ups, self.fields = np.asarray(top_ups, dtype=np.int64), dict(fields or {})


class Expansion:
    """A registered expansion mode (see the module). The base is the barrier: nothing streams.

    Attributes
    ----------
    name : str
        Its registry name; what :attr:`~trace_theory.step.StepRecord.expansion` records when it ran.
    streams : bool
        Whether its decisions are taken from a world's events as rollouts end (one expansion round, a
        prefix rule that is not randomised: ``policy.streams_prefixes``); the driver then plants with
        :meth:`events` and, once the world returns, calls :meth:`settle`. Otherwise the barrier's rounds run.
    defers : bool
        Whether a step's continuations are grown in the next step's wave (``trace_theory.pipelined``
        drives such a step: the barrier's decisions, deferred).
    decides_as_barrier : bool
        Whether its continuations and top-ups are the barrier's node for node, given the same bare
        rollouts and predictions. The decision test checks that, and for a mode that decides otherwise
        (earlier, with less known) that it spends the same budget and that the barrier, the hindsight
        optimum, reaches at least its prefix utility.
    """

    name: str = "barrier"
    streams: bool = False
    defers: bool = False
    decides_as_barrier: bool = True

    def events(self, policy, m_tree: np.ndarray, per_root: int, tree_cost: np.ndarray | None,
               root_v: np.ndarray | None) -> PlantEvents:
        """The step's :class:`~.events.PlantEvents` for trees of ``m_tree`` bare rollouts and a continuation
        budget of ``per_root`` per root (``tree_cost``: tokens of a rollout per tree, or None; ``root_v``:
        the roots' predictions, or None where the root rule reads none)."""
        raise NotImplementedError(f"expansion mode {self.name!r} does not stream")

    def settle(self, events: PlantEvents, forest: RolloutForest, anchors: np.ndarray) -> Settled:
        """What ``events`` decided, checked against the world's ``forest`` (``anchors``: its planted bare
        rollouts' prefixes, in rollout order)."""
        raise NotImplementedError(f"expansion mode {self.name!r} does not stream")

    def __repr__(self) -> str:
        return f"<expansion {self.name!r}>"


def get_expansion(name: "str | Expansion", **settings) -> Expansion:
    """The registered mode ``name`` with ``settings`` (an :class:`Expansion` is returned as it is).

    >>> get_expansion("barrier").streams
    False
    """
    if isinstance(name, Expansion):
        if settings:
            raise ValueError(f"settings {sorted(settings)} given with a built expansion mode {name.name!r}")
        return name
    return EXPANSIONS[name](**settings)
