"""Environment calls always end: a hung step, reset or verifier in a one-worker environment ends its own
rollout at env_timeout_s, the calls queued behind it run, and no stuck worker holds the process."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from trace_train.envs import EndReason, EpisodeLimits, GuessNumberEnv, StepResult, is_concurrency_safe
from trace_train.rollout.env_calls import (CallClock, EnvCallPool, EnvTimeout, abandoned_calls, describe_error,
                                           reward_value)

from .test_scheduler import POOL, make_engine

HUNG = POOL[0]["target"]
"""Rows with this target hang in the call under test; the others must finish normally."""
LIVENESS_S = 240
"""How long the test waits for a rollout call before calling it hung (the limits under test are 1 s)."""


class _Release:
    event = threading.Event()


class OneWorkerEnv(GuessNumberEnv):
    """Guess-the-number, declared not concurrency-safe (one worker, like examples/parity_game), whose
    ``hang`` call blocks on rows of target ``HUNG`` until the test ends."""

    concurrency_safe = False
    hang = "step"

    def _maybe_hang(self, call: str, target: int) -> None:
        if call == self.hang and target == HUNG:
            _Release.event.wait(LIVENESS_S * 2)

    def reset(self, row):
        self._maybe_hang("reset", row["target"])
        return super().reset(row)

    def step(self, action):
        self._maybe_hang("step", self.state.target)
        return super().step(action)

    def verify(self):
        self._maybe_hang("verify", self.state.target)
        return super().verify()


def _rollout_within_limit(engine, pool):
    """``engine.rollout(pool)`` in a thread; fails the test when it has not returned in LIVENESS_S."""
    out: dict = {}

    def go():
        try:
            out["batch"] = engine.rollout(pool, seed=0)
        except BaseException as error:  # noqa: BLE001 - re-raised in the test thread
            out["error"] = error

    thread = threading.Thread(target=go, daemon=True)
    thread.start()
    thread.join(LIVENESS_S)
    assert not thread.is_alive(), "the rollout call is held by a hung environment call"
    if "error" in out:
        raise out["error"]
    return out["batch"]


@pytest.mark.parametrize("call", ["step", "reset", "verify"])
@pytest.mark.parametrize("schedule", ["concurrent", "lockstep"])
def test_a_hung_call_in_a_one_worker_environment_ends_only_its_rollout(hf_backend, call, schedule):
    env = type(f"Hung{call.title()}", (OneWorkerEnv,), {"hang": call})
    assert not is_concurrency_safe(env)
    _Release.event.clear()
    try:
        batch = _rollout_within_limit(
            make_engine(hf_backend, env, policy="grpo", env_timeout_s=1.0, schedule=schedule), POOL)
    finally:
        _Release.event.set()
    f = batch.forest
    targets = np.asarray([POOL[int(p)]["target"] for p in f.prompt])
    hung = [n for n in f.leaves if targets[n] == HUNG]
    others = [n for n in f.leaves if targets[n] != HUNG]
    reasons = {batch.nodes[n].end_reason for n in hung}
    assert hung and others
    assert EndReason.ENV_TIMEOUT in reasons and np.all(f.reward[hung] == 0)
    if call == "reset":  # the row never opened: each of its rollouts ends at its first call
        assert reasons == {EndReason.ENV_TIMEOUT}
    other_reasons = {batch.nodes[n].end_reason for n in others}
    assert EndReason.ENV_TIMEOUT not in other_reasons and EndReason.ENV_ERROR not in other_reasons
    assert batch.report.end_reasons["env_timeout"] == sum(batch.nodes[n].end_reason == EndReason.ENV_TIMEOUT
                                                          for n in f.leaves)
    if call == "reset":
        assert "reset" in batch.report.env_error_sample


def test_the_pool_replaces_a_stuck_worker_and_never_holds_the_exit():
    """One worker, one call hung: the calls queued behind it still run; the stuck thread is a daemon."""
    release = threading.Event()
    pool = EnvCallPool(1, 0.5, name="trace-env-test")
    before = abandoned_calls()

    def hang(clock):
        return clock("step", release.wait, LIVENESS_S)

    def quick(clock, x):
        return clock("step", lambda: x * 2)

    try:
        stuck = pool.submit(CallClock(), hang)
        queued = [pool.submit(CallClock(), quick, i) for i in range(5)]
        t0 = time.perf_counter()
        while not all(f.done() for f in [stuck, *queued]) and time.perf_counter() - t0 < LIVENESS_S:
            time.sleep(0.05)
            pool.expire()
        assert isinstance(stuck.exception(timeout=0), EnvTimeout)
        assert "step() ran past env_timeout_s=0.5 s" in str(stuck.exception())
        assert [f.result(timeout=0) for f in queued] == [0, 2, 4, 6, 8]
        assert abandoned_calls() == before + 1
        workers = [t for t in threading.enumerate() if t.name.startswith("trace-env-test")]
        assert workers and all(t.daemon for t in workers)
        with pytest.raises(EnvTimeout):  # run: the same deadline, waited for
            pool.run(CallClock(), hang)
    finally:
        release.set()
        pool.shutdown()


class Unprintable(Exception):
    def __str__(self):
        raise RuntimeError("no")


class StepReturnsNone(GuessNumberEnv):
    def step(self, action):
        return None


class HugeReward(GuessNumberEnv):
    def verify(self):
        return 10 ** 5000


class UnprintableStep(GuessNumberEnv):
    def step(self, action):
        raise Unprintable()


@pytest.mark.parametrize("env,context_ends", [(StepReturnsNone, False), (HugeReward, False), (HugeReward, True),
                                              (UnprintableStep, False)])
def test_the_engines_own_failure_path_ends_one_rollout(hf_backend, env, context_ends):
    """None from step, a huge-integer reward (on any end, the context's included), an exception whose
    message cannot be printed: environment errors of their rollouts, reward 0, the call goes on."""
    changes = {}
    if context_ends:  # room for one 8-token action, not for its observation: the context ends the rollout
        probe = make_engine(hf_backend, env)
        prompt = max(len(probe.chat.prompt_ids(GuessNumberEnv().reset(row))) for row in POOL[:2])
        changes["limits"] = EpisodeLimits(max_turns=4, max_turn_tokens=8, max_context_tokens=prompt + 10)
    batch = make_engine(hf_backend, env, policy="grpo", **changes).rollout(POOL[:2], seed=0)
    leaves = batch.forest.leaves
    stepped = [n for n in leaves if batch.nodes[n].end_reason not in (EndReason.TURN_TOKENS,)]
    assert stepped and all(batch.nodes[n].end_reason == EndReason.ENV_ERROR for n in stepped)
    assert np.all(batch.forest.reward[leaves] == 0)
    sample = batch.report.env_error_sample
    assert {"StepReturnsNone": "step() returned None", "HugeReward": "an integer of 16610 bits",
            "UnprintableStep": "Unprintable: <message could not be printed>"}[env.__name__] in sample


def test_reward_values_and_error_descriptions_never_raise():
    assert reward_value(1) == 1.0 and reward_value(np.float32(0.5)) == 0.5
    for bad in (10 ** 400, "x", None, float("nan"), [1]):
        with pytest.raises(ValueError, match="verify"):
            reward_value(bad)
    assert describe_error(Unprintable()) == "Unprintable: <message could not be printed>"
    assert describe_error(KeyError("k")) == "KeyError: 'k'"
    assert StepResult  # the type whose absence (None) is an error


def test_calls_that_were_late_but_returned_do_not_count_as_stuck(monkeypatch):
    """Issue 52, item 3: the refusal counts calls stuck now, not every call ever late (1,024 late calls that
    returned used to disable the pool for the rest of the process)."""
    from trace_train.rollout import env_calls

    monkeypatch.setattr(env_calls, "MAX_ABANDONED", 2)
    before = abandoned_calls()
    pool = EnvCallPool(2, 0.2, name="trace-env-late")

    def late(clock):
        return clock("step", time.sleep, 0.6)

    try:
        for _ in range(3):  # each round: two calls past their deadline that then return
            for future in [pool.submit(CallClock(), late) for _ in range(2)]:
                with pytest.raises(EnvTimeout):
                    while not future.done():
                        time.sleep(0.02)
                        pool.expire()
                    future.result(timeout=0)
            t0 = time.perf_counter()
            while abandoned_calls() > before and time.perf_counter() - t0 < LIVENESS_S:
                time.sleep(0.05)
            assert abandoned_calls() == before
        assert pool.run(CallClock(), lambda clock: clock("step", lambda: 7)) == 7
    finally:
        pool.shutdown()


def test_calls_stuck_at_once_refuse_new_work_with_the_stuck_error(monkeypatch):
    from trace_train.rollout import env_calls

    release = threading.Event()
    monkeypatch.setattr(env_calls, "MAX_ABANDONED", abandoned_calls() + 2)
    pool = EnvCallPool(2, 0.2, name="trace-env-stuck")
    try:
        stuck = [pool.submit(CallClock(), lambda clock: clock("step", release.wait, LIVENESS_S)) for _ in range(2)]
        while not all(f.done() for f in stuck):
            time.sleep(0.02)
            pool.expire()
        with pytest.raises(env_calls.EnvCallsStuck, match="stuck past env_timeout_s at once"):
            pool.submit(CallClock(), lambda clock: 1)
    finally:
        release.set()
        pool.shutdown()
