"""The rollout scheduler: concurrent environments, order-independent batches, failures end one rollout."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from trace_train.backends.base import Sampling
from trace_train.rollout.batch import BatchBuilder, NodePayload
from trace_train.chat import ChatFormat
from trace_train.rollout.engine import RolloutConfig, RolloutEngine
from trace_train.envs import (EndReason, EpisodeLimits, GuessNumberEnv, is_concurrency_safe, make_env_factory,
                              make_rows)
from trace_train.envs.latency import Latency, with_latency
from trace_train.rollout.scheduler import EnvFailure, GrowReport, ScheduleConfig, Scheduler, Timeline

from .test_engine import TurnPredictor

POOL = make_rows(6, high=8, max_guesses=4, seed=1)
LIMITS = EpisodeLimits(max_turns=4, max_turn_tokens=8, max_context_tokens=512)


def make_engine(backend, make_env=GuessNumberEnv, **changes):
    config = RolloutConfig(**{"policy": "trace", "roots": 8, "continuations_per_root": 1, "group_size": 4,
                              "limits": LIMITS, "env_workers": 8, **changes})
    return RolloutEngine(backend, make_env, config)


def assert_same_batch(a, b):
    fa, fb = a.forest, b.forest
    for name in ("parent", "prompt", "origin", "cost", "is_leaf"):
        np.testing.assert_array_equal(getattr(fa, name), getattr(fb, name), err_msg=name)
    np.testing.assert_array_equal(fa.reward, fb.reward)
    for na, nb in zip(a.nodes, b.nodes):
        assert na.token_ids == nb.token_ids and na.end_reason == nb.end_reason
        np.testing.assert_allclose(na.action_logprobs, nb.action_logprobs, atol=1e-4)


def planted(chat, prompts):
    """A builder with a root per pool row of ``prompts`` (as the engine plants them); returns it and the roots."""
    builder = BatchBuilder()
    roots = []
    for prompt in prompts:
        env = GuessNumberEnv()
        messages = env.reset(POOL[prompt])
        roots.append(builder.add_root(prompt, POOL[prompt], messages, chat.prompt_ids(messages), env.snapshot()))
    return builder, roots


def make_scheduler(backend, make_env=GuessNumberEnv, **changes):
    chat = ChatFormat(backend.tokenizer)
    sampling = Sampling(max_new_tokens=LIMITS.max_turn_tokens, stop_token_ids=chat.stop_token_ids)
    return Scheduler(backend, make_env, chat, sampling, ScheduleConfig(LIMITS, **{"env_workers": 4, **changes}))


def test_the_scheduler_grows_a_builder_and_reports_without_an_engine(hf_backend):
    """Grown from a builder alone, with the same rollouts on either schedule; the report says the rest."""
    grown = []
    for schedule in ("concurrent", "lockstep"):
        scheduler = make_scheduler(hf_backend, schedule=schedule)
        builder, roots = planted(scheduler.chat, [0, 1])
        bare = scheduler.grow(builder, [(roots[0], "bare", 3), (roots[1], "bare", 2)], seed=7)
        forest = builder.build()
        assert forest.n_leaves == 5 and bare.seeds == 5 * LIMITS.max_turns
        assert sum(bare.end_reasons.values()) == 5 and len(bare.rollout_env_seconds) == 5
        assert bare.continuation_prefix_tokens == 0 and bare.env_error_sample is None
        anchor = next(n for n in range(len(forest)) if forest.parent[n] >= 0 and not forest.is_leaf[n])
        more = scheduler.grow(builder, [(anchor, "continuation", 2)], seed=7 + bare.seeds)
        assert more.continuation_prefix_tokens == 2 * len(builder.context_ids(anchor))
        total = bare + more
        assert (GrowReport() + bare).end_reasons == bare.end_reasons
        assert sum(total.end_reasons.values()) == 7 and total.seeds == 7 * LIMITS.max_turns
        assert len(total.timeline.generation) == len(bare.timeline.generation) + len(more.timeline.generation)
        forest = builder.build()
        assert forest.n_leaves == 7 and len(forest.children(anchor)) == 3
        for n in range(len(forest)):  # each node's context is its parent's plus its own turn
            p = int(forest.parent[n])
            above = builder.context_ids(p) if p >= 0 else []
            assert builder.context_ids(n) == above + list(builder.nodes[n].token_ids)
            assert forest.cost[n] == len(builder.nodes[n].action_ids)
        grown.append([p.token_ids for p in builder.nodes])
    assert grown[0] == grown[1]


def test_the_builder_has_one_path_for_a_growing_and_a_built_batch():
    builder = BatchBuilder()
    root = builder.add_root(3, {"id": "r"}, ({"role": "user", "content": "go"},), (1, 2), "s0")

    def turn(action, observation):
        return NodePayload(action, (-0.5,) * len(action), "x", observation, "y",
                           ({"role": "assistant", "content": "x"},), None)

    first = builder.add_turn(root, turn((10, 11), (12,)))
    leaf = builder.add_turn(first, turn((20,), ()))
    branch = builder.add_turn(first, turn((30, 31), ()))
    builder.finish(leaf, 1.0)
    builder.finish(branch, 0.0)
    assert builder.path(branch) == [root, first, branch]
    assert builder.context_ids(branch) == [1, 2, 10, 11, 12, 30, 31]
    h = builder.history(first)
    assert (h.prompt, h.row, h.depth, h.token_ids, len(h.messages)) == (3, {"id": "r"}, 1, (1, 2, 10, 11, 12), 2)
    forest = builder.build()
    np.testing.assert_array_equal(forest.cost, [0, 2, 1, 2])
    batch = builder.batch(forest, np.full(len(forest), np.nan), report=None)
    for n in range(len(forest)):
        assert batch.path(n) == builder.path(n) and batch.history(n) == builder.history(n)
        assert batch.context_ids(n) == builder.context_ids(n) and batch.messages(n) == builder.messages(n)
    traj = batch.trajectory(branch)
    assert traj.loss_mask.tolist() == [0, 0, 1, 1, 0, 1, 1] and traj.node.tolist() == [0, 0, 1, 1, 1, 3, 3]
    with pytest.raises(ValueError, match="`node` must be a node id in \\[0, 3\\], got 4"):
        builder.path(4)


class OrderRecorder:
    """Wraps a factory; records the order in which steps of the environments it built finished."""

    def __init__(self, make_env):
        self.make_env, self.finished, self.lock = make_env, [], threading.Lock()
        self.concurrency_safe = is_concurrency_safe(make_env)

    def __call__(self):
        env, recorder = self.make_env(), self

        class Recorded:
            def __getattr__(self, name):
                return getattr(env, name)

            def step(self, action):
                result = env.step(action)
                with recorder.lock:
                    recorder.finished.append((id(self), env.inner.state.target, len(env.inner.state.guesses)))
                return result

        return Recorded()


def test_a_batch_does_not_depend_on_the_order_in_which_environments_answer(hf_backend):
    """Random step latency reorders completions between runs; the batch stays the lockstep batch."""
    runs, orders = [], []
    for _ in range(2):
        recorder = OrderRecorder(with_latency(GuessNumberEnv, Latency(0.01, "exponential")))
        runs.append(make_engine(hf_backend, recorder).rollout(POOL, predictor=TurnPredictor(), seed=3))
        orders.append([(target, guesses) for _, target, guesses in recorder.finished])
    assert orders[0] != orders[1]  # the environments did answer in a different order
    lockstep = make_engine(hf_backend, schedule="lockstep").rollout(POOL, predictor=TurnPredictor(), seed=3)
    assert_same_batch(runs[0], runs[1])
    assert_same_batch(runs[0], lockstep)
    assert runs[0].report.continuations > 0


@pytest.mark.slow
def test_vllm_streams_requests_into_the_running_batch_with_the_lockstep_result(vllm_backend):
    slow = with_latency(GuessNumberEnv, Latency(0.01, "exponential"))
    concurrent = make_engine(vllm_backend, slow).rollout(POOL, predictor=TurnPredictor(), seed=4)
    lockstep = make_engine(vllm_backend, schedule="lockstep").rollout(POOL, predictor=TurnPredictor(), seed=4)
    assert_same_batch(concurrent, lockstep)
    with pytest.raises(EnvFailure):  # a run that raises mid-way leaves no request behind in the engine
        make_engine(vllm_backend, FaultyEnv, policy="grpo", raise_env_errors=True).rollout(POOL, seed=0)
    assert not vllm_backend.llm.llm_engine.has_unfinished_requests()


class FaultyEnv(GuessNumberEnv):
    """Guess-the-number whose ``step`` raises on one target and whose ``verify`` raises on another."""

    bad_step, bad_verify = POOL[0]["target"], POOL[1]["target"]

    def step(self, action):
        if self.state.target == self.bad_step:
            raise KeyError("a bug in the environment's step")
        return super().step(action)

    def verify(self):
        if self.state.target == self.bad_verify:
            raise ValueError("a bug in the verifier")
        return super().verify()


@pytest.mark.parametrize("schedule", ["concurrent", "lockstep"])
def test_an_environment_that_raises_ends_its_rollouts_not_the_batch(hf_backend, schedule):
    pool = [POOL[0], POOL[1], *[row for row in POOL if row["target"] not in (POOL[0]["target"],
                                                                          POOL[1]["target"])]]
    batch = make_engine(hf_backend, FaultyEnv, policy="grpo", schedule=schedule).rollout(pool, seed=0)
    f = batch.forest
    targets = np.asarray([pool[p]["target"] for p in f.prompt])
    bad = np.isin(targets, [FaultyEnv.bad_step, FaultyEnv.bad_verify])
    leaves = f.leaves
    failed = [n for n in leaves if batch.nodes[n].end_reason == EndReason.ENV_ERROR]
    stepped_bad = [n for n in leaves if bad[n] and batch.nodes[n].finish_reason == "stop"]
    assert set(failed) >= set(stepped_bad) and stepped_bad  # every failing call ended its rollout
    assert set(failed) <= set(np.flatnonzero(bad))  # and no other rollout
    assert np.all(f.reward[failed] == 0)
    assert batch.report.end_reasons["env_error"] == len(failed)
    assert batch.report.rollouts == f.n_leaves == batch.report.bare_rollouts


def test_raise_env_errors_turns_a_failure_back_into_an_exception(hf_backend):
    engine = make_engine(hf_backend, FaultyEnv, policy="grpo", raise_env_errors=True)
    with pytest.raises(EnvFailure, match="KeyError: .a bug in the environment's step"):
        engine.rollout(POOL[:1], seed=0)


class HangingEnv(GuessNumberEnv):
    """``step`` on one target blocks until the test releases it."""

    concurrency_safe = True
    release = threading.Event()

    def step(self, action):
        if self.state.target == POOL[0]["target"]:
            self.release.wait(60)
        return super().step(action)


def test_a_step_past_its_time_limit_ends_its_rollout_with_reward_zero(hf_backend):
    try:
        batch = make_engine(hf_backend, HangingEnv, policy="grpo", env_timeout_s=0.5).rollout(POOL, seed=0)
    finally:
        HangingEnv.release.set()
    f = batch.forest
    hung = [n for n in f.leaves if POOL[int(f.prompt[n])]["target"] == POOL[0]["target"]]
    reasons = {batch.nodes[n].end_reason for n in hung}
    assert hung and EndReason.ENV_TIMEOUT in reasons
    assert reasons <= {EndReason.ENV_TIMEOUT, EndReason.TURN_TOKENS}  # cut turns never reach the environment
    assert np.all(f.reward[hung] == 0)
    others = [n for n in f.leaves if n not in hung]
    assert others and all(batch.nodes[n].end_reason != EndReason.ENV_TIMEOUT for n in others)


class Overlap:
    """Environments that count how many of their steps run at the same time."""

    def __init__(self, safe: bool):
        self.active = self.most = 0
        self.lock = threading.Lock()
        self.concurrency_safe = safe
        self.barrier = threading.Barrier(2, timeout=30) if safe else None

    def __call__(self):
        outer = self

        class Counting(GuessNumberEnv):
            def step(self, action):
                with outer.lock:
                    outer.active += 1
                    outer.most = max(outer.most, outer.active)
                try:
                    if outer.barrier is not None and not outer.barrier.broken:
                        outer.barrier.wait()  # returns only when two steps run at once
                        outer.barrier.abort()  # proven once; later steps pass straight through
                    return super().step(action)
                except threading.BrokenBarrierError:
                    return super().step(action)
                finally:
                    with outer.lock:
                        outer.active -= 1

        return Counting()


@pytest.mark.parametrize("safe", [True, False])
def test_only_environments_declared_safe_are_stepped_concurrently(hf_backend, safe):
    counter = Overlap(safe)
    batch = make_engine(hf_backend, counter, policy="grpo").rollout(POOL, seed=0)
    assert "env_error" not in batch.report.end_reasons
    assert (counter.most >= 2) if safe else (counter.most == 1)


def test_environments_declare_whether_they_are_safe_to_run_concurrently():
    assert is_concurrency_safe(GuessNumberEnv) and is_concurrency_safe(make_env_factory("guess_number"))
    assert not is_concurrency_safe(lambda: GuessNumberEnv())  # a factory that names no class: serial
    assert is_concurrency_safe(with_latency(GuessNumberEnv, Latency(0.1)))


def test_the_report_says_where_the_time_went(hf_backend):
    slow = with_latency(GuessNumberEnv, Latency(0.002))
    batch = make_engine(hf_backend, slow, policy="grpo").rollout(POOL, seed=0)
    r = batch.report
    assert 0 < r.generation_seconds <= r.seconds and 0 < r.env_seconds <= r.seconds
    assert r.overlap_seconds <= min(r.generation_seconds, r.env_seconds)
    assert r.env_seconds <= r.env_call_seconds and 0 < r.max_rollout_env_seconds <= r.env_call_seconds
    assert r.generator_idle_share == pytest.approx(1 - r.generation_seconds / r.seconds)


def test_timeline_measures_unions_and_overlaps_exactly():
    t = Timeline()
    t.generation += [(0.0, 2.0), (5.0, 6.0)]
    for interval in [(1.0, 3.0), (2.5, 4.0), (5.5, 7.0)]:
        t.add_env(*interval)
    r = t.report(10.0)
    assert r["generation_seconds"] == 3.0 and r["env_seconds"] == 4.5 and r["env_call_seconds"] == 5.0
    assert r["overlap_seconds"] == 1.5 and r["generator_idle_share"] == pytest.approx(0.7)


def test_bad_scheduler_settings_fail_with_clear_messages():
    with pytest.raises(ValueError, match="`schedule` must be one of"):
        RolloutConfig(schedule="async")
    with pytest.raises(ValueError, match="`env_workers` must be a positive integer"):
        RolloutConfig(env_workers=0)
    with pytest.raises(ValueError, match="`env_timeout_s` must be a positive number"):
        RolloutConfig(env_timeout_s=0)
    with pytest.raises(ValueError, match="`schedule` must be one of"):
        ScheduleConfig(schedule="async")
    with pytest.raises(ValueError, match="`config` must be a ScheduleConfig"):
        Scheduler(None, GuessNumberEnv, None, Sampling(), RolloutConfig())
    with pytest.raises(ValueError, match="`distribution` must be one of"):
        Latency(0.1, "pareto")


def test_the_concurrency_benchmark_reports_every_setting(tiny_dir, tmp_path):
    from trace_train.bench.concurrency import ConcurrencyBenchConfig, main

    config = ConcurrencyBenchConfig(backends=("hf",), latencies=("0ms", "50ms"), prompts=2, group_size=2,
                                    turns=2, env_workers=4, examples=1, model=tiny_dir,
                                    out=str(tmp_path / "b.json"))
    rows = main(config)["backends"]["hf"]
    for latency in ("0ms", "50ms"):
        for schedule in ("lockstep", "concurrent"):
            row = rows[f"{latency}/{schedule}"]
            assert row["rollouts"] == 4 and row["bound_ratio"] >= 1.0  # wall >= each of its parts
    assert (tmp_path / "b.json").exists()
    with pytest.raises(ValueError, match="`schedules` must be a non-empty subset"):
        ConcurrencyBenchConfig(schedules=("async",))


def test_the_barrier_benchmark_runs_every_arm_side_by_side(tiny_dir, tmp_path):
    from trace_train.bench.barrier import ARMS, BenchConfig, main, occupancy_by_tenth

    config = BenchConfig(backends=("hf",), pool=4, token_budget=120, repeats=2, max_guesses=(1, 3),
                         examples=1, model=tiny_dir, out=str(tmp_path / "b.json"))
    result = main(config)["backends"]["hf"]
    for arm, (policy, expansion, _) in ARMS.items():
        runs = result["runs"][arm]
        assert len(runs) == 2 and all(r["policy"] == policy and r["generated_tokens"] > 0 for r in runs)
        assert all(r["streamed"] == (arm in ("trace_streamed", "trace_eager", "trace_eager_lag1")) for r in runs)
        assert all(r["expansion"] == expansion for r in runs)
        assert len(result["summary"][arm]["occupancy_by_tenth"]) == 10
    assert result["summary"]["grpo"]["per_token_ratio_to_grpo"] == 1.0
    assert (tmp_path / "b.json").exists()
    # occupancy: the samples held by the last generation step begun before each tenth of the call
    run = {"seconds": 1.0, "occupancy": [[0.0, 8], [0.25, 4], [0.85, 2]]}
    assert occupancy_by_tenth(run) == [8, 8, 8, 4, 4, 4, 4, 4, 4, 2]
    with pytest.raises(ValueError, match=r"`backends` must be a non-empty subset of \('hf', 'vllm'\)"):
        BenchConfig(backends=("tpu",))
    with pytest.raises(ValueError, match="`max_guesses` must be positive guess budgets"):
        BenchConfig(max_guesses=(0,))
