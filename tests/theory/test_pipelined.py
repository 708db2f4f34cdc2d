"""Pipelined expansion in the step driver (``trace_theory.pipelined``) against the scripted world of
``test_step``: a step's continuations, grown in the next step's wave, are the barrier's node for node."""

import pickle

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from trace_theory import POLICIES, Pending, RolloutBudget, get_policy, run_pipelined_step, run_step
from trace_theory.expansion import Wave
from trace_theory.pipelined import pipelines

from .test_step import ScriptedWorld, record_total


class PipelinedScripted(ScriptedWorld):
    """A scripted world per step: a wave (``plant`` with a :class:`Wave`) plants here and grows the pending
    step's starts in the world that planted it (its outcomes are fixed by node id, as the barrier's would be)."""

    def plant(self, prompts, counts, events=None):
        if not isinstance(events, Wave):
            return super().plant(prompts, counts, events)
        pending = events.pending
        self.log.append(("wave", len(prompts), None if pending is None else pending.starts.tuples()))
        forest = self.plant(prompts, counts) if len(prompts) else None
        if pending is not None:
            events.grown = pending.carried.grow(pending.starts)
        return forest

    def carry(self):
        return self


PIPELINING = [n for n in POLICIES.names() if pipelines(get_policy(n), RolloutBudget(8, 2))]


def _pipelined(name, budget, *, pool=16, seed=0, horizon=3, cap=None):
    """Step 1 (fill), then the drain: the first step's trees, whole."""
    policy = get_policy(name, max_per_anchor=cap)
    rng = np.random.default_rng(seed)
    first = run_pipelined_step(PipelinedScripted(pool, seed=seed, horizon=horizon), policy, budget, pool=pool,
                               rng=rng, pending=None)
    last = run_pipelined_step(PipelinedScripted(pool, seed=seed, horizon=horizon), policy, budget, pool=pool,
                              rng=rng, pending=first.pending, plant=False)
    return first, last


def test_the_pipelining_policies_are_the_streamable_branching_ones():
    assert {"trace", "trace_tokens", "trace_beta", "uniform_tree"} <= set(PIPELINING)
    assert not {"grpo", "dapo", "root_only", "random_prefix"} & set(PIPELINING)
    assert not pipelines(get_policy("trace"), RolloutBudget(8, 0))
    assert not pipelines(get_policy("trace"), RolloutBudget(8, 2), expansion_rounds=2)


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(PIPELINING), roots=st.integers(2, 30), continuations=st.integers(1, 4),
       horizon=st.integers(1, 5), cap=st.sampled_from([None, 1]), seed=st.integers(0, 2**32 - 1))
@example(name="trace", roots=8, continuations=3, horizon=1, cap=None, seed=0)  # no prefix: all top-ups
def test_a_pipelined_step_completed_next_wave_is_the_barriers_node_for_node(name, roots, continuations, horizon,
                                                                            cap, seed):
    budget, pool = RolloutBudget(roots, continuations), 24
    first, last = _pipelined(name, budget, pool=pool, seed=seed % 1000, horizon=horizon, cap=cap)
    barrier = run_step(ScriptedWorld(pool, seed=seed % 1000, horizon=horizon), get_policy(name, max_per_anchor=cap),
                       budget, pool=pool, rng=np.random.default_rng(seed))
    assert first.trained is None and last.pending is None and first.pending.record.expansion == "pipelined"
    done = last.trained
    for attr in ("parent", "prompt", "depth", "origin", "is_leaf"):
        np.testing.assert_array_equal(getattr(done.forest, attr), getattr(barrier.forest, attr), err_msg=attr)
    np.testing.assert_array_equal(done.forest.reward, barrier.forest.reward)
    assert done.counts == barrier.counts and np.array_equal(done.groups, barrier.groups)
    for attr in ("prompt_ids", "prompt_v", "node_ids", "node_v", "node_round"):
        np.testing.assert_array_equal(getattr(done, attr), getattr(barrier, attr), err_msg=attr)
    assert done.forest.n_leaves == record_total(done) == budget.total  # the whole budget, over two waves
    # The wave held only the bare rollouts: the deferred starts are the pending's, grown next wave.
    assert len(first.pending.record.forest) == len(first.wave)
    assert done.forest.n_leaves - first.wave.n_leaves == first.pending.rollouts


def test_each_wave_grows_this_steps_bare_rollouts_and_the_previous_steps_continuations_together():
    """Every rollout is grown inside a wave (one generation phase per step), and wave s grows step s's
    bare rollouts and exactly what step s - 1 decided."""
    events = []

    class Logged(PipelinedScripted):
        def plant(self, prompts, counts, wave=None):
            if isinstance(wave, Wave):
                events.append(("wave",))
                out = super().plant(prompts, counts, wave)
                events.append(("end",))
                return out
            events.append(("plant", id(self), int(counts.sum())))
            return super().plant(prompts, counts)

        def grow(self, starts):
            events.append(("grow", id(self), int(starts.count.sum())))
            return super().grow(starts)

    policy, budget, rng = get_policy("trace"), RolloutBudget(12, 2), np.random.default_rng(0)
    worlds, pending, steps = [], None, []
    for _ in range(3):
        worlds.append(Logged(12))
        steps.append(run_pipelined_step(worlds[-1], policy, budget, pool=12, rng=rng, pending=pending))
        pending = steps[-1].pending
    assert steps[0].trained is None and all(s.trained is not None for s in steps[1:])
    waves, inside = [], False
    for event in events:
        if event[0] == "wave":
            waves.append([])
            inside = True
        elif event[0] == "end":
            inside = False
        else:
            assert inside, f"{event[0]} outside a wave"
            waves[-1].append(event)
    assert len(waves) == 3
    for s, wave in enumerate(waves):
        assert ("plant", id(worlds[s]), 12) in wave
        grown = [e for e in wave if e[0] == "grow"]
        if s == 0:
            assert not grown
        else:
            decided = steps[s - 1].pending
            assert grown == [("grow", id(worlds[s - 1]), decided.rollouts)]
            assert decided.rollouts == steps[s].trained.counts["continuation"] + steps[s].trained.counts["top_up"]


def test_a_policy_that_does_not_pipeline_is_an_ordinary_step_trained_at_once():
    world = PipelinedScripted(12)
    step = run_pipelined_step(world, get_policy("grpo"), RolloutBudget(16, 0), pool=12,
                              rng=np.random.default_rng(0), pending=None)
    assert step.pending is None and step.trained.expansion == "barrier" and step.trained.forest.n_leaves == 16
    first, _ = _pipelined("trace", RolloutBudget(8, 2))
    with pytest.raises(ValueError, match="policy 'grpo' does not pipeline, but a pending step was passed"):
        run_pipelined_step(world, get_policy("grpo"), RolloutBudget(16, 0), pool=12, rng=np.random.default_rng(0),
                           pending=first.pending)
    assert run_pipelined_step(world, get_policy("trace"), RolloutBudget(8, 2), pool=12, rng=np.random.default_rng(0),
                              pending=None, plant=False) == type(step)(None, None)


def test_a_pending_step_survives_pickling_and_completes_the_same():
    """What a checkpoint holds: the pending, pickled and loaded, completes to the same trees."""
    first, last = _pipelined("trace_tokens", RolloutBudget(12, 3), seed=4)
    first_again = run_pipelined_step(PipelinedScripted(16, seed=4), get_policy("trace_tokens"), RolloutBudget(12, 3),
                                     pool=16, rng=np.random.default_rng(4), pending=None)
    loaded = pickle.loads(pickle.dumps(first_again.pending))
    again = run_pipelined_step(PipelinedScripted(16, seed=4), get_policy("trace_tokens"), RolloutBudget(12, 3),
                               pool=16, rng=np.random.default_rng(0), pending=loaded, plant=False)
    np.testing.assert_array_equal(again.trained.forest.parent, last.trained.forest.parent)
    np.testing.assert_array_equal(again.trained.forest.reward, last.trained.forest.reward)


def test_a_world_that_grows_anything_but_the_pending_starts_is_refused():
    first, _ = _pipelined("trace", RolloutBudget(12, 3), seed=2)
    assert first.pending.rollouts > 0

    class Skipping(PipelinedScripted):
        def plant(self, prompts, counts, wave=None):
            starts = wave.pending.starts
            fewer = type(starts)(starts.node, starts.kind, np.maximum(starts.count - 1, 0))
            wave.grown = wave.pending.carried.grow(fewer)

    with pytest.raises(ValueError, match="grew .* rollouts from nodes other than the pending starts'"):
        run_pipelined_step(Skipping(16), get_policy("trace"), RolloutBudget(12, 3), pool=16,
                           rng=np.random.default_rng(0), pending=first.pending, plant=False)
    with pytest.raises(ValueError, match="`pending` must be a Pending or None, got dict"):
        run_pipelined_step(PipelinedScripted(16), get_policy("trace"), RolloutBudget(12, 3), pool=16,
                           rng=np.random.default_rng(0), pending={})
    assert isinstance(first.pending, Pending)
