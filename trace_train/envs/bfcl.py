"""BFCL v4 multi-turn function calling, played as BFCL's own inference loop plays it with a Qwen model.

A row holds a task ``id`` (:func:`bfcl_rows` lists the rows of subsets and split). The task's data, API
back ends and checker come from ``bfcl-eval`` through ``trace_train.tools.bfcl``.

Prompts, as BFCL's ``QwenFCHandler`` builds them (the prompting loop, which BFCL runs for local models):

* the system message is Qwen3's tool section (``tooling.qwen3_tools_block``) listing the function
  documents available at the first turn, each description ending in BFCL's Python hint
  (:data:`PYTHON_HINT`, added by ``bfcl_eval.utils.load_dataset_entry``); BFCL writes no other system
  text for these models;
* the first user message opens turn 0; a ``miss_func`` task holds some documents back and shows them
  at their turn, in the user message BFCL writes then
  (``DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING``: the documents, then "I have updated some
  more functions you can choose from. What about now?").

Steps. Each action (visible text, reasoning dropped) with ``<tool_call>`` blocks is one step of the
current turn: the well-formed calls run in order on the task's live API instances (``BfclBackend``, with
BFCL's execution semantics and error strings; a call to a function not yet documented runs as it would
in BFCL; a call of anything but an API method with literal arguments is refused and recorded as a failed
call, ``tools.bfcl.admit_call``) and malformed blocks get an error result (``invalid``); the results are
one observation of role ``observation_role``. An action without tool calls ends the turn: the next
turn's user message is the observation (role "user"), or, after the last turn, the episode ends. A turn
that takes more than ``max_steps_per_turn`` tool-call steps ends the episode, as BFCL force-quits
(default: BFCL's limit, 20).

:meth:`BfclEnv.verify` is the official ``multi_turn_checker``'s verdict on the calls made
(``tools.bfcl.check_bfcl``): 1.0 when valid. An episode that stops before its last turn (step limit,
or a limit of the rollout engine) fails as "force terminated", as in BFCL.

Snapshots are :class:`BfclState` values: the back end's snapshot (deep copies of the API instances and
the recorded calls, about a millisecond) plus the turn position.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace
from functools import cache
from typing import Any, Mapping, Sequence

from bfcl_eval.constants.default_prompts import DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING

from ..tools.bfcl import (
    MAX_STEPS_PER_TURN,
    SUBSETS,
    BfclBackend,
    BfclSnapshot,
    BfclTask,
    check_bfcl,
    load_bfcl_tasks,
)
from ..tools.tool_calls import ToolCall, parse_tool_calls
from .base import Message, StepResult
from .tooling import check_observation_role, format_tool_results, qwen3_tools_block, visible_text

__all__ = ["BfclEnv", "BfclState", "PYTHON_HINT", "bfcl_rows", "bfcl_task"]

PYTHON_HINT = " Note that the provided function is in Python 3 syntax."
"""What ``bfcl_eval.utils.add_language_specific_hint_to_function_doc`` appends to every description of
the functions a task documents from its start (held-out ones are shown without it, as in BFCL)."""
_PREFIX = "multi_turn_"


@dataclass(frozen=True, eq=False)
class BfclState:
    """The whole state of an episode (a snapshot is this value)."""

    task_id: str
    turn: int
    """Index of the current user turn."""
    steps: int
    """Tool-call steps taken in the current turn."""
    backend: BfclSnapshot
    finished: bool = False
    """The last turn was answered, or the step limit ended the episode."""
    forced: bool = False
    """The step limit ended the episode."""


@cache
def _tasks(subset: str) -> dict[str, BfclTask]:
    return {task.id: task for task in load_bfcl_tasks([subset])}


def bfcl_task(task_id: str) -> BfclTask:
    """The task with id ``task_id`` (e.g. ``"multi_turn_miss_func_12"``)."""
    known = isinstance(task_id, str) and task_id.startswith(_PREFIX)
    subset = task_id[len(_PREFIX):].rsplit("_", 1)[0] if known else None
    if subset not in SUBSETS or task_id not in _tasks(subset):
        raise ValueError(f"no BFCL multi-turn task {task_id!r}; ids look like 'multi_turn_base_0' "
                         f"with a subset from {SUBSETS}")
    return _tasks(subset)[task_id]


def bfcl_rows(subsets: Sequence[str] = SUBSETS, *, split: str | None = None) -> list[dict]:
    """Rows (``id``, ``subset``) of the tasks of ``subsets``; ``split`` "train", "test" or None (all)."""
    return [{"id": task.id, "subset": task.subset} for task in load_bfcl_tasks(subsets, split=split)]


def opening_functions(task: BfclTask) -> list[dict]:
    """The documents of the system prompt: those available at turn 0, with BFCL's Python hint."""
    docs = copy.deepcopy(task.functions_at(0))
    initial = {doc["name"] for doc in task.functions}
    for doc in docs:
        if doc["name"] in initial:
            doc["description"] += PYTHON_HINT
    return docs


def turn_message(task: BfclTask, turn: int) -> Message:
    """The user message that opens ``turn`` (with the documents added then, for ``miss_func``)."""
    if turn in task.added_functions:
        added = list(task.added_functions[turn])
        return {"role": "user", "content": DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_PROMPTING.format(
            functions=added)}
    return dict(task.turns[turn][0])


class BfclEnv:
    """The environment (see the module docstring).

    Parameters
    ----------
    observation_role : {"tool", "user"}
        Role of the message with a step's execution results (see ``tooling``).
    max_steps_per_turn : int
        Tool-call steps a turn may take; one more ends the episode (BFCL's limit by default).
    """

    concurrency_safe = True
    """The API instances are per episode; the checker's are keyed by a fresh name per call."""

    def __init__(self, *, observation_role: str = "tool", max_steps_per_turn: int = MAX_STEPS_PER_TURN):
        steps = max_steps_per_turn
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(f"`max_steps_per_turn` must be a positive integer, got {max_steps_per_turn!r}")
        self.observation_role = check_observation_role(observation_role)
        self.max_steps_per_turn = max_steps_per_turn
        self._backend: BfclBackend | None = None
        self._state: BfclState | None = None  # the position; snapshot() adds the back end's state

    @property
    def task(self) -> BfclTask:
        if self._backend is None:
            raise RuntimeError("call reset() or restore() before using the environment")
        return self._backend.task

    def reset(self, row: Mapping[str, Any]) -> list[Message]:
        task = bfcl_task(row.get("id"))
        if any(len(messages) != 1 or messages[0]["role"] != "user" for messages in task.turns):
            raise ValueError(f"task {task.id}: every turn must open with exactly one user message")
        self._backend = BfclBackend(task)
        self._state = BfclState(task.id, 0, 0, self._backend.snapshot())
        system = {"role": "system", "content": qwen3_tools_block(opening_functions(task))}
        return [system, turn_message(task, 0)]

    def step(self, action: str) -> StepResult:
        state, backend = self._state, self._backend
        if state is None or backend is None:
            raise RuntimeError("call reset() or restore() before using the environment")
        if state.finished:
            raise RuntimeError("the episode is over; reset() or restore() first")
        calls = parse_tool_calls(visible_text(action))
        if not calls:
            return self._next_turn(state)
        valid = [call.to_call_string() for call in calls if isinstance(call, ToolCall)]
        outputs = iter(backend.execute(valid) if valid else ())
        results = [next(outputs) if isinstance(call, ToolCall) else call.error for call in calls]
        forced = state.steps + 1 > self.max_steps_per_turn
        self._state = replace(state, steps=state.steps + 1, finished=forced, forced=forced)
        return StepResult(format_tool_results(results, self.observation_role), done=forced,
                          role=self.observation_role, invalid=len(valid) < len(calls))

    def _next_turn(self, state: BfclState) -> StepResult:
        if state.turn + 1 == len(self.task.turns):
            self._state = replace(state, finished=True)
            return StepResult("All turns of the task are complete.", done=True)
        self._backend.next_turn()
        self._state = replace(state, turn=state.turn + 1, steps=0)
        return StepResult(turn_message(self.task, state.turn + 1)["content"])

    def verify(self) -> float:
        return check_bfcl(self.task, self._backend.calls).reward

    def metrics(self) -> dict[str, float]:
        """``accuracy`` (the checker's verdict, the reward), ``completed`` (every turn answered in time)."""
        state = self.snapshot()
        return {"accuracy": self.verify(), "completed": float(state.finished and not state.forced)}

    def snapshot(self) -> BfclState:
        if self._state is None:
            raise RuntimeError("call reset() or restore() before using the environment")
        return replace(self._state, backend=self._backend.snapshot())

    def restore(self, snapshot: BfclState) -> None:
        if not isinstance(snapshot, BfclState):
            raise ValueError(f"`snapshot` must be a BfclState, got {type(snapshot).__name__}")
        task = bfcl_task(snapshot.task_id)
        if self._backend is None or self._backend.task is not task:
            self._backend = BfclBackend(task)
        self._backend.restore(snapshot.backend)
        self._state = snapshot
