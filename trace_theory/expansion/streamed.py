"""Streamed expansion (``"streamed"``): each tree's continuations start as soon as its own bare rollouts
have ended, the pooled pass and the top-ups once every tree has.

This is eager expansion with the whole budget kept in reserve (:mod:`.eager`, ``reserve=1``): no decision
at a turn boundary, the policy's own pass per tree as it ends, then the pooled pass, which together are
``allocate_prefixes``: the barrier's decisions node for node (tested). So streamed is a name, not code.
"""

from __future__ import annotations

from ..eager import EagerPlan
from .base import EXPANSIONS
from .eager import Eager

__all__ = ["streamed"]


@EXPANSIONS.register("streamed")
def streamed() -> Eager:
    """Eager expansion with ``reserve=1``, recorded as ``"streamed"``."""
    return Eager(EagerPlan(reserve=1.0), name="streamed")
