"""The policy benchmark's statistics and its resumability, on result files written here (no training)."""

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from trace_train.bench import policies as bench


def _head():
    """``git rev-parse HEAD`` of this checkout, None outside one."""
    done = subprocess.run(["git", "-C", str(Path(__file__).parent), "rev-parse", "HEAD"],
                          capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else None


def _result(policy, lr, seed, gain):
    return {
        "policy": policy,
        "lr": lr,
        "seed": seed,
        "gain": gain,
        "success_start": 0.1,
        "success_end": 0.1 + gain,
        "effective_ratio": 0.5,
        "mixed_prompts_per_1k_rollouts": 40.0,
        "mixed_prompts_per_1k_tokens": 2.0,
        "contrast_pairs_per_1k_rollouts": 300.0,
        "generated_tokens": 1000.0,
        "minutes": 1.0,
    }


def test_best_rates_pick_the_largest_mean_gain_and_break_ties_towards_the_smaller_rate():
    results = [_result("trace", 1e-3, s, g) for s, g in ((100, 0.1), (101, 0.3))]
    results += [_result("trace", 2e-3, s, g) for s, g in ((100, 0.25), (101, 0.25))]
    results += [_result("grpo", lr, 100, 0.2) for lr in (2e-3, 1e-3)]
    assert bench.best_rates(results) == {"trace": 2e-3, "grpo": 1e-3}


def test_paired_differences_match_a_paired_t_test_and_conclude_in_one_line():
    rng = np.random.default_rng(0)
    base = rng.normal(0.1, 0.05, size=8)
    lead = rng.normal(0.04, 0.01, size=8)
    results = [_result("grpo", 1e-3, s, float(b)) for s, b in enumerate(base)]
    results += [_result("trace", 2e-3, s, float(b + d)) for s, (b, d) in enumerate(zip(base, lead))]
    gap = bench.paired(results)["grpo"]
    diff = lead
    assert gap["mean"] == pytest.approx(diff.mean())
    half = stats.t.ppf(0.975, 7) * diff.std(ddof=1) / np.sqrt(8)
    assert gap["ci95"] == pytest.approx([diff.mean() - half, diff.mean() + half])
    assert gap["p_value"] == pytest.approx(stats.ttest_rel(base + lead, base).pvalue)
    line = bench.conclusion({"grpo": gap})
    assert line.endswith(": significant.") and "8 paired seeds" in line
    noisy = dict(gap, ci95=[-0.01, 0.05])
    assert bench.conclusion({"grpo": noisy}).endswith(": not significant.")


def test_unpaired_seeds_are_left_out_of_the_differences():
    results = [_result("trace", 1e-3, s, 0.1 * s) for s in (0, 1, 2)] + [
        _result("grpo", 1e-3, s, 0.1) for s in (1, 2, 3)
    ]
    assert bench.paired(results)["grpo"]["seeds"] == 2


def test_run_result_reads_the_first_and_last_two_evaluations():
    rows = [
        {"step": 0, "eval_success": 0.1},
        {"step": 1, "effective_ratio": 0.5, "generated_tokens": 600, "mixed_prompts_per_1k_rollouts": 30.0},
        {"step": 2, "eval_success": 0.2},
        {"step": 3, "eval_success": 0.4, "generated_tokens": 500},
    ]
    out = bench.run_result(rows)
    assert out["gain"] == pytest.approx(0.2) and out["generated_tokens"] == 1100.0
    assert out["mixed_prompts_per_1k_rollouts"] == 30.0 and np.isnan(out["mixed_prompts_per_1k_tokens"])
    with pytest.raises(ValueError, match="at least two evaluations"):
        bench.run_result(rows[:2])


def test_a_finished_run_is_read_back_not_rerun(tmp_path):
    folder = bench.run_dir(tmp_path, "mixed", "trace", 1e-3, 0)
    folder.mkdir(parents=True)
    saved = dict(_result("trace", 1e-3, 0, 0.2), steps=5)
    (folder / "result.json").write_text(json.dumps(saved))
    # the preset is never loaded nor trained: a finished result with the same number of steps is returned as is
    assert bench.run_one(tmp_path, "trace", 0, steps=5, token_budget=600, task="mixed", lr=1e-3) == saved


def test_tuning_and_report_seeds_must_differ(capsys):
    with pytest.raises(SystemExit):
        bench.cli(["--policies", "trace", "grpo", "--tuning-seeds", "0", "--seeds", "0", "1"])
    assert "--tuning-seeds and --seeds must differ" in capsys.readouterr().err


def test_runs_on_worker_processes_come_back_in_job_order(tmp_path):
    jobs = [("trace", 0, 1e-3), ("grpo", 0, 2e-3), ("trace", 1, 1e-3)]
    for policy, seed, lr in jobs:
        folder = bench.run_dir(tmp_path, "mixed", policy, lr, seed)
        folder.mkdir(parents=True)
        (folder / "result.json").write_text(json.dumps(dict(_result(policy, lr, seed, 0.1 * seed), steps=5)))
    serial = bench.run_all(tmp_path, jobs, steps=5, token_budget=600, task="mixed")
    parallel = bench.run_all(tmp_path, jobs, workers=2, steps=5, token_budget=600, task="mixed")
    assert parallel == serial and [(r["policy"], r["seed"], r["lr"]) for r in parallel] == jobs


def test_a_best_rate_at_the_edge_of_the_grid_is_flagged():
    assert bench.at_grid_edge({"trace": 2e-3, "grpo": 1e-3, "dapo": 5e-4}, [5e-4, 1e-3, 2e-3]) == ["trace", "dapo"]
    assert bench.at_grid_edge({"trace": 1e-3}, [1e-3]) == []  # one rate: no sweep, nothing to widen


def test_a_subset_of_policies_without_trace_reports_their_own_numbers(tmp_path, capsys):
    """``--policies dapo``: the arm alone (e.g. rerun after a fix), no paired TRACE differences."""
    for seed, gain in ((0, 0.1), (1, 0.3)):
        folder = bench.run_dir(tmp_path, "mixed", "dapo", 1e-3, seed)
        folder.mkdir(parents=True)
        (folder / "result.json").write_text(json.dumps(dict(_result("dapo", 1e-3, seed, gain), steps=5)))
    assert bench.cli(["--policies", "dapo", "--lrs", "1e-3", "--shared-lr", "1e-3", "--seeds", "0", "1",
                      "--steps", "5", "--out", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "mixed" / "summary.json").read_text())
    assert summary["best"]["policies"]["dapo"]["gain"] == pytest.approx(0.2)
    assert summary["best"]["trace_minus"] == {} and "no paired TRACE" in summary["best"]["conclusion"]
    assert summary["commit"] == _head()  # the evidence says which code it measured, and how
    assert summary["command"].startswith("python -m trace_train.bench.policies --policies dapo --lrs 1e-3")


def _timed(policy, seed, seconds_per_step, successes):
    """A result whose evaluations come every 2 steps of ``seconds_per_step`` each, starting at 0 s."""
    rows = [{"step": 0, "eval_success": successes[0]}]
    for k, success in enumerate(successes[1:], start=1):
        rows.append({"step": 2 * k - 1, "rollout_seconds": seconds_per_step / 2, "train_seconds": seconds_per_step / 2})
        rows.append({"step": 2 * k, "rollout_seconds": seconds_per_step / 2, "train_seconds": seconds_per_step / 2,
                     "eval_success": success})
    return dict(_result(policy, 1e-3, seed, 0.0), **bench.run_result(rows), seed=seed)


def test_at_equal_time_reads_each_run_over_its_seeds_shortest_runs_last_two_evaluations():
    # trace's steps cost 2 s, grpo's 1 s: grpo evaluates at 0, 2 and 4 s; by then trace has done 1 and 2
    # steps: halfway to its first evaluation (0.3) and at it (0.5)
    results = [_timed("trace", 0, 2.0, [0.1, 0.5, 0.7]), _timed("grpo", 0, 1.0, [0.1, 0.2, 0.3])]
    assert [r["train_seconds"] for r in results] == [8.0, 4.0]
    timed = bench.at_equal_time(results)
    assert [r["equal_time_seconds"] for r in timed] == [4.0, 4.0]
    assert timed[0]["equal_time_window"] == [2.0, 4.0]
    assert timed[0]["gain_at_equal_time"] == pytest.approx(0.3)  # mean(0.3, 0.5) - 0.1
    assert timed[1]["gain_at_equal_time"] == pytest.approx(timed[1]["gain"]) == pytest.approx(0.15)  # its own gain
    assert timed[0]["gain"] == pytest.approx(0.5)  # at equal tokens: the mean of the last two, 0.6, minus 0.1
    halfway = bench.at_equal_time([_timed("trace", 1, 2.0, [0.1, 0.5, 0.7]), _timed("grpo", 1, 1.0, [0.1, 0.3])])
    assert halfway[0]["gain_at_equal_time"] == pytest.approx(0.1)  # trace at 0 and 2 s: mean(0.1, 0.3) - 0.1


def test_the_arms_of_a_seed_run_next_to_each_other(tmp_path, monkeypatch):
    """Jobs are seed-major, so a load change on the shared machine hits every arm of a seed alike."""
    order = []
    monkeypatch.setattr(bench, "run_one", lambda out, p, s, lr, **kw: order.append((p, s)) or dict(
        _timed(p, s, 1.0, [0.1, 0.2, 0.3]), policy=p, lr=lr))
    import signal

    before = signal.getsignal(signal.SIGTERM)
    bench.cli(["--policies", "trace", "grpo", "--lrs", "1e-3", "--shared-lr", "none", "--seeds", "0", "1",
               "--steps", "4", "--out", str(tmp_path)])
    assert order == [("trace", 0), ("grpo", 0), ("trace", 1), ("grpo", 1)]
    assert signal.getsignal(signal.SIGTERM) is before  # the caller's handler is back (forked pools inherit it)


def test_rates_chosen_earlier_skip_the_sweep(tmp_path):
    """``--rates trace=2e-3 grpo=4e-3``: each policy's finished runs at its own rate are read, nothing swept."""
    for policy, lr, gain, slope in (("trace", 2e-3, 0.3, 0.02), ("grpo", 4e-3, 0.1, 0.01)):
        for seed in (0, 1):
            folder = bench.run_dir(tmp_path, "mixed", policy, lr, seed)
            folder.mkdir(parents=True)
            (folder / "result.json").write_text(json.dumps(dict(_result(policy, lr, seed, gain + slope * seed),
                                                                steps=5)))
    assert bench.cli(["--policies", "trace", "grpo", "--rates", "trace=2e-3", "grpo=4e-3", "--shared-lr", "none",
                      "--seeds", "0", "1", "--steps", "5", "--out", str(tmp_path)]) == 0
    summary = json.loads((tmp_path / "mixed" / "summary.json").read_text())
    assert summary["best_lr"] == {"trace": 2e-3, "grpo": 4e-3} == summary["rates_given"]
    assert summary["best"]["trace_minus"]["grpo"]["mean"] == pytest.approx(0.205) and "shared" not in summary
    with pytest.raises(SystemExit):
        bench.cli(["--rates", "trace"])


def test_a_trace_arm_with_another_predictor_kind_is_paired_against_every_arm(tmp_path, capsys):
    """``--policies trace trace+probe grpo``: trace+probe runs TRACE with predictor.kind=probe (its own run
    folders) and is paired against trace and grpo; a bad arm is refused before anything runs."""
    gains = {"trace": (0.3, 0.32), "trace+probe": (0.35, 0.36), "grpo": (0.1, 0.14)}
    for policy, by_seed in gains.items():
        for seed, gain in enumerate(by_seed):
            folder = bench.run_dir(tmp_path, "mixed", policy, 1e-3, seed)
            folder.mkdir(parents=True)
            (folder / "result.json").write_text(json.dumps(dict(_result(policy, 1e-3, seed, gain), steps=5)))
    assert bench.arm("trace+probe") == ("trace", "probe", None) and bench.arm("grpo") == ("grpo", None, None)
    assert bench.arm("trace@eager") == ("trace", None, "eager")
    assert bench.arm_overrides("trace+probe@eager") == ["rollout.policy=trace", "predictor.kind=probe",
                                                         "rollout.expansion=eager"]
    assert bench.arm_overrides("trace@eager:eager_lag=1:eager_reserve=0.5") == [
        "rollout.policy=trace", "rollout.expansion=eager", "rollout.eager_lag=1", "rollout.eager_reserve=0.5"]
    assert bench.is_variant("trace@eager:eager_lag=1") and not bench.is_variant("grpo:token_budget=300")
    for bad in ("trace@", "trace@eager:", "trace@eager:eager_lag", "trace:=1"):
        with pytest.raises(ValueError, match="POLICY"):
            bench.arm(bad)
    assert bench.cli(["--policies", "trace", "trace+probe", "grpo", "--lrs", "1e-3", "--shared-lr", "none",
                      "--seeds", "0", "1", "--steps", "5", "--out", str(tmp_path)]) == 0
    best = json.loads((tmp_path / "mixed" / "summary.json").read_text())["best"]
    assert best["variants_minus"]["trace+probe"]["grpo"]["mean"] == pytest.approx(0.235)
    assert best["variants_minus"]["trace+probe"]["trace"]["mean"] == pytest.approx(0.045)
    assert best["trace_minus"]["trace+probe"]["mean"] == pytest.approx(-0.045)
    printed = capsys.readouterr().out  # each line says its reading and its correction
    assert "trace+probe minus grpo at equal tokens: +0.235" in printed and "Holm-adjusted p = " in printed
    for bad in ("trace+", "trace+oracle", "nope+probe", "trace@eager:no_such_field=1"):
        with pytest.raises(SystemExit):
            bench.cli(["--policies", bad, "--out", str(tmp_path)])
    assert "--policies trace+oracle" in capsys.readouterr().err


def test_an_expansion_arm_is_a_variant_and_a_bad_one_is_refused(tmp_path, capsys):
    """``trace@eager`` is paired against every arm; ``trace@sideways`` is refused before anything runs."""
    for policy, by_seed in {"trace": (0.3, 0.32), "trace@eager": (0.25, 0.3), "grpo": (0.1, 0.14)}.items():
        for seed, gain in enumerate(by_seed):
            folder = bench.run_dir(tmp_path, "mixed", policy, 1e-3, seed)
            folder.mkdir(parents=True)
            (folder / "result.json").write_text(json.dumps(dict(_result(policy, 1e-3, seed, gain), steps=5)))
    assert bench.cli(["--policies", "trace", "trace@eager", "grpo", "--lrs", "1e-3", "--shared-lr", "none",
                      "--seeds", "0", "1", "--steps", "5", "--out", str(tmp_path)]) == 0
    best = json.loads((tmp_path / "mixed" / "summary.json").read_text())["best"]
    assert best["variants_minus"]["trace@eager"]["grpo"]["mean"] == pytest.approx(0.155)
    with pytest.raises(SystemExit):
        bench.cli(["--policies", "trace@sideways", "--out", str(tmp_path)])
    assert "trace@sideways" in capsys.readouterr().err
