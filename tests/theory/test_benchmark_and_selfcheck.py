"""The benchmark and self-check entry points run (their timings are not tested, only their answers)."""

import shutil
from pathlib import Path

from trace_theory import benchmark, selfcheck


def test_benchmark_scaling_table_reports_consistent_utilities():
    result = benchmark.run(sizes=(1_000, 2_000))
    assert set(result) == {"roots", "prefixes"}
    for rows in result.values():
        assert [row["n"] for row in rows] == [1_000, 2_000]
        for row in rows:
            assert row["floor_ms"] > 0 and row["trace_ms"] > 0 and row["heap_greedy_ms"] > 0
            # Floor and ours are timed in pairs; every pair is kept, wall and CPU time.
            assert len(row["repeats"]) == 7 and row["trace_over_floor"] > 0
            assert set(row["repeats"][0]) == {"floor_ms", "floor_cpu_ms", "trace_ms", "trace_cpu_ms"}
            # The exact allocators are never worse than the greedy baselines.
            assert row["trace_utility"] >= row["heap_greedy_utility"] - 1e-9
    assert result["roots"][0]["budget"] == 8_000
    table = benchmark.format_table(result)
    assert len(table.splitlines()) == 6 and "ours/floor" in table and "CPU-time ratio" in table


def test_against_times_both_checkouts_on_the_same_inputs(tmp_path):
    """``--against``: two workers, each importing its own checkout's trace_theory; a checkout whose
    allocator answers differently is reported as such (here a copy that places one unit fewer)."""
    root = Path(benchmark.__file__).resolve().parents[1]
    other = tmp_path / "other"
    shutil.copytree(root / "trace_theory", other / "trace_theory", ignore=shutil.ignore_patterns("__pycache__"))
    same = benchmark.against(other, sizes=(2_000,), calls=4)
    assert same["rows"][0]["same_counts"] and len(same["rows"][0]["calls"]) == 4
    assert same["rows"][0]["median_speedup"] > 0
    allocate = other / "trace_theory" / "allocate.py"
    source = allocate.read_text()
    assert "        return water_fill(q, prompt, budget, room=cap)\n" in source
    allocate.write_text(source.replace("        return water_fill(q, prompt, budget, room=cap)\n",
                                       "        out = water_fill(q, prompt, budget, room=cap)\n"
                                       "        out.k[out.k.argmax()] -= 1\n        return out\n"))
    assert not benchmark.against(other, sizes=(2_000,), calls=2)["rows"][0]["same_counts"]


def test_selfcheck_passes(capsys):
    assert selfcheck.main() == 0
    assert "6/6 checks passed" in capsys.readouterr().out
