"""The all-fail regime is named (issue 54): the share of groups with no success in every row, and one warning
with what to try once held-out success stays flat while most groups fail; never for a run that learns."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from trace_theory import RolloutForest
from trace_train import train
from trace_train.run.all_fail import AllFailWatch, advice, all_fail_share


def test_the_share_of_all_fail_groups_counts_prompts_whose_every_leaf_failed():
    forest = RolloutForest.from_nested([[1, 1], [0, 1], [[0, 0], 0], [0, 0]])
    assert all_fail_share(forest) == 0.5
    # the same count written out: a prompt is all-fail when none of its leaves has reward > 0
    by_prompt = [[1, 1], [0, 1], [0, 0, 0], [0, 0]]
    assert all_fail_share(forest) == sum(max(p) <= 0 for p in by_prompt) / len(by_prompt)


def _feed(watch, rows):
    said, fields = [], []
    for step, row in rows:
        f, w = watch.check(step, row)
        said += w
        fields.append(f)
    return said, fields


def test_a_flat_run_of_all_fail_groups_warns_once_with_what_to_try():
    watch = AllFailWatch(eval_rollouts=48)
    rows = [(0, {"eval_success": 0.0625})]
    for step in range(1, 21):
        row = {"all_fail_group_share": 0.9}
        if step % 5 == 0:
            row["eval_success"] = [0.083, 0.062, 0.104, 0.083][step // 5 - 1]
        rows.append((step, row))
    said, fields = _feed(watch, rows)
    assert len(said) == 1 and said[0].startswith("step 15: all-fail regime: 90% of the groups"), said
    for remedy in ("warm-start demonstrations", "model.tiny_warm_steps", "an easier mix of rows", "more roots", "a larger model"):
        assert remedy in said[0]
    assert fields[15] == {"held_out_flat_evals": 3.0, "all_fail_regime": 1.0}
    assert fields[14]["all_fail_regime"] == 0.0
    again = AllFailWatch(eval_rollouts=48).replay([{"step": s, **r} for s, r in rows])  # a resumed run
    assert again.check(21, {"all_fail_group_share": 1.0})[1] == []


def test_the_advice_fits_the_run_it_is_given_to():
    """A task whose tiny model was already warmed on its expert is told to lengthen that warm-up (its current
    length named), not to add demonstrations it has; a real model is not told about the tiny model's warm start."""
    warmed = advice(tiny=True, demonstrated=True, warm_steps=120)
    assert "model.tiny_warm_steps, now 120" in warmed and "task_spec demonstration" not in warmed
    bare = advice(tiny=True, demonstrated=False, warm_steps=40)
    assert "warm-start demonstrations" in bare and "task_spec demonstration" in bare
    real = advice(tiny=False, demonstrated=True, warm_steps=40)
    assert "tiny_warm_steps" not in real and "demonstration" not in real
    for text in (warmed, bare, real):
        assert text.endswith("a larger model (model.name_or_path)") and "an easier mix of rows" in text
    watch = AllFailWatch(eval_rollouts=48, advice=warmed)
    rows = [(0, {"eval_success": 0.0625})] + [
        (step, {"all_fail_group_share": 0.9, **({"eval_success": 0.0625} if step % 5 == 0 else {})})
        for step in range(1, 21)]
    said, _ = _feed(watch, rows)
    assert len(said) == 1 and said[0].endswith(warmed)


def test_a_run_that_learns_or_has_mixed_groups_does_not_warn():
    rising = [(0, {"eval_success": 0.06})] + [(s, {"all_fail_group_share": 0.9, **({"eval_success": 0.06 + 0.08 * s / 5}
                                                                                     if s % 5 == 0 else {})})
                                               for s in range(1, 31)]
    assert _feed(AllFailWatch(eval_rollouts=48), rising)[0] == []
    mixed = [(0, {"eval_success": 0.3})] + [(s, {"all_fail_group_share": 0.2, **({"eval_success": 0.3}
                                                                                  if s % 5 == 0 else {})})
                                            for s in range(1, 31)]
    assert _feed(AllFailWatch(eval_rollouts=48), mixed)[0] == []


NEVER = '''
class Never:
    """Any row; every episode fails (one turn, reward 0)."""

    def reset(self, row):
        return [{"role": "user", "content": "Say a number above %d." % row["w"]}]

    def step(self, action):
        from trace_train.envs.base import StepResult
        return StepResult("No.", done=True)

    def verify(self):
        return 0.0

    def snapshot(self):
        return None

    def restore(self, snapshot):
        pass
'''


def test_a_run_where_nothing_succeeds_names_the_regime_on_the_console_and_in_metrics(tmp_path, capsys):
    (tmp_path / "never.py").write_text(textwrap.dedent(NEVER))
    (tmp_path / "rows.jsonl").write_text("".join('{"w": %d}\n' % i for i in range(24)))
    run_dir = tmp_path / "run"
    code = train.cli([f"task.name={tmp_path / 'never.py'}:Never", f"task.train={tmp_path / 'rows.jsonl'}",
                      f"run_dir={run_dir}", "steps=3", "eval.every=1", "task.eval_size=4", "eval.samples=2",
                      "rollout.limits.max_turn_tokens=8"])
    out, err = capsys.readouterr()
    assert code == 0, err[-2000:]
    assert "step 0/3  eval 0.000  (held-out success before training; every one of its 8 rollouts failed)" in out
    assert "step 1/3  reward 0.000  eval 0.000" in out and "all-fail 1.00" in out
    warnings = [ln for ln in err.splitlines() if "all-fail regime" in ln]
    assert len(warnings) == 1 and warnings[0].startswith("trace-train: warning: step 3: all-fail regime: 100%"), err
    rows = [json.loads(ln) for ln in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r.get("all_fail_group_share") for r in rows[1:]] == [1.0, 1.0, 1.0]
    assert [r["all_fail_regime"] for r in rows] == [0.0, 0.0, 0.0, 1.0]
    # the closing line names the starting model, and trace-eval scores it as the "before"
    closing = [ln for ln in err.splitlines() if ln.startswith("run finished:")]
    assert len(closing) == 1 and closing[0].endswith(f"--model {run_dir / 'tiny_model'}"), closing
    from trace_train import evaluate

    code = evaluate.cli(["--model", str(run_dir / "tiny_model"), "--task", f"{tmp_path / 'never.py'}:Never",
                         "--data", str(tmp_path / "rows.jsonl"), "--limit", "4", "--max-turn-tokens", "8",
                         "--device", "cpu", "--output-dir", str(tmp_path / "before")])
    assert code == 0, capsys.readouterr().err[-2000:]
    summary = json.loads((tmp_path / "before" / "summary.json").read_text())
    assert summary["metrics"]["mean_reward"] == 0.0 and summary["tasks"] == 4, summary
