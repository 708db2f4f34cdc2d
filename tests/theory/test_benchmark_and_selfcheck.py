"""The benchmark and self-check entry points run (their timings are not tested, only their answers)."""

from trace_theory import benchmark, selfcheck


def test_benchmark_quick_run_reports_consistent_utilities():
    result = benchmark.run(quick=True)
    for row in result.values():
        assert row["trace_ms"] > 0 and row["heap_greedy_ms"] > 0
        # The exact allocators are never worse than the greedy baselines.
        assert row["trace_utility"] >= row["heap_greedy_utility"] - 1e-9


def test_selfcheck_passes(capsys):
    assert selfcheck.main() == 0
    assert "6/6 checks passed" in capsys.readouterr().out
