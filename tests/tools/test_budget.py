import pytest

from trace_train.tools.budget import BUDGET_EXHAUSTED, ToolCallBudget


def test_budget_counts_down_and_refuses_when_spent():
    budget = ToolCallBudget(2)
    assert [budget.charge() for _ in range(4)] == [True, True, False, False]
    assert budget.used == 2 and budget.remaining == 0 and budget.exhausted
    assert "exhausted" in BUDGET_EXHAUSTED


def test_snapshot_restore_is_exact():
    budget = ToolCallBudget(3)
    budget.charge()
    snap = budget.snapshot()
    budget.charge()
    budget.charge()
    budget.restore(snap)
    assert budget.remaining == 2 and budget.charge() and budget.charge() and not budget.charge()


def test_zero_budget_refuses_everything():
    assert not ToolCallBudget(0).charge()


@pytest.mark.parametrize("limit", [-1, 1.5, True, "3"])
def test_limit_is_validated(limit):
    with pytest.raises(ValueError, match="`limit` must be a non-negative integer"):
        ToolCallBudget(limit)


def test_restore_is_validated():
    with pytest.raises(ValueError, match=r"`used` must be an integer in \[0, 2\], got 3"):
        ToolCallBudget(2).restore(3)
