"""A new user's own task, outside the package: reach a target sum by naming allowed numbers, in 1-3 turns.

Written the way ``docs/extending.md`` ("Your own agent task") says, to check ``docs/training.md``'s advice
for a run that does not learn ("My run does not learn"); the evidence is
``benchmarks/newcomer/target_sum.json``. Rows (``make_rows.py`` writes ``rows.jsonl``)::

    {"id": "t0", "target": 11, "numbers": [2, 4, 7], "turns": 2}

Each turn the agent names one number; an allowed one is added to the running sum, which is fed back. The
episode ends when the sum equals the target (reward 1), passes it, or the turns run out (reward 0). A reply
with no allowed number costs its turn. Train it (from the repository root)::

    trace-train task.name=examples/target_sum/target_sum_env.py:TargetSumEnv task.train=examples/target_sum/rows.jsonl

``TargetSumEnv`` is the environment as a user first writes it. ``TargetSumExpertEnv`` is the same
environment with a scripted expert (``task_spec.demonstration``), the first step of the advice: the tiny
model (``model.name_or_path=tiny``) is then warmed on the expert's episodes instead of guess-the-number's.
"""

from __future__ import annotations

import itertools
import re

SYSTEM_PROMPT = "You add numbers. Reply with exactly one whole number and nothing else."
_INTEGER = re.compile(r"-?\d+")


class TargetSumEnv:
    """Rows: ``target``, ``numbers`` (the allowed ones), ``turns``. Option: ``system_prompt``.

    State: ``(target, numbers, turns left, sum)``; reward ``1`` iff ``sum == target`` when the episode ends."""

    def __init__(self, *, system_prompt: str = SYSTEM_PROMPT):
        self.system_prompt = system_prompt
        self._state: tuple | None = None

    def reset(self, row):
        missing = {"target", "numbers", "turns"} - set(row)
        if missing:
            raise ValueError(f"target-sum rows need the keys {sorted(missing)}; got {sorted(row)}")
        numbers = tuple(int(n) for n in row["numbers"])
        self._state = (int(row["target"]), numbers, int(row["turns"]), 0)
        allowed = ", ".join(str(n) for n in numbers)
        task = (f"Reach the sum {row['target']} by naming numbers from {allowed}, one per turn. "
                f"You have {row['turns']} turns.")
        return [{"role": "system", "content": self.system_prompt}, {"role": "user", "content": task}]

    def step(self, action: str):
        from trace_train.envs.base import StepResult

        target, numbers, turns, total = self._state
        match = _INTEGER.search(action)
        n = int(match.group()) if match else None
        allowed = n in numbers
        total += n if allowed else 0
        turns -= 1
        self._state = (target, numbers, turns, total)
        if total == target:
            return StepResult(f"Sum {total}. Target reached.", done=True)
        if total > target:
            return StepResult(f"Sum {total}. Over the target {target}.", done=True)
        why = "" if allowed else ("No number. " if n is None else f"{n} is not allowed. ")
        return StepResult(f"{why}Sum {total}. {turns} turns left.", done=turns == 0, invalid=n is None)

    def verify(self) -> float:
        target, _, _, total = self._state
        return 1.0 if total == target else 0.0

    def snapshot(self):
        return self._state

    def restore(self, snapshot) -> None:
        self._state = snapshot


def expert_actions(row) -> list[str]:
    """A scripted expert: the fewest allowed numbers (at most ``turns``) that add up to ``target``, in the
    order the row lists them; [] when none do."""
    numbers = sorted(int(n) for n in row["numbers"])
    for count in range(1, int(row["turns"]) + 1):
        for combo in itertools.combinations_with_replacement(numbers, count):
            if sum(combo) == int(row["target"]):
                return [str(n) for n in combo]
    return []


def _task_spec():
    from trace_train.envs.spec import TaskSpec

    return TaskSpec(demonstration=expert_actions)


class TargetSumExpertEnv(TargetSumEnv):
    """:class:`TargetSumEnv` with its scripted expert as the task spec's ``demonstration``."""


TargetSumExpertEnv.task_spec = _task_spec()
