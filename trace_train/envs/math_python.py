"""Math with a Python tool: ReAct turns that reason, run code in a sandbox, read the output and answer.

A row holds ``problem`` and ``answer`` (the reference answer; :func:`math_rows` turns the loaders'
``MathProblem`` objects into rows). The opening messages are the system prompt, which explains the
``python`` tool, the Qwen3 tool-call format and the answer format, and the problem as the user message.

Each turn the action (its visible text, reasoning dropped: ``tooling.visible_text``) is read as:

* **tool calls** (one or more ``<tool_call>`` blocks): each call ``python(code=...)`` runs in the
  episode's persistent sandboxed session (``tools.sandbox.PythonSession``: variables survive between
  calls; CPU, memory, process, file and wall-clock limits; no network), and its output, errors or the
  limit that stopped it is the observation. Malformed blocks, other tool names or arguments get an
  error result (the action is ``invalid``); at most ``max_tool_calls`` calls run per episode, later
  ones get the budget-exhausted message. An answer written in a tool-call turn is ignored.
* **a final answer** (no tool call; ``<answer>...</answer>`` or ``\\boxed{...}``, as
  ``verifiers.answers.extract_math_answer`` reads it): the episode ends.
* anything else: an error observation (role "user", ``invalid``); the episode goes on.

Tool results come back in one message of role ``observation_role`` (see ``tooling``).

:meth:`MathPythonEnv.verify` is 1.0 when math-verify finds the final answer equal to the reference
answer (``verifiers.math.check_math_answer``), else 0.0 (also without an answer).

Snapshots are :class:`MathState` values: the cells run so far, the calls charged and the answer. A
restored session replays its cells silently before the next call (same seed), which is exact for code
that depends only on its inputs and the seeded ``random`` module.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Iterable, Mapping

from ..tools.budget import ToolCallBudget
from ..tools.sandbox import PythonSession, SandboxLimits
from ..verifiers.answers import extract_math_answer
from ..verifiers.math import check_math_answer
from .base import Message, StepResult
from .tooling import (
    check_observation_role,
    format_tool_results,
    function_schema,
    run_tool_calls,
    visible_text,
)

__all__ = ["MathPythonEnv", "MathState", "PYTHON_TOOL", "math_rows"]

PYTHON_TOOL = function_schema(
    "python",
    "Run Python 3 code in a persistent session (variables, imports and functions stay defined between "
    "calls) and return what it prints. No network, limited time and memory.",
    {"code": {"type": "string", "description": "The code to run; print the values you want to see."}},
    ["code"],
)
SYSTEM_PROMPT = (
    "You are an expert mathematician. Solve the problem step by step. You can run Python code with the "
    "`python` tool: the code runs in a persistent session (variables, imports and functions stay defined "
    "between calls), and you see what it prints, so print the values you need. To call the tool, write\n"
    '<tool_call>\n{{"name": "python", "arguments": {{"code": "print(2 + 2)"}}}}\n</tool_call>\n'
    "and wait for the result. You may call the tool at most {max_tool_calls} times. When you are sure, "
    "give the final answer in a turn without tool calls, as <answer>...</answer> or \\boxed{{...}}, "
    "for example <answer>42</answer>."
)
NO_ACTION = (
    "Error: no tool call and no final answer. Call the python tool with a <tool_call> block, or give the "
    "final answer as <answer>...</answer> or \\boxed{...}."
)


@dataclass(frozen=True)
class MathState:
    """The whole state of an episode (a snapshot is this value)."""

    problem: str
    answer: str
    """The reference answer."""
    cells: tuple[str, ...] = ()
    """Code the session has run (``PythonSession.snapshot``)."""
    tool_calls: int = 0
    """Calls charged to the budget."""
    response: str | None = None
    """Visible text of the answering turn; None until the model answers."""

    @property
    def done(self) -> bool:
        return self.response is not None


def math_rows(problems: Iterable[Any]) -> list[dict]:
    """Rows for this environment from ``data.math.MathProblem`` objects (id, problem, answer)."""
    return [{"id": p.id, "problem": p.problem, "answer": p.answer} for p in problems]


class MathPythonEnv:
    """The environment (see the module docstring).

    Parameters
    ----------
    max_tool_calls : int
        Python calls per episode.
    limits : SandboxLimits
        Limits of every sandboxed run (a call replays the session's earlier cells under the same limits).
    observation_role : {"tool", "user"}
        Role of the tool-result message: "tool" where the chat template renders it (Qwen3 and the tiny
        test template do), else "user"; ``tooling.observation_role_for(tokenizer)`` tells which.
    answer_timeout : float
        Seconds math-verify may take to compare the final answer.
    system_prompt : str, optional
        Replaces the default instructions; ``{max_tool_calls}`` in it is filled in.
    """

    concurrency_safe = True
    """Each sandboxed call is its own subprocess in its own work directory; math-verify's worker is locked."""

    def __init__(self, *, max_tool_calls: int = 8, limits: SandboxLimits = SandboxLimits(),
                 observation_role: str = "tool", answer_timeout: float = 5.0,
                 system_prompt: str | None = None):
        self._budget = ToolCallBudget(max_tool_calls)
        if not isinstance(limits, SandboxLimits):
            raise ValueError(f"`limits` must be a SandboxLimits, got {type(limits).__name__}")
        if not answer_timeout > 0:
            raise ValueError(f"`answer_timeout` must be positive, got {answer_timeout!r}")
        self.observation_role = check_observation_role(observation_role)
        self.answer_timeout = answer_timeout
        self.system_prompt = (system_prompt or SYSTEM_PROMPT).format(max_tool_calls=max_tool_calls)
        self._session = PythonSession(limits=limits)
        self._state: MathState | None = None

    @property
    def state(self) -> MathState:
        if self._state is None:
            raise RuntimeError("call reset() or restore() before using the environment")
        return self._state

    def reset(self, row: Mapping[str, Any]) -> list[Message]:
        problem, answer = row.get("problem"), row.get("answer")
        if not isinstance(problem, str) or not problem.strip():
            raise ValueError(f"math rows need a non-empty str 'problem'; got keys {sorted(row)}")
        if isinstance(answer, (int, float)) and not isinstance(answer, bool):
            answer = str(answer)
        if not isinstance(answer, str) or not answer.strip():
            raise ValueError(f"math rows need a non-empty 'answer'; got {answer!r}")
        self.restore(MathState(problem=problem, answer=answer.strip()))
        return [{"role": "system", "content": self.system_prompt}, {"role": "user", "content": problem}]

    def step(self, action: str) -> StepResult:
        if self.state.done:
            raise RuntimeError("the episode is over; reset() or restore() first")
        text = visible_text(action)
        results, invalid = run_tool_calls(text, "python", "code", self._budget,
                                          lambda code: self._session.run(code).observation())
        if results:
            self._state = replace(self.state, cells=self._session.snapshot(), tool_calls=self._budget.used)
            return StepResult(format_tool_results(results, self.observation_role), role=self.observation_role,
                              invalid=invalid)
        if extract_math_answer(text):
            self._state = replace(self.state, response=text)
            return StepResult("Final answer received.", done=True)
        return StepResult(NO_ACTION, invalid=True)

    def verify(self) -> float:
        return self.metrics()["correct"]

    def metrics(self) -> dict[str, float]:
        """Measures of the state reached: ``correct`` (the reward), ``answered``, ``tool_calls``."""
        s = self.state
        correct = 0.0 if s.response is None else check_math_answer(
            s.response, s.answer, timeout_seconds=self.answer_timeout).reward
        return {"correct": correct, "answered": float(s.done), "tool_calls": float(s.tool_calls)}

    def snapshot(self) -> MathState:
        return self.state

    def restore(self, snapshot: MathState) -> None:
        if not isinstance(snapshot, MathState):
            raise ValueError(f"`snapshot` must be a MathState, got {type(snapshot).__name__}")
        self._budget.restore(snapshot.tool_calls)
        self._session.restore(snapshot.cells)
        self._state = snapshot
