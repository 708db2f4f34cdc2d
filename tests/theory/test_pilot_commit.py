"""Pilot-Commit: the budget is never exceeded, the committed prompts are exactly those whose pilot lies in
the band, pilots stay in their groups, and a step is a function of its seed."""

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from trace_theory import Origin, RolloutBudget, get_policy, run_step
from trace_theory.dynamic_sampling import commit_counts, in_band, pilot_prompts

from .test_step import ScriptedWorld


@settings(max_examples=200, deadline=None)
@given(
    pilot=st.integers(1, 5),
    extra=st.integers(1, 8),
    budget=st.integers(0, 120),
    pool=st.integers(1, 30),
    lo=st.sampled_from([0.0, 0.1, 0.25, 0.5]),
    width=st.sampled_from([0.25, 0.5, 1.0]),
    share=st.sampled_from([0.1, 0.25, 0.5, 0.9, 1.0]),
    seed=st.integers(0, 2**32 - 1),
)
@example(pilot=2, extra=6, budget=7, pool=4, lo=0.0, width=1.0, share=0.5, seed=0)  # below G: one pilot, no commit
@example(pilot=3, extra=1, budget=2, pool=4, lo=0.0, width=1.0, share=0.5, seed=0)  # below one pilot: nothing
def test_commits_never_exceed_the_budget_and_are_exactly_the_band(pilot, extra, budget, pool, lo, width, share, seed):
    group_size, band = pilot + extra, (lo, min(1.0, lo + width))
    n = pilot_prompts(budget, pilot, pool, share)
    assert n * pilot <= budget and n <= pool and (n > 0) == (budget >= pilot and pool > 0)
    s = np.random.default_rng(seed).integers(0, pilot + 1, n)
    commit, top_up = commit_counts(s, pilot=pilot, group_size=group_size, budget=budget, band=band)
    assert (commit >= 0).all() and (top_up >= 0).all()
    spent = n * pilot + commit.sum() + top_up.sum()
    assert spent <= budget
    if n:
        assert spent == budget  # nothing left unspent once a pilot ran
    rate = s / pilot
    wanted = (rate > band[0]) & (rate < band[1])
    # the prompts in the band, in pool order, as many as the rest of the budget pays for
    affordable = (budget - n * pilot) // extra
    assert np.flatnonzero(commit).tolist() == np.flatnonzero(wanted)[:affordable].tolist()
    assert set(np.unique(commit)) <= {0, extra}
    if commit.any():  # top-ups go to committed groups only
        assert not top_up[commit == 0].any()


def test_in_band_is_an_open_interval_on_the_pilot_rate():
    assert in_band([0, 1, 2, 3, 4], 4, (0.25, 0.75)).tolist() == [False, False, True, False, False]
    assert in_band([0, 1, 2, 3, 4], 4).tolist() == [False, True, True, True, False]
    with pytest.raises(ValueError, match="`pilot` must be at least 1 and at least every success count, got 2"):
        in_band([3], 2)


def _pilot_rates(forest, pilot):
    """Successes of each tree's first ``pilot`` bare rollouts (its pilot), in tree order."""
    starts = np.flatnonzero(forest.starts_rollout & (forest.origin == Origin.BARE))
    s = np.zeros(len(forest.roots), dtype=np.int64)
    for t in range(len(forest.roots)):
        mine = starts[forest.tree_index[starts] == t][:pilot]
        s[t] = int(forest.reward[forest.factual_leaf[mine]].sum())
    return s


@settings(max_examples=40, deadline=None)
@given(roots=st.integers(0, 60), pilot=st.integers(1, 3), band=st.sampled_from([(0.0, 1.0), (0.2, 0.8), (0.0, 0.6)]),
       seed=st.integers(0, 2**32 - 1))
def test_a_step_commits_the_band_and_keeps_the_pilots(roots, pilot, band, seed):
    pool, g = 24, 4
    policy = get_policy("pilot_commit", group_size=g, pilot=pilot, pilot_band=band)
    world = ScriptedWorld(pool, seed=seed % 1000)
    record = run_step(world, policy, RolloutBudget(roots), pool=pool, rng=np.random.default_rng(seed))
    forest = record.forest.validate()
    assert record.rollouts == forest.n_leaves <= roots
    n = min(pool, max(roots // (2 * pilot), 1)) if roots >= pilot else 0  # the default share: 1/2
    if n:
        assert forest.n_leaves == roots
        assert [e[0] for e in world.log] == ["plant"] + (["grow"] if roots > n * pilot else [])
    s = _pilot_rates(forest, pilot)
    assert len(s) == n
    wanted = np.flatnonzero(in_band(s, pilot, band)) if n else np.zeros(0, dtype=np.int64)
    affordable = (roots - n * pilot) // (g - pilot)
    assert record.committed.tolist() == wanted[:affordable].tolist()
    # pilots stay in their groups: a committed prompt's group holds its pilot and at least G - p more
    groups = np.zeros(pool, dtype=np.int64)
    groups[forest.prompt[forest.roots]] = forest.n_children[forest.roots]
    assert np.array_equal(groups, record.groups)
    assert (record.groups[record.committed] >= g).all()
    assert record.counts["bare"] == n * pilot + (g - pilot) * record.committed.size


def test_a_step_is_a_function_of_the_seed():
    policy = get_policy("pilot_commit", group_size=4)
    runs = [run_step(ScriptedWorld(24, seed=3), policy, RolloutBudget(40), pool=24, rng=np.random.default_rng(7))
            for _ in range(2)]
    a, b = (r.forest for r in runs)
    assert np.array_equal(a.parent, b.parent) and np.array_equal(a.reward, b.reward, equal_nan=True)
    assert np.array_equal(runs[0].committed, runs[1].committed) and runs[0].rounds == 2


def test_the_default_commits_mixed_pilots_to_groups_of_g():
    """Scripted: prompt i's rollouts succeed iff the rollout index is odd or i is even, so odd prompts'
    pilots of 2 mix; 40 rollouts, G = 8: 10 pilots (half the budget), commits for 1, 3 and 5 (18: 7 and 9
    are in the band but the budget is spent), 2 left top up 1 and 3."""

    class Alternating(ScriptedWorld):
        def _rollout(self, start, origin):
            j = self.started.get(start, 0)
            self.started[start] = j + 1
            node = self.builder.add_turn(start, origin=origin)
            self._add(node, start, self.node_prompt[start], 1)
            self.builder.finish(node, float(j % 2 == 1 or self.node_prompt[start] % 2 == 0))

    record = run_step(Alternating(12), get_policy("pilot_commit"), RolloutBudget(40), pool=12,
                      rng=np.random.default_rng(0))
    assert record.committed.tolist() == [1, 3, 5]
    assert record.groups.tolist() == [2, 9, 2, 9, 2, 8, 2, 2, 2, 2, 0, 0]
    assert record.counts == {"bare": 38, "top_up": 2, "continuation": 0} and record.rollouts == 40


@pytest.mark.parametrize("changes, message", [
    ({"pilot": 8}, r"`pilot` must lie in \[1, group_size\) = \[1, 8\), got 8"),
    ({"pilot_band": (0.5, 0.5)}, r"`pilot_band` must be two rates \(lo, hi\) with 0 <= lo < hi <= 1"),
    ({"pilot": None, "pilot_band": (0.2, 0.8)}, "`pilot_band` and `pilot_share` are settings of Pilot-Commit"),
    ({"pilot_share": 0.0}, r"`pilot_share` must be a share of the budget in \(0, 1\], got 0.0"),
    ({"root_rule": "active"}, "Pilot-Commit is defined for uniform roots"),
])
def test_bad_settings_fail_with_one_clear_line(changes, message):
    with pytest.raises(ValueError, match=message):
        get_policy("pilot_commit", **changes)


def test_a_band_from_yaml_is_a_list_and_becomes_a_tuple():
    policy = get_policy("pilot_commit", pilot_band=[0.2, 0.8])
    assert policy.pilot_band == (0.2, 0.8) and hash(policy)
