"""A custom environment, outside the package: name a number of the asked parity within a range.

Train it on a CPU (from the repository root)::

    trace-train --config examples/parity_game/config.yaml

``task.name`` in ``config.yaml`` is ``examples/parity_game/parity_env.py:ParityEnv``: the file and the
class in it (with this folder on ``PYTHONPATH``, ``parity_env:ParityEnv`` works too). Rows come from
``rows.jsonl``, one JSON object per line, passed unchanged to :meth:`ParityEnv.reset`::

    {"id": "p0", "parity": "odd", "low": 1, "high": 9, "tries": 2}

The agent replies with a number; a wrong one (the other parity, out of range, or no number) is answered
with what was wrong and costs a try. Reward 1 if a reply had the asked parity, else 0. Everything the
engine needs is the five methods of ``trace_train.envs.base.Environment``; the state is one immutable
tuple, so snapshots are cheap and exact.
"""

from __future__ import annotations

import re

SYSTEM_PROMPT = "You name numbers. Reply with exactly one whole number and nothing else."
_INTEGER = re.compile(r"-?\d+")


class ParityEnv:
    """Rows: ``parity`` ("odd" or "even"), ``low``, ``high``, ``tries``. Option: ``system_prompt``."""

    def __init__(self, *, system_prompt: str = SYSTEM_PROMPT):
        self.system_prompt = system_prompt
        self._state: tuple | None = None  # (parity, low, high, tries left, solved)

    def reset(self, row):
        missing = {"parity", "low", "high", "tries"} - set(row)
        if missing:
            raise ValueError(f"parity rows need the keys {sorted(missing)}; got {sorted(row)}")
        if row["parity"] not in ("odd", "even"):
            raise ValueError(f"`parity` must be 'odd' or 'even', got {row['parity']!r}")
        self._state = (row["parity"], int(row["low"]), int(row["high"]), int(row["tries"]), False)
        task = f"Name an {row['parity']} number from {row['low']} to {row['high']}. You have {row['tries']} tries."
        return [{"role": "system", "content": self.system_prompt}, {"role": "user", "content": task}]

    def step(self, action: str):
        from trace_train.envs.base import StepResult

        parity, low, high, tries, _ = self._state
        match = _INTEGER.search(action)
        n = int(match.group()) if match else None
        solved = n is not None and low <= n <= high and (n % 2 == 1) == (parity == "odd")
        self._state = (parity, low, high, tries - 1, solved)
        if solved:
            return StepResult(f"Correct: {n} is {parity}.", done=True)
        why = "no number" if n is None else f"{n} is out of range" if not low <= n <= high else f"{n} is not {parity}"
        return StepResult(f"Wrong: {why}. Try again.", done=tries - 1 == 0, invalid=n is None)

    def verify(self) -> float:
        return 1.0 if self._state[4] else 0.0

    def snapshot(self):
        return self._state

    def restore(self, snapshot) -> None:
        self._state = snapshot
