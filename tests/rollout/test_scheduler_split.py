"""The scheduler split into its timeline, walkers and environment turns: the same names, the same batches,
and its records (``Start`` or plain start tuples, ``Extra`` top-ups) read the same way."""

from __future__ import annotations

import types

import numpy as np
import pytest

from trace_theory.step import Branch as PrefixBranch
from trace_theory.step import Start
from trace_train.envs import GuessNumberEnv
from trace_train.envs.latency import Latency, with_latency
from trace_train.rollout import env_calls, env_turns, scheduler, timeline, walkers

from .test_scheduler import make_scheduler, planted

SLOW = with_latency(GuessNumberEnv, Latency(0.01, "exponential"))


def test_every_name_is_still_importable_from_the_scheduler_and_is_the_moved_object():
    assert scheduler.Timeline is timeline.Timeline and scheduler.GrowReport is timeline.GrowReport
    assert scheduler.EnvFailure is env_calls.EnvFailure and scheduler.OpeningFailed is env_calls.OpeningFailed
    assert scheduler.BATCH_WINDOW_S == 0.02
    for name in scheduler.__all__ + ["Extra", "Prefix", "Scheduler", "BATCH_WINDOW_S", "Boundary", "Finished", "Rest"]:
        assert hasattr(scheduler, name), name
    assert env_turns.EnvTurns and walkers.Walker and walkers.Anchor(3, 1) == (3, 1)


def test_extra_keeps_its_constructor_and_names_its_top_ups():
    top_up, more = scheduler.Extra(2, None, 3), scheduler.Extra(1, 0, 2)
    assert top_up.is_top_up and not more.is_top_up
    assert tuple(top_up) == (2, None, 3) and (more.start, more.prefix, more.count) == (1, 0, 2)


def _same_growth(a, b):
    fa, fb = a.build(), b.build()
    for name in ("parent", "prompt", "origin", "is_leaf"):
        np.testing.assert_array_equal(getattr(fa, name), getattr(fb, name), err_msg=name)
    np.testing.assert_array_equal(fa.reward, fb.reward)
    assert [n.token_ids for n in a.nodes] == [n.token_ids for n in b.nodes]
    assert [n.end_reason for n in a.nodes] == [n.end_reason for n in b.nodes]


def test_starts_as_records_or_plain_tuples_grow_the_same_batch(hf_backend):
    grown = []
    for as_record in (True, False, None):
        s = make_scheduler(hf_backend, SLOW if as_record is None else GuessNumberEnv)
        builder, roots = planted(s.chat, [0, 1])
        starts = [(roots[0], "bare", 2), (roots[1], "bare", 3)]
        if as_record:
            starts = [Start(*start) for start in starts]
        elif as_record is None:  # mixed, and environments answering in a random order
            starts = [Start(*starts[0]), starts[1]]
        report = s.grow(builder, starts, seed=11)
        assert sum(report.end_reasons.values()) == 5 and report.seeds == 5 * s.config.limits.max_turns
        grown.append(builder)
    _same_growth(grown[0], grown[1])
    _same_growth(grown[0], grown[2])


def _grow_streamed(backend, top_up_prefix, make_env=GuessNumberEnv):
    """Streamed expansion through the scheduler alone: one continuation from each start's first prefix as
    it ends; then ``rest`` adds one more continuation per start with prefixes and a top-up at each start."""
    s = make_scheduler(backend, make_env)
    builder, roots = planted(s.chat, [0, 1])
    seen = {}

    def branch(start, prefixes):
        seen[start] = len(prefixes)
        return [1 if a == 0 else 0 for a in range(len(prefixes))]

    def rest():
        more = [scheduler.Extra(start, 0, 1) for start, n in sorted(seen.items()) if n]
        return more + [scheduler.Extra(0, top_up_prefix, 1), types.SimpleNamespace(start=1, prefix=None, count=1)]

    report = s.grow(builder, [Start(roots[0], "bare", 2), (roots[1], "bare", 2)], seed=5, branch=branch, rest=rest)
    with_prefixes = sum(1 for n in seen.values() if n)
    assert sum(report.end_reasons.values()) == 4 + 2 * with_prefixes + 2
    forest = builder.build()
    assert [int(forest.parent[r]) for r in roots] == [-1, -1]
    assert sum(len(forest.children(r)) for r in roots) == 4 + 2  # bare rollouts and the two top-ups
    return builder


def test_streamed_top_ups_are_the_same_whether_rest_says_none_or_minus_one(hf_backend):
    none = _grow_streamed(hf_backend, None)
    _same_growth(none, _grow_streamed(hf_backend, -1))
    _same_growth(none, _grow_streamed(hf_backend, None, SLOW))  # whatever order environments answer in


@pytest.mark.parametrize("bad", [scheduler.Extra(0, -2, 1), scheduler.Extra(2, None, 1), scheduler.Extra(0, None, -1)])
def test_rest_returning_no_such_start_prefix_or_count_is_refused(hf_backend, bad):
    s = make_scheduler(hf_backend)
    builder, roots = planted(s.chat, [0, 1])
    with pytest.raises(ValueError, match="no such start, prefix or count"):
        s.grow(builder, [(roots[0], "bare", 1), (roots[1], "bare", 1)], seed=1,
               branch=lambda start, prefixes: [0] * len(prefixes), rest=lambda: [bad])


def _grow_eager(backend, make_env=GuessNumberEnv):
    """Eager expansion: a continuation from the first boundary of each start's first walker, and a top-up
    at each start when its first walker ends."""
    s = make_scheduler(backend, make_env)
    builder, roots = planted(s.chat, [0, 1])
    told = []

    def boundary(start, j, depth, prefix):
        told.append(("boundary", start, j, depth))
        assert np.isnan(prefix.reward) and prefix.depth == depth
        return [PrefixBranch(depth, 1)] if j == 0 and depth == 1 else []

    def finished(start, j, length, reward):
        told.append(("finished", start, j, length))
        return [PrefixBranch(0, 1)] if j == 0 else []

    report = s.grow(builder, [(roots[0], "bare", 2), Start(roots[1], "bare", 2)], seed=9,
                    boundary=boundary, finished=finished)
    assert sorted(t[1:3] for t in told if t[0] == "finished") == [(0, 0), (0, 1), (1, 0), (1, 1)]
    continuations = sum(1 for t in told if t[0] == "boundary" and t[2] == 0 and t[3] == 1)
    assert sum(report.end_reasons.values()) == 4 + continuations + 2
    return builder


def test_eager_continuations_and_top_ups_do_not_depend_on_timing(hf_backend):
    _same_growth(_grow_eager(hf_backend), _grow_eager(hf_backend, SLOW))


def test_the_passes_of_a_streamed_rollouts_seeds_are_named_and_fixed():
    """The pass is part of a streamed rollout's seed: its values may not move (a run resumes on them)."""
    from trace_train.rollout.scheduler import Pass, _seeds

    assert [int(p) for p in (Pass.TREE_ENDED, Pass.REST_CONTINUATION, Pass.REST_TOP_UP, Pass.EAGER)] == [0, 1, 2, 3]
    assert _seeds(7, 1, 2, Pass.REST_TOP_UP)(3) == _seeds(7, 1, 2, 2)(3)
