"""``trace_train.bench.newcomer``'s arithmetic: the paired gain's standard error over seeds, the verdict, the
comparison with the flat run of the same seed, and the diagnosis read from ``trace-eval``'s transcripts."""

from __future__ import annotations

import json

import pytest

from trace_train.bench import newcomer


def test_mean_se_is_the_standard_error_over_seeds_and_the_verdict_is_two_of_them():
    out = newcomer.mean_se([0.1, 0.2, 0.3])
    assert out["mean"] == pytest.approx(0.2) and out["se"] == pytest.approx(0.1 / 3 ** 0.5, abs=1e-4)
    assert out["above_2se"] is True                                   # 0.2 > 2 x 0.0577
    assert newcomer.mean_se([0.1, -0.1, 0.05])["above_2se"] is False
    assert newcomer.mean_se([0.3])["above_2se"] is False              # one seed decides nothing


def test_summary_pairs_each_setting_with_the_flat_run_of_the_same_seed():
    def row(setting, seed, start, end):
        return {"setting": setting, "seed": seed, "held_out_success_start": start, "held_out_success_end": end,
                "gain": end - start, "all_fail_group_share": 0.5, "all_fail_regime_step": None}

    rows = [row("flat", 0, 0.0, 0.1), row("flat", 1, 0.0, 0.0), row("warm", 0, 0.3, 0.4), row("warm", 1, 0.3, 0.2)]
    summary = newcomer.summarise(rows)
    assert summary["warm"]["end_minus_flat_end"]["mean"] == pytest.approx(0.25)  # (0.3 + 0.2) / 2
    assert summary["warm"]["gain"]["mean"] == pytest.approx(0.0) and "end_minus_flat_end" not in summary["flat"]


def test_diagnosis_counts_allowed_numbers_and_success_by_turns(tmp_path):
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"id": "a", "target": 5, "numbers": [2, 3, 5], "turns": 1}) + "\n"
                    + json.dumps({"id": "b", "target": 6, "numbers": [1, 2, 4], "turns": 2}) + "\n")
    said = lambda *texts: [{"role": "assistant", "content": t} for t in texts]  # noqa: E731
    results = tmp_path / "results.jsonl"
    results.write_text(json.dumps({"id": "a", "samples": [{"reward": 1.0, "transcript": said("5")},
                                                          {"reward": 0.0, "transcript": said("7")}]}) + "\n"
                       + json.dumps({"id": "b", "samples": [{"reward": 0.0, "transcript": said("4", "x")}]}) + "\n")
    out = newcomer.diagnose(results, rows)
    assert out["turns"] == 4 and out["allowed_number_share"] == 0.5   # "5" and "4" of 5, 7, 4, x
    assert out["success_by_row_turns"] == {"1": {"episodes": 2, "success": 0.5}, "2": {"episodes": 1, "success": 0.0}}
