"""``rollout.expansion=eager`` in the engine: the step driver's turn-boundary decisions on real rollouts."""

from __future__ import annotations

import numpy as np
import pytest

from trace_theory import Origin
from trace_train.envs import GuessNumberEnv
from trace_train.rollout.engine import RolloutConfig, RolloutEngine

from .test_engine import (LIMITS, UNEVEN, SlowGuessNumberEnv, TurnPredictor, _bare_and_branches, branch_starts,
                          make_engine)


def _same(a, b):
    for name in ("parent", "prompt", "reward", "origin", "cost"):
        np.testing.assert_array_equal(getattr(a.forest, name), getattr(b.forest, name), err_msg=name)
    assert [n.action_ids for n in a.nodes] == [n.action_ids for n in b.nodes]


@pytest.mark.parametrize("name", ["trace", "trace_tokens"])
def test_reserve_one_is_streamed_node_for_node(backend, name):
    kw = dict(policy=name, roots=8, continuations_per_root=2, pool_size=len(UNEVEN), env_workers=4)
    streamed = make_engine(backend, expansion="streamed", **kw).rollout(UNEVEN, predictor=TurnPredictor(), seed=4)
    eager = make_engine(backend, expansion="eager", eager_reserve=1.0, **kw).rollout(
        UNEVEN, predictor=TurnPredictor(), seed=4)
    assert streamed.report.continuations > 0
    _same(streamed, eager)
    assert np.array_equal(streamed.predictions, eager.predictions, equal_nan=True)


@pytest.mark.parametrize("reserve, lag", [(0.0, 1), (0.5, 1), (0.0, 0)])
def test_eager_commits_at_turn_boundaries_and_extends_exact_tokens(backend, reserve, lag):
    kw = dict(policy="trace", roots=8, continuations_per_root=2, pool_size=len(UNEVEN), env_workers=4)
    engine = make_engine(backend, expansion="eager", eager_reserve=reserve, eager_lag=lag, **kw)
    eager = engine.rollout(UNEVEN, predictor=TurnPredictor(), seed=4)
    barrier = make_engine(backend, expansion="barrier", **kw).rollout(UNEVEN, predictor=TurnPredictor(), seed=4)
    f = eager.forest.validate()
    assert f.n_leaves == barrier.forest.n_leaves == 8 * 3  # rollout-priced: exactly M (1 + N)
    assert eager.report.continuations + eager.report.top_up_rollouts == 16
    assert engine.eager_threshold is not None  # carried to the next call
    # the same bare rollouts as the barrier (top-ups aside: one-turn rollouts' budgets top up at once)
    mine = {key: [t[0] for t in turns] for key, turns in _bare_and_branches(eager).items()}
    theirs = {key: [t[0] for t in turns] for key, turns in _bare_and_branches(barrier).items()}
    common = set(mine) & set(theirs)
    assert len(common) >= 8 and all(mine[k] == theirs[k] for k in common)
    for b in branch_starts(f):
        anchor = int(f.parent[b])
        assert eager.trajectory(int(f.factual_leaf[b])).token_ids[: len(eager.context_ids(anchor))].tolist() \
            == eager.context_ids(anchor)
        assert f.origin[anchor] == Origin.BARE


def test_eager_decisions_do_not_depend_on_environment_timing(hf_backend):
    """Environments that answer in a shuffled order (random sleeps): the same batch, node for node, as
    the lockstep schedule's."""

    Slow = SlowGuessNumberEnv

    def run(env, **changes):
        config = RolloutConfig(policy="trace", roots=8, continuations_per_root=2, group_size=4, limits=LIMITS,
                               env_workers=8, expansion="eager", eager_reserve=0.25, **changes)
        return RolloutEngine(hf_backend, env, config).rollout(UNEVEN, predictor=TurnPredictor(), seed=9)

    a, b = run(Slow), run(Slow)
    _same(a, b)
    assert a.report.continuations > 0
    _same(a, run(GuessNumberEnv, schedule="lockstep"))


def test_a_round_of_boundaries_predicted_together_decides_as_one_at_a_time(hf_backend, monkeypatch):
    """The engine predicts the turn boundaries of one scheduler round in one predictor call (``ahead``); with
    an n-gram predictor of random weights, the batch and every prediction are those of asking at each
    boundary alone, to the last bit."""
    import trace_train.rollout.scheduler as scheduler
    predictor, sizes = _counted_ngram()

    def run():
        kw = dict(policy="trace", roots=8, continuations_per_root=2, pool_size=len(UNEVEN), env_workers=4)
        return make_engine(hf_backend, expansion="eager", **kw).rollout(UNEVEN, predictor=predictor, seed=4)

    together = run()
    batched = max(sizes)
    grow = scheduler.Scheduler.grow
    monkeypatch.setattr(scheduler.Scheduler, "grow", lambda self, *a, ahead=None, **kw: grow(self, *a, **kw))
    sizes.clear()
    alone = run()
    assert batched > 1 and max(sizes) == len(UNEVEN)  # rounds of several; alone, only the prompts' one call
    assert len(set(together.predictions[np.isfinite(together.predictions)].round(6))) > 3
    _same(together, alone)
    assert np.array_equal(together.predictions, alone.predictions, equal_nan=True)


@pytest.mark.parametrize("lag", [-1, 2, True, 0.5])
def test_eager_lag_is_zero_or_one(lag):
    with pytest.raises(ValueError, match=r"`eager_lag` must be 0 or 1 \(turns between a prefix and its decision\)"):
        RolloutConfig(expansion="eager", eager_lag=lag)


def test_eager_lag_zero_decides_without_the_next_prediction(hf_backend):
    """lag 0 decides each prefix on its own prediction as it forms, lag 1 once the next one is known: with
    predictions that change along a rollout the two place different continuations (the knob is live), and
    lag 0 needs no generation poll more than lag 1."""
    kw = dict(policy="trace", roots=8, continuations_per_root=4, pool_size=len(UNEVEN), env_workers=4,
              expansion="eager")
    now = make_engine(hf_backend, eager_lag=0, **kw).rollout(UNEVEN, predictor=TurnPredictor(), seed=4)
    later = make_engine(hf_backend, eager_lag=1, **kw).rollout(UNEVEN, predictor=TurnPredictor(), seed=4)
    assert now.report.continuations > 0 and later.report.continuations > 0
    anchors = lambda b: sorted(int(b.forest.parent[s]) for s in branch_starts(b.forest))  # noqa: E731
    assert anchors(now) != anchors(later)
    assert now.report.generation_polls <= later.report.generation_polls


def test_the_report_and_the_metrics_say_when_continuations_were_placed(hf_backend):
    """``continuations_by_phase`` splits every continuation of a streamed or eager call by when it was placed
    (the step driver's ``node_phase``) and the step metrics carry it: eager places some at turn boundaries
    and, on these uneven games, some at rollout ends; streamed places none before its trees end; the barrier
    reports no split at all."""
    from trace_train.run.step_metrics import PLACEMENTS, placement_metrics

    kw = dict(policy="trace", roots=8, continuations_per_root=2, pool_size=len(UNEVEN), env_workers=4)
    run = lambda expansion: make_engine(hf_backend, expansion=expansion, **kw).rollout(  # noqa: E731
        UNEVEN, predictor=TurnPredictor(), seed=4)
    eager, streamed, barrier = run("eager"), run("streamed"), run("barrier")
    for batch in (eager, streamed):
        phases = batch.report.continuations_by_phase
        assert len(phases) == 4 and sum(phases) == batch.report.continuations > 0
        metrics = placement_metrics(batch.report)
        assert tuple(metrics[k] for k in PLACEMENTS[:4]) == phases
        assert metrics["top_ups_at_rollout_ends"] == batch.report.top_ups_at_rollout_ends
    boundary, at_end, _, _ = eager.report.continuations_by_phase
    assert boundary > 0 and at_end + eager.report.top_ups_at_rollout_ends > 0
    assert 0 < eager.report.top_ups_at_rollout_ends <= eager.report.top_up_rollouts  # UNEVEN has one-turn games
    assert streamed.report.continuations_by_phase[:2] == (0, 0) and streamed.report.top_ups_at_rollout_ends == 0
    assert barrier.report.continuations_by_phase == () and placement_metrics(barrier.report) == {}


def test_calibration_by_depth_reaches_the_step_metrics(hf_backend):
    from trace_train.run.step_metrics import _calibration_metrics

    batch = make_engine(hf_backend, expansion="eager", roots=8, continuations_per_root=2, pool_size=len(UNEVEN),
                        env_workers=4).rollout(UNEVEN, predictor=TurnPredictor(), seed=1)
    metrics = _calibration_metrics(batch)
    assert {"predictor_brier_depth_0", "predictor_ece_depth_0", "predictor_brier_depth_1",
            "predictor_miscalibrated"} <= set(metrics)
    assert all(0.0 <= v <= 1.0 for v in metrics.values())


def test_eager_expansion_resumes_exactly(tmp_path):
    """The threshold carried from step to step is part of the checkpoint: a resumed run is the same run.
    Lockstep turns: under the concurrent schedule a loaded machine can split a turn's walkers over two
    generation calls, and transformers' left padding then flips a near-tied sample now and then
    (``trace_train.rollout.scheduler``, "What is reproducible"), which is not what this test is about."""
    from trace_train.train import main

    from tests.train.test_trainer import _same_run, small_config

    eager = ("rollout.expansion=eager", "rollout.schedule=lockstep")
    main(small_config(tmp_path / "straight", *eager))
    main(small_config(tmp_path / "resumed", "steps=2", *eager))
    main(small_config(tmp_path / "resumed", *eager))
    a = _same_run(tmp_path / "straight", tmp_path / "resumed")
    assert a.extra["eager_threshold"] is not None
    from trace_train.run.metrics_log import read_metrics
    from trace_train.run.step_metrics import PLACEMENTS

    rows = [r for r in read_metrics(tmp_path / "straight" / "metrics.jsonl") if "continuations" in r]
    assert rows and all(sum(r[k] for k in PLACEMENTS[:4]) == r["continuations"] for r in rows)  # logged, whole


def test_top_ups_are_priced_as_units_of_the_continuation_budget(hf_backend):
    """A one-turn bare rollout's eager budget tops up its prompt at once. The running token estimates then
    read the planted bare rollouts alone (the plan's M; a top-up's start comes after theirs) and count a
    top-up's tokens as a unit of the continuation budget beside the continuations: before, the cheap
    one-turn top-ups were priced as continuations and a token budget was under-spent."""
    from trace_train.rollout.engine import _planted_and_top_ups, _rollout_tokens

    config = RolloutConfig(policy="trace", token_budget=400, continuations_per_root=1, group_size=4, limits=LIMITS,
                           pool_size=len(UNEVEN), expansion="eager")
    engine = RolloutEngine(hf_backend, GuessNumberEnv, config)
    prior = engine.continuation_cost_ratio
    batch = engine.rollout(UNEVEN, predictor=TurnPredictor(), seed=2)
    f, report = batch.forest, batch.report
    planted, top_ups = _planted_and_top_ups(f, report.top_up_rollouts)
    assert report.top_up_rollouts > 0 and len(planted) == report.planned.roots
    turns = {int(s): len(f.path_to_root(int(f.factual_leaf[s]))) - 1 for s in planted}
    one_turn_trees = {int(f.tree_index[s]) for s, n in turns.items() if n == 1}
    assert {int(f.tree_index[s]) for s in top_ups} <= one_turn_trees  # each top-up follows a one-turn rollout
    bare = np.mean([_rollout_tokens(f, s) for s in planted])
    continuations = np.flatnonzero(f.starts_rollout & (f.origin == Origin.CONTINUATION))
    units = np.mean([_rollout_tokens(f, s) for s in np.concatenate([continuations, top_ups])])
    assert engine.tokens_per_rollout == pytest.approx(bare)
    assert engine.continuation_cost_ratio == pytest.approx(0.5 * (prior + units / bare))


def test_trees_ending_in_one_poll_are_predicted_together_and_decide_as_one_at_a_time(hf_backend, monkeypatch):
    """Streamed expansion: the trees whose bare rollouts all ended in the same generation poll are predicted
    in one predictor call (``ending``); with an n-gram predictor of random weights, the batch and every
    prediction are those of predicting each tree alone, to the last bit, in fewer calls."""
    import trace_train.rollout.scheduler as scheduler
    predictor, sizes = _counted_ngram()

    def run():
        kw = dict(policy="trace", roots=8, continuations_per_root=2, pool_size=len(UNEVEN), env_workers=4,
                  schedule="lockstep")  # every environment answers before the next poll: the same polls each run
        return make_engine(hf_backend, expansion="streamed", **kw).rollout(UNEVEN, predictor=predictor, seed=4)

    together = run()
    calls_together = len(sizes)
    grow = scheduler.Scheduler.grow
    monkeypatch.setattr(scheduler.Scheduler, "grow", lambda self, *a, ending=None, **kw: grow(self, *a, **kw))
    sizes.clear()
    alone = run()
    assert together.report.continuations > 0 and calls_together < len(sizes)
    _same(together, alone)
    assert np.array_equal(together.predictions, alone.predictions, equal_nan=True)


def _counted_ngram():
    """An n-gram predictor with random weights that records the number of histories of each call."""
    from trace_train.configs import PredictorConfig
    from trace_train.predictors import build_predictor

    predictor = build_predictor(PredictorConfig(kind="ngram"))
    predictor.weights = np.random.default_rng(0).normal(0.0, 3.0, predictor.weights.shape)
    sizes: list[int] = []

    class Counted(type(predictor)):
        def __call__(self, histories):
            sizes.append(len(histories))
            return super().__call__(histories)

    predictor.__class__ = Counted
    return predictor, sizes
