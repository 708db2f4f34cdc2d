"""The timeline's interval arithmetic and the grow report's sum (``trace_train.rollout.timeline``)."""

from __future__ import annotations

import pytest

from trace_train.rollout.timeline import GrowReport, Timeline, _intersect, _measure, _union


def test_union_merges_overlapping_and_touching_intervals_in_any_order():
    assert _union([]) == []
    assert _union([(5.0, 6.0), (0.0, 2.0), (1.0, 3.0)]) == [(0.0, 3.0), (5.0, 6.0)]
    assert _union([(0.0, 1.0), (1.0, 2.0)]) == [(0.0, 2.0)]  # touching: one interval
    assert _union([(0.0, 10.0), (2.0, 3.0), (4.0, 5.0)]) == [(0.0, 10.0)]  # nested
    assert _union([(3.0, 4.0), (0.0, 1.0)]) == [(0.0, 1.0), (3.0, 4.0)]


def test_intersect_keeps_only_time_covered_by_both():
    xs, ys = [(0.0, 2.0), (5.0, 6.0)], [(1.0, 4.0), (5.5, 7.0)]
    assert _intersect(xs, ys) == [(1.0, 2.0), (5.5, 6.0)]
    assert _intersect(ys, xs) == [(1.0, 2.0), (5.5, 6.0)]
    assert _intersect([(0.0, 1.0)], [(1.0, 2.0)]) == []  # touching is no overlap
    assert _intersect([(0.0, 10.0)], [(1.0, 2.0), (3.0, 4.0), (9.0, 12.0)]) == [(1.0, 2.0), (3.0, 4.0), (9.0, 10.0)]
    assert _intersect([], [(0.0, 1.0)]) == []


def test_measure_sums_lengths():
    assert _measure([]) == 0.0
    assert _measure([(0.0, 2.0), (5.0, 5.5)]) == 2.5
    assert _measure(_union([(0.0, 2.0), (1.0, 3.0)])) == 3.0  # overlap counted once after a union


def test_the_report_weights_samples_in_flight_by_time_and_handles_an_empty_wall():
    t = Timeline()
    t.generation += [(0.0, 1.0), (1.0, 4.0)]
    t.in_flight += [2, 6]
    r = t.report(8.0)
    assert r["generation_polls"] == 2 and r["generation_seconds"] == 4.0
    assert r["samples_in_flight"] == pytest.approx((1 * 2 + 3 * 6) / 4)
    assert r["env_seconds"] == 0.0 and r["overlap_seconds"] == 0.0 and r["generator_idle_share"] == 0.5
    empty = Timeline().report(0.0)
    assert empty["samples_in_flight"] == 0.0 and empty["generator_idle_share"] == 0.0


def test_timelines_add_up_intervals_first_one_first_without_changing_either():
    a, b = Timeline(), Timeline()
    a.generation.append((0.0, 1.0))
    a.in_flight.append(3)
    a.add_env(0.5, 2.0)
    b.generation.append((2.0, 3.0))
    b.in_flight.append(1)
    b.add_env(1.5, 2.5)
    joined = a + b
    assert joined.generation == [(0.0, 1.0), (2.0, 3.0)] and joined.in_flight == [3, 1]
    assert joined.env == [(0.5, 2.0), (1.5, 2.5)]
    assert joined.report(4.0)["env_seconds"] == 2.0 and joined.report(4.0)["env_call_seconds"] == 2.5
    assert a.env == [(0.5, 2.0)] and b.generation == [(2.0, 3.0)]


def test_grow_reports_add_up_field_by_field():
    a = GrowReport(seeds=8, continuation_prefix_tokens=10, continuation_prefix_cached=4,
                   end_reasons={"done": 2, "env_error": 1}, rollout_env_seconds=(0.1, 0.2),
                   env_error_sample=None)
    a.timeline.add_env(0.0, 1.0)
    b = GrowReport(seeds=4, continuation_prefix_tokens=6, continuation_prefix_cached=6,
                   end_reasons={"done": 1, "context": 3}, rollout_env_seconds=(0.3,), env_error_sample="first")
    b.timeline.add_env(2.0, 3.0)
    c = GrowReport(env_error_sample="second")
    total = a + b + c
    assert (total.seeds, total.continuation_prefix_tokens, total.continuation_prefix_cached) == (12, 16, 10)
    assert total.end_reasons == {"done": 3, "env_error": 1, "context": 3}
    assert total.rollout_env_seconds == (0.1, 0.2, 0.3)
    assert total.env_error_sample == "first"  # the first failure, in call order
    assert total.timeline.env == [(0.0, 1.0), (2.0, 3.0)]
    assert a.end_reasons == {"done": 2, "env_error": 1}  # the addends are left as they were
    empty = GrowReport() + GrowReport()
    assert (empty.seeds, empty.end_reasons, empty.rollout_env_seconds, empty.env_error_sample) == (0, {}, (), None)
