"""The policy benchmark's pre-registered protocol (``trace_train.bench.protocol``) and pooling
(``trace_train.bench.pool``): Holm, the power analysis, fresh seeds, refusals; on result files written here."""

import json
from pathlib import Path

import numpy as np
import pytest

from trace_train.bench import policies as bench
from trace_train.bench import pool as pooling
from trace_train.bench import protocol as proto


def _result(policy, seed, gain, lr=1e-3, **extra):
    return {"policy": policy, "lr": lr, "seed": seed, "gain": gain, "success_start": 0.1, "success_end": 0.1 + gain,
            "effective_ratio": 0.5, "mixed_prompts_per_1k_rollouts": 40.0, "mixed_prompts_per_1k_tokens": 2.0,
            "contrast_pairs_per_1k_rollouts": 300.0, "generated_tokens": 1000.0, "minutes": 1.0, "steps": 5,
            "curve": [[0.0, 0.1], [5.0, 0.1 + gain], [10.0, 0.1 + gain]], "train_seconds": 10.0, **extra}


def _finished(out, gains: dict, task="mixed", lr=1e-3):
    """Finished runs ({policy: {seed: gain}}) as the benchmark leaves them: nothing trains when it reads them."""
    for policy, by_seed in gains.items():
        for seed, gain in by_seed.items():
            folder = bench.run_dir(out, task, policy, lr, seed)
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "result.json").write_text(json.dumps(_result(policy, seed, gain, lr)))


def test_holm_matches_a_hand_worked_example():
    # sorted 0.005, 0.01, 0.03, 0.04 -> x4, x3, x2, x1 = 0.02, 0.03, 0.06, 0.04 -> running max 0.06
    adjusted = proto.holm({"a": 0.01, "b": 0.04, "c": 0.03, "d": 0.005, "e": float("nan")})
    assert adjusted["d"] == pytest.approx(0.02) and adjusted["a"] == pytest.approx(0.03)
    assert adjusted["c"] == pytest.approx(0.06) and adjusted["b"] == pytest.approx(0.06)
    assert np.isnan(adjusted["e"])  # not a comparison: not counted in m
    assert proto.holm({"x": 0.6, "y": 0.7}) == {"x": 1.0, "y": 1.0}  # capped at 1


def test_seeds_needed_matches_the_paired_t_power_tables():
    """d = 0.5 (effect 0.5, pilot sd 1), alpha 0.05 two-sided, power 0.8: 34 pairs (G*Power, matched pairs:
    actual power 0.808); d = 0.8 needs 15, raised to the protocol's minimum of 24."""
    pilot = [0.0, 1.0, 2.0]  # sd 1
    assert proto.seeds_needed(pilot, 0.5, minimum=0) == 34
    assert proto._paired_power(34, 0.5, 0.05) == pytest.approx(0.808, abs=0.001)
    assert proto._paired_power(33, 0.5, 0.05) < 0.8
    assert proto.seeds_needed(pilot, 0.8, minimum=0) == 15 and proto.seeds_needed(pilot, 0.8) == 24
    assert proto.seeds_needed(pilot, -0.5) == 34  # a deficit is detected as well
    with pytest.raises(ValueError, match="`pilot_differences`"):
        proto.seeds_needed([0.1], 0.5)


def test_the_power_cli_reads_a_pilots_run_folder(tmp_path, capsys):
    _finished(tmp_path, {"trace": {1: 0.2, 2: 0.3, 3: 0.1}, "grpo": {1: 0.1, 2: 0.1, 3: 0.1}})
    assert proto.cli(["--pilot", str(tmp_path / "mixed"), "--effect", "0.05"]) == 0
    diffs = [0.1, 0.2, 0.0]
    assert f"run {proto.seeds_needed(diffs, 0.05)} (at least 24)" in capsys.readouterr().out


def test_fresh_seeds_are_deterministic_distinct_and_clear_of_earlier_and_tuning_seeds():
    one = proto.fresh_seeds(24, task="mixed", arms=["trace", "grpo"], experiment="a", avoid=[100, 101])
    assert one == proto.fresh_seeds(24, task="mixed", arms=["grpo", "trace"], experiment="a", avoid=[100, 101])
    assert len(set(one)) == 24 and all(proto.FRESH_SEEDS[0] <= s < proto.FRESH_SEEDS[1] for s in one)
    assert not set(one) & set(range(200))
    other = proto.fresh_seeds(24, task="mixed", arms=["trace", "grpo"], experiment="b")
    assert not set(one) & set(other)  # another experiment, other seeds
    avoided = proto.fresh_seeds(3, task="mixed", arms=["trace"], experiment="a", avoid=one)
    assert not set(avoided) & set(one)  # a tuning seed is never drawn


def test_fresh_seeds_on_the_command_line_are_said_and_recorded(tmp_path, capsys):
    drawn = proto.fresh_seeds(2, task="mixed", arms=["trace", "grpo"], experiment="x", avoid=[100])
    _finished(tmp_path, {"trace": dict(zip(drawn, (0.2, 0.3))), "grpo": dict(zip(drawn, (0.1, 0.1)))})
    assert bench.cli(["--policies", "trace", "grpo", "--lrs", "1e-3", "--shared-lr", "none", "--tuning-seeds",
                      "100", "--seeds", "fresh:2", "--experiment", "x", "--steps", "5", "--out", str(tmp_path)]) == 0
    assert f"drawn fresh for experiment 'x': {drawn[0]} {drawn[1]}" in capsys.readouterr().out
    summary = json.loads((tmp_path / "mixed" / "summary.json").read_text())
    assert summary["seeds"] == drawn and summary["protocol"]["seed_source"].startswith("fresh:2")
    with pytest.raises(SystemExit):
        bench.cli(["--seeds", "fresh:0", "--out", str(tmp_path)])
    assert "fresh:N with N >= 1" in capsys.readouterr().err


def test_a_registered_protocol_refuses_an_invocation_that_differs_naming_the_field(tmp_path, capsys):
    _finished(tmp_path, {"trace": {0: 0.2, 1: 0.3}, "grpo": {0: 0.1, 1: 0.1}})
    args = ["--policies", "trace", "grpo", "--lrs", "1e-3", "--shared-lr", "none", "--seeds", "0", "1",
            "--steps", "5", "--out", str(tmp_path), "--protocol"]
    assert bench.cli(args) == 0
    registered = json.loads((tmp_path / "mixed" / "protocol.json").read_text())
    assert registered["primary"] == {"reference": "trace", "against": "grpo", "metric": "gain"}
    assert registered["finished_runs_at_registration"] == 4 and registered["eval_prompts"] == 64
    summary = json.loads((tmp_path / "mixed" / "summary.json").read_text())
    assert summary["protocol_registration"]["finished_runs_at_registration"] == 4
    assert bench.cli(args) == 0  # the same protocol again: resumes
    capsys.readouterr()
    with pytest.raises(SystemExit):
        bench.cli([*args, "--alpha", "0.01"])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "registers alpha = 0.05, this invocation has 0.01" in err
    with pytest.raises(SystemExit):
        bench.cli([*args[:-1], "--primary", "trace", "dapo", "--protocol"])
    assert "--primary trace dapo: both arms must be among --policies" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench.cli([*args[:-1], "--eval-samples", "1"])
    assert "`eval.samples` >= 2" in capsys.readouterr().err


def test_the_summary_recomputes_its_verdict_from_its_per_seed_rows(tmp_path):
    """Every comparison, and the verdict, follow from ``per_seed`` and ``protocol`` alone."""
    _finished(tmp_path, {"trace": {0: 0.2, 1: 0.3, 2: 0.25, 3: 0.3}, "grpo": {0: 0.1, 1: 0.1, 2: 0.12, 3: 0.11},
                         "dapo": {0: 0.2, 1: 0.25, 2: 0.3, 3: 0.2}})
    assert bench.cli(["--policies", "trace", "grpo", "dapo", "--lrs", "1e-3", "--shared-lr", "none", "--seeds",
                      "0", "1", "2", "3", "--steps", "5", "--out", str(tmp_path), "--protocol"]) == 0
    summary = json.loads((tmp_path / "mixed" / "summary.json").read_text())
    rows = summary["per_seed"]
    assert {(r["arm"], r["seed"], r["stage"]) for r in rows} == {(a, s, "report") for a in ("trace", "grpo", "dapo")
                                                                  for s in range(4)}
    assert set(proto.METRICS) <= set(rows[0])
    assert proto.verdict(proto.compare(rows, summary["protocol"])) == summary["verdict"]
    primary = summary["comparisons"]["primary"]
    assert primary["mean"] == pytest.approx(summary["best"]["trace_minus"]["grpo"]["mean"]) and "p_holm" not in primary
    assert summary["verdict"].startswith("Primary (trace minus grpo at equal tokens, unadjusted, alpha 0.05): +0.155")
    # secondaries: trace - dapo at equal tokens, then every pair at equal time; Holm over all three
    names = [(c["against"], c["metric"]) for c in summary["comparisons"]["secondary"]]
    assert names == [("dapo", "gain"), ("grpo", "gain_at_equal_time"), ("dapo", "gain_at_equal_time")]
    ps = [c["p_value"] for c in summary["comparisons"]["secondary"]]
    assert [c["p_holm"] for c in summary["comparisons"]["secondary"]] == pytest.approx(list(proto.holm(dict(enumerate(ps))).values()))


def test_per_seed_rows_read_results_written_before_the_protocol(tmp_path):
    """A ``result.json`` of today's runs is read as it is: its totals come from its metrics when they are
    there, else the per-second rates are nan (never a guess)."""
    old = _result("trace", 0, 0.2)
    row = proto.per_seed_rows([old], "report")[0]
    assert row["gain"] == 0.2 and np.isnan(row["mixed_prompts_per_second"])
    rows = [{"step": 0, "eval_success": 0.1},
            {"step": 1, "mixed_prompts_per_1k_tokens": 5.0, "generated_tokens": 400.0, "rollouts": 20.0,
             "contrast_pairs_per_1k_rollouts": 100.0, "rollout_seconds": 1.5, "train_seconds": 0.5},
            {"step": 2, "eval_success": 0.3, "mixed_prompts_per_1k_tokens": 2.5, "generated_tokens": 400.0,
             "rollouts": 20.0, "contrast_pairs_per_1k_rollouts": 50.0, "rollout_seconds": 1.0, "train_seconds": 1.0}]
    folder = bench.run_dir(tmp_path, "mixed", "trace", 1e-3, 0)
    folder.mkdir(parents=True)
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "result.json").write_text(json.dumps({k: v for k, v in old.items() if k not in ("curve", "train_seconds")}, indent=1))
    back = bench.run_one(tmp_path, "trace", 0, steps=5, token_budget=600)
    assert back["mixed_prompts"] == pytest.approx(3.0) and back["contrast_pairs"] == pytest.approx(3.0)
    row = proto.per_seed_rows([back], "report")[0]
    assert row["mixed_prompts_per_second"] == pytest.approx(3.0 / 4.0)
    assert row["contrast_pairs_per_second"] == pytest.approx(3.0 / 4.0)


def test_the_evaluation_size_reaches_every_run_and_a_mismatch_is_said(tmp_path, monkeypatch, capsys):
    """``--eval-samples`` travels with each run (a worker process imports the module afresh, so a patch of
    ``TASKS`` in the parent never reaches it); a run evaluated at another size is refused or reported."""
    for policy, seed in (("trace", 0), ("grpo", 0), ("trace", 1), ("grpo", 1)):
        folder = bench.run_dir(tmp_path, "mixed", policy, 1e-3, seed)
        folder.mkdir(parents=True)
        gain = 0.1 + (0.1 + 0.05 * seed) * (policy == "trace")
        done = _result(policy, seed, gain, eval_prompts=64, eval_samples=2)
        (folder / "result.json").write_text(json.dumps(done))
    with pytest.raises(ValueError, match="evaluated with eval_samples=2, this invocation asks 4"):
        bench.run_one(tmp_path, "trace", 0, steps=5, token_budget=600, eval_samples=4)
    assert bench.eval_overrides(128, 4) == ["eval.prompts=128", "eval.samples=4"]
    monkeypatch.setitem(bench.TASKS, "mixed", [*bench.TASKS["mixed"], "eval.samples=4"])  # the parent's view
    assert bench.cli(["--policies", "trace", "grpo", "--lrs", "1e-3", "--shared-lr", "none", "--seeds", "0", "1",
                      "--steps", "5", "--out", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "mixed" / "summary.json").read_text())
    assert summary["protocol"]["eval_samples"] == 4 and len(summary["eval_size_mismatch"]) == 4
    assert "warning: runs evaluated at another size than the protocol's: ['trace seed 0: 64 x 2'" in \
        capsys.readouterr().out


def _experiment(tmp_path, name, seeds, gains=(0.2, 0.3, 0.25), **protocol_changes):
    out = tmp_path / name
    _finished(out, {"trace": dict(zip(seeds, gains)), "grpo": dict(zip(seeds, (0.1, 0.1, 0.12)))})
    args = ["--policies", "trace", "grpo", "--lrs", "1e-3", "--shared-lr", "none", "--seeds", *map(str, seeds),
            "--steps", "5", "--out", str(out), "--experiment", name]
    for key, value in protocol_changes.items():
        args += [f"--{key.replace('_', '-')}", str(value)]
    assert bench.cli(args) == 0
    return out / "mixed" / "summary.json"


def test_pooling_compares_the_pooled_rows_and_refuses_mismatched_or_repeated_experiments(tmp_path, capsys):
    a = _experiment(tmp_path, "a", [10, 11, 12])
    b = _experiment(tmp_path, "b", [20, 21, 22], gains=(0.15, 0.35, 0.2))
    capsys.readouterr()
    assert pooling.cli([str(a), str(b), "--json", str(tmp_path / "pooled.json")]) == 0
    pooled = json.loads((tmp_path / "pooled.json").read_text())
    diffs = [0.1, 0.2, 0.13, 0.05, 0.25, 0.08]
    assert pooled["comparisons"]["primary"]["seeds"] == 6
    assert pooled["comparisons"]["primary"]["mean"] == pytest.approx(np.mean(diffs))
    assert pooled["verdict"] in capsys.readouterr().out
    c = _experiment(tmp_path, "c", [30, 31, 32], alpha=0.01)
    with pytest.raises(SystemExit):
        pooling.cli([str(a), str(c)])
    assert "differ in alpha" in capsys.readouterr().err
    d = _experiment(tmp_path, "d", [12, 40, 41])
    with pytest.raises(SystemExit):
        pooling.cli([str(a), str(d)])
    assert "seed 12 is in both" in capsys.readouterr().err
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"task": "mixed", "best": {}}))
    with pytest.raises(SystemExit):
        pooling.cli([str(a), str(old)])
    assert "no protocol and per_seed rows" in capsys.readouterr().err


ROOT = Path(__file__).resolve().parents[2]


def _evidence_with_verdicts() -> list[Path]:
    """Every committed evidence file with a ``verdict`` and ``per_seed`` rows."""
    found = []
    for path in sorted((ROOT / "benchmarks").rglob("*.json")):
        try:
            data = json.loads(path.read_text())
        except ValueError:
            continue
        # bench.policies' evidence (a registered protocol); the simulator's key_lock evidence has its own
        # schema and its verdict is recomputed by tests/simulations/test_key_lock.py
        if isinstance(data, dict) and "verdict" in data and "per_seed" in data and "protocol" in data:
            found.append(path)
    return found


@pytest.mark.parametrize("path", _evidence_with_verdicts(), ids=lambda p: str(p.relative_to(ROOT)))
def test_a_committed_verdict_follows_from_its_per_seed_rows(path):
    data = json.loads(path.read_text())
    assert data["commit"] and data["command"] and "load_average" in data
    comparisons = proto.compare(data["per_seed"], data["protocol"])
    for mine, theirs in zip([comparisons["primary"], *comparisons["secondary"]],
                            [data["comparisons"]["primary"], *data["comparisons"]["secondary"]]):
        assert mine["mean"] == pytest.approx(theirs["mean"], nan_ok=True)
        assert mine.get("p_holm", 0) == pytest.approx(theirs.get("p_holm", 0), nan_ok=True)
    assert proto.verdict(comparisons, data["protocol"]["alpha"]) == data["verdict"]
    report = {r["seed"] for r in data["per_seed"] if r["stage"] == "report"}
    assert report == set(data["protocol"]["seeds"]) and not report & set(data["protocol"]["tuning_seeds"])


def test_the_plan_puts_every_trace_arm_against_every_arm_and_names_the_primary_once():
    """``--primary trace@eager grpo``: lazy TRACE is still compared with every arm; each unordered pair once,
    at equal tokens and at equal time; the primary's equal-tokens reading is not a secondary."""
    import argparse
    args = argparse.Namespace(policies=["trace@eager", "trace", "grpo", "dapo"], primary=["trace@eager", "grpo"],
                              task="mixed", tuning_seeds=[100], seeds=[0, 1], lrs=[1e-3], shared_lr=None, steps=5,
                              token_budget=600, eval_every=5)
    plan = bench.plan_protocol(args)
    assert plan["primary"] == {"reference": "trace@eager", "against": "grpo", "metric": "gain"}
    pairs = [(c["reference"], c["against"], c["metric"]) for c in plan["secondary"]]
    tokens = [("trace@eager", "trace"), ("trace@eager", "dapo"), ("trace", "grpo"), ("trace", "dapo")]
    assert pairs == [(*p, "gain") for p in tokens] + [(*p, "gain_at_equal_time") for p in
                                                       [("trace@eager", "trace"), ("trace@eager", "grpo"), *tokens[1:]]]
