"""Pipelined expansion's wave in the engine (``rollout.expansion=pipelined``, ``trace_theory.pipelined``).

A pipelined call's one generation phase (its *wave*) plants this call's roots with their bare rollouts and
grows the previous call's continuations and top-ups (the driver's ``Pending.starts``) beside them, in one
:meth:`~.scheduler.Scheduler.grow` call, so that both share the generation batches. The previous call's
trees travel between calls as a :class:`Carried` (its forest and payloads: exact token ids, log-probs,
messages, environment snapshots, pool rows; plain data, pickled into checkpoints). A wave:

1. :func:`wave_builder` copies the carried trees into a fresh builder (their node ids unchanged, 0..n-1)
   and the caller adds this call's roots after them, their prompt ids shifted past the carried ones (the
   two pools' ids would collide otherwise);
2. one grow call extends both: a continuation restores its environment from its prefix node's snapshot
   and extends the prefix's exact token ids, as every continuation does;
3. :func:`split_wave` cuts the grown builder by tree: the carried trees, whole (old nodes first and
   unchanged, the new rollouts after them, in the scheduler's commit order), and this call's trees,
   renumbered from 0 with their own prompt ids (what a fresh plant would have numbered them).

Nothing here depends on when rollouts finish: the scheduler commits turns in a fixed order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from trace_theory import RolloutForest

from .batch import BatchBuilder, NodePayload

__all__ = ["Carried", "wave_builder", "split_wave", "stale_token_share"]


@dataclass(frozen=True)
class Carried:
    """The engine's state of one call's trees between two waves (``Pending.carried``)."""

    forest: RolloutForest
    nodes: tuple[NodePayload, ...]
    rows: Mapping[int, Mapping[str, Any]]
    """Pool rows by prompt id (the ids in ``forest.prompt``)."""


def wave_builder(carried: Carried | None, *, binary_rewards: bool) -> tuple[BatchBuilder, int, int]:
    """A builder holding ``carried``'s trees (ids unchanged), for this call's roots to join:
    returns (builder, carried nodes n, prompt shift for this call's roots)."""
    builder = BatchBuilder(binary_rewards=binary_rewards)
    if carried is None:
        return builder, 0, 0
    builder.copy_from(carried.forest, carried.nodes, carried.rows)
    shift = int(carried.forest.prompt.max()) + 1 if len(carried.forest) else 0
    return builder, len(carried.forest), shift


def split_wave(builder: BatchBuilder, forest: RolloutForest, n_old: int, shift: int, *,
               binary_rewards: bool) -> tuple[BatchBuilder | None, BatchBuilder]:
    """The grown wave (``builder`` and its ``forest``) cut by tree: (the carried trees whole, None without
    any; this call's trees, renumbered from 0, prompt ids shifted back)."""
    if n_old == 0:
        return None, builder
    old = forest.roots[forest.tree_index] < n_old
    done = BatchBuilder(binary_rewards=binary_rewards)
    done.copy_from(forest, builder.nodes, builder.rows, np.flatnonzero(old))
    fresh = BatchBuilder(binary_rewards=binary_rewards)
    fresh.copy_from(forest, builder.nodes, builder.rows, np.flatnonzero(~old), prompt_shift=-shift)
    return done, fresh


def stale_token_share(forest: RolloutForest, n_old: int) -> float:
    """Share of the generated tokens of ``forest`` on its first ``n_old`` nodes (grown in an earlier wave)."""
    total = float(forest.cost.sum())
    return float(forest.cost[:n_old].sum()) / total if total > 0 else 0.0
