"""One prompt's tree grown from sessions: what the ``_run_prompt`` override does, without Ray or verl.

:func:`grow_tree` runs the prompt's m bare sessions concurrently; once they have all ended it numbers
their turns (root 0, then session 0's turns by depth, session 1's, ...), reports the tree's prefixes --
every non-final turn boundary of its bare sessions, in that order, with its session's reward -- to the
step's :class:`~.coordinator.StepCoordinator` and starts the continuations it returns at once, each from
its prefix's exact state; then it asks for the tree's share of the pooled pass and its root top-ups
(:meth:`~.coordinator.StepCoordinator.rest`) and starts those too. When every session has ended it reports
the tree's shape (:meth:`~.coordinator.StepCoordinator.finish`) and returns one :class:`Leaf` per session:
its output, and the extra fields that place it in the tree (``TRAJECTORY_FIELDS``). Sessions started
later get later node ids (first-pass continuations, top-ups, leftover continuations, each in order), so
parents always come before children.

``run_session(start, session_id)`` is the caller's: it runs one agent session, from the prompt
(``start`` None) or from a :class:`Prefix`'s state, and returns a :class:`Session`. In verl it is the
``trace_tool_agent`` loop (:mod:`.agent_loop`).

The coordinator's methods are awaited (``await coordinator.rest(tree)``): the Ray actor's calls return
object refs, :class:`~.coordinator.ThreadedCoordinator` runs the in-process one on its own pool. A tree
waiting for the step's other trees therefore holds no thread of the event loop's default executor, which
verl's agent loop needs for every token merge and tool-parser decode: with one thread per waiting tree
taken from it (``asyncio.to_thread``), a worker with more trees than that executor has threads
(min(32, CPUs + 4)) would stall until the coordinator's timeout.

If a session fails (or the coordinator refuses the tree), the tree's other sessions are cancelled, the
coordinator is told (:meth:`~.coordinator.StepCoordinator.fail`: the group is dropped, the step goes on)
and the error is re-raised for the caller to tag the group as failed.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Sequence

import numpy as np

from trace_theory import Origin

__all__ = ["Prefix", "Session", "Leaf", "grow_tree"]


@dataclass
class Prefix:
    """A turn boundary a session passed without ending: ``state`` resumes it exactly, ``history`` is what the
    predictor reads (``depth``, ``messages``, ``token_ids``, ``prompt``, ``row``)."""

    depth: int
    state: Any
    history: Any


@dataclass
class Session:
    """What one session produced: ``turns`` turns generated (from its start's depth), its ``reward``, the
    prefixes after each of its turns but the last (``len(prefixes) == turns - 1``), the response-token offset
    where each generated turn begins, the tokens each generated and the caller's ``output``."""

    turns: int
    reward: float
    prefixes: list[Prefix]
    turn_starts: list[int]
    output: Any = None
    turn_tokens: list[int] = field(default_factory=list)

    def __post_init__(self):
        if self.turns < 1 or len(self.prefixes) != self.turns - 1 or len(self.turn_starts) != self.turns:
            raise ValueError(f"a session of {self.turns} turns must report {self.turns - 1} prefixes and "
                             f"{self.turns} turn starts, got {len(self.prefixes)} and {len(self.turn_starts)}")


@dataclass
class Leaf:
    """One session as one verl trajectory: its ``output`` and the extra fields placing it in its tree."""

    session_id: int
    output: Any
    fields: dict


RunSession = Callable[[Prefix | None, int], Awaitable[Session]]


async def grow_tree(run_session: RunSession, coordinator, tree: int, bare: int, *, tree_id: Any = None) -> list[Leaf]:
    """Grow tree ``tree`` of the step from ``bare`` bare sessions (module docstring); ``tree_id`` (default
    ``tree``) is what the trajectories carry as ``trace_tree`` (verl: the prompt's uid)."""
    if bare < 1:
        raise ValueError(f"tree {tree} needs at least one bare session, got {bare}")
    tree_id = tree if tree_id is None else tree_id
    parent, reward, origin, cost, histories = [-1], [np.nan], [Origin.ROOT], [0.0], [None]
    placed: list[tuple[int, int, list[int], Session]] = []  # (session id, start node, node ids, session)

    def number(start: int, start_depth: int, session: Session, kind: Origin) -> list[int]:
        ids = []
        for j in range(session.turns):
            ids.append(len(parent))
            parent.append(start if j == 0 else ids[-2])
            last = j == session.turns - 1
            reward.append(float(session.reward) if last else np.nan)
            origin.append(kind)
            tokens = session.turn_tokens[j] if j < len(session.turn_tokens) else 1
            cost.append(float(tokens))
            histories.append(None if last else session.prefixes[j].history)
        return ids

    launched: list[tuple[int, int, asyncio.Task]] = []
    bare_tasks = [asyncio.ensure_future(run_session(None, i)) for i in range(bare)]
    try:
        sessions = await asyncio.gather(*bare_tasks)
    except BaseException as error:
        await _drop(coordinator, tree, bare_tasks, error)
        raise
    anchors: list[tuple[int, Prefix]] = []
    rewards = []
    for i, s in enumerate(sessions):
        ids = number(0, 0, s, Origin.BARE)
        placed.append((i, 0, ids, s))
        anchors.extend(zip(ids[:-1], s.prefixes))
        rewards.extend([s.reward] * len(s.prefixes))
    next_id = bare

    def launch(counts) -> list[tuple[int, int, asyncio.Task]]:
        nonlocal next_id
        out = []
        for (node, prefix), k in zip(anchors, counts):
            for _ in range(int(k)):
                out.append((next_id, node, asyncio.ensure_future(run_session(prefix, next_id))))
                next_id += 1
        return out

    try:
        k = await coordinator.expand(tree, np.asarray(rewards, dtype=float), [p.history for _, p in anchors])
        if len(k) != len(anchors):
            raise ValueError(f"tree {tree}: the coordinator placed {len(k)} counts on {len(anchors)} prefixes")
        launched += launch(k)
        top_ups, more = await coordinator.rest(tree)
        for _ in range(int(top_ups)):
            launched.append((next_id, 0, asyncio.ensure_future(run_session(None, next_id))))
            next_id += 1
        launched += launch(more) if len(more) else []
        depth_of = {0: 0}
        for _, _, ids, s in placed:
            depth_of.update({n: d + 1 for d, n in enumerate(ids)})
        for session_id, start, task in launched:
            s = await task
            ids = number(start, depth_of[start], s, Origin.BARE if start == 0 else Origin.CONTINUATION)
            placed.append((session_id, start, ids, s))
    except BaseException as error:
        await _drop(coordinator, tree, [task for _, _, task in launched], error)
        raise
    await coordinator.finish(tree, parent, reward, origin, cost, histories)
    leaves = []
    for session_id, start, ids, s in placed:
        fields = {"trace_tree": tree_id, "trace_parent": int(start), "trace_depth": depth_of[start] + s.turns,
                  "trace_nodes": ids, "trace_turn_starts": list(s.turn_starts)}
        leaves.append(Leaf(session_id, s.output, fields))
    return leaves


async def _drop(coordinator, tree: int, tasks, error: BaseException) -> None:
    """Cancel a failed tree's sessions and tell the coordinator (its group is dropped, the step goes on)."""
    for task in tasks:
        task.cancel()
    if isinstance(error, asyncio.CancelledError):
        return
    await coordinator.fail(tree, f"{type(error).__name__}: {error}")
