"""A per-episode tool-call budget: how many tool calls an episode may still make.

The budget is a plain counter, so its state is the integer :attr:`ToolCallBudget.used`, and
``snapshot``/``restore`` are exact. Environments call :meth:`ToolCallBudget.charge` once per requested
call; a refused call must not be executed and gets :data:`BUDGET_EXHAUSTED` as its observation.
"""

from __future__ import annotations

BUDGET_EXHAUSTED = "Error: the tool-call budget of this episode is exhausted; give your final answer now."


class ToolCallBudget:
    """At most ``limit`` tool calls per episode."""

    def __init__(self, limit: int):
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 0:
            raise ValueError(f"`limit` must be a non-negative integer, got {limit!r}")
        self.limit = limit
        self.used = 0

    @property
    def remaining(self) -> int:
        return self.limit - self.used

    @property
    def exhausted(self) -> bool:
        return self.used >= self.limit

    def charge(self) -> bool:
        """Spend one call if any is left; return whether the call may run."""
        if self.exhausted:
            return False
        self.used += 1
        return True

    def snapshot(self) -> int:
        return self.used

    def restore(self, used: int) -> None:
        if not isinstance(used, int) or isinstance(used, bool) or not 0 <= used <= self.limit:
            raise ValueError(f"`used` must be an integer in [0, {self.limit}], got {used!r}")
        self.used = used
