"""Does docs/training.md's advice for a run that does not learn lift a new user's all-fail task?

    python -m trace_train.bench.newcomer                          # every setting, seeds 0 1 2, two at a time
    python -m trace_train.bench.newcomer --settings flat warm --seeds 0 1 2 3 4 --out FILE
    python -m trace_train.bench.newcomer --settings warm_long --seeds 0 1 2 3 --add   # more runs, one file
    python -m trace_train.bench.newcomer --diagnose EVAL_DIR ...   # what trace-eval's models did (diagnose)

The task is ``examples/target_sum/`` (reach a target sum by naming allowed numbers, 1-3 turns), written as
a user would write it. Every run is the README's own-task command (read from README.md, as
``trace_train.bench.quickstart`` reads it) on that task, plus the common settings ``COMMON`` and one
setting's overrides, each a step of "My run does not learn" taken in order on top of the one before:

- ``flat``: the task as written (the issue's run: about 5% success, most groups all-fail);
- ``warm``: 1. warm-start demonstrations (``TargetSumExpertEnv``, ``model.tiny_warm_steps=120``);
- ``warm_easier``: 2. an easier mix of rows (``rows_easier.jsonl``, held out ``rows_heldout.jsonl``: the
  same 24 rows the others hold out);
- ``warm_easier_roots``: 3. more roots (``rollout.roots=64 rollout.pool_size=32``);
- ``warm_long``: step 1 again with a four times longer warm-up (``model.tiny_warm_steps=480``), on the
  user's rows; ``warm_long_lr``: the same with a four times larger step (``optim.lr=2e-3``).

Per run: held-out success at step 0 (``start``) and at the last step (``end``), 96 episodes each (24
prompts x 4 samples), the mean ``all_fail_group_share`` over the steps, and the step where the all-fail
regime was first named. Per setting: the paired gain ``end - start`` over seeds, its standard error
``sd / sqrt(n)`` (``sd`` with ``n - 1``), and whether ``mean > 2 SE``; and ``end`` minus the ``flat``
run's ``end`` of the same seed, likewise.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from trace_train.child_python import module_command
from . import origin
from .quickstart import readme_command

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = "examples/target_sum"
COMMON = ["steps=60", "eval.every=10", "eval.samples=4", "tensorboard=false", "checkpoint_every=60"]
_EXPERT = f"task.name={EXAMPLE}/target_sum_env.py:TargetSumExpertEnv"
_EASIER = [f"task.train={EXAMPLE}/rows_easier.jsonl", f"task.eval={EXAMPLE}/rows_heldout.jsonl"]
SETTINGS: dict[str, list[str]] = {
    "flat": [f"task.name={EXAMPLE}/target_sum_env.py:TargetSumEnv", f"task.train={EXAMPLE}/rows.jsonl"],
    "warm": [_EXPERT, f"task.train={EXAMPLE}/rows.jsonl", "model.tiny_warm_steps=120"],
    "warm_easier": [_EXPERT, *_EASIER, "model.tiny_warm_steps=120"],
    "warm_easier_roots": [_EXPERT, *_EASIER, "model.tiny_warm_steps=120", "rollout.roots=64", "rollout.pool_size=32"],
    "warm_long": [_EXPERT, f"task.train={EXAMPLE}/rows.jsonl", "model.tiny_warm_steps=480"],
    "warm_long_lr": [_EXPERT, f"task.train={EXAMPLE}/rows.jsonl", "model.tiny_warm_steps=480", "optim.lr=2e-3"],
}
"""Each a step of the advice on top of the one before (a later value of a key replaces an earlier one)."""

def arguments(setting: str) -> list[str]:
    """The README's command with the task swapped in: its settings, ``COMMON``, then the setting's."""
    kept = [a for a in readme_command() if not a.startswith(("task.name=", "task.train="))]
    return [*kept, *COMMON, *SETTINGS[setting]]


def run(setting: str, seed: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="newcomer_") as tmp:
        start = time.perf_counter()
        done = subprocess.run([*module_command("trace_train.train"), *arguments(setting), f"seed={seed}",
                               f"run_dir={tmp}/run"], cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"},
                              capture_output=True, text=True)
        seconds = time.perf_counter() - start
        if done.returncode:
            raise SystemExit(f"{setting} seed {seed} failed: {done.stderr[-2000:]}")
        rows = [json.loads(line) for line in (Path(tmp) / "run" / "metrics.jsonl").read_text().splitlines()]
    evals = [(r["step"], round(r["eval_success"], 4)) for r in rows if "eval_success" in r]
    shares = [r["all_fail_group_share"] for r in rows if "all_fail_group_share" in r]
    regime = [r["step"] for r in rows if r.get("all_fail_regime")]
    return {"setting": setting, "seed": seed, "held_out_success_start": evals[0][1],
            "held_out_success_end": evals[-1][1], "gain": round(evals[-1][1] - evals[0][1], 4),
            "all_fail_group_share": round(sum(shares) / len(shares), 4), "all_fail_regime_step": regime[0] if regime else None,
            "eval_success": evals, "eval_rollouts": next(r["eval_rollouts"] for r in rows if "eval_rollouts" in r),
            "wall_seconds": round(seconds, 1)}


def mean_se(values: list[float]) -> dict:
    """Mean, standard error (``sd / sqrt(n)``) and whether the mean exceeds 2 standard errors."""
    n = len(values)
    mean = sum(values) / n
    se = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n) if n > 1 else float("nan")
    return {"n": n, "mean": round(mean, 4), "se": round(se, 4), "above_2se": bool(n > 1 and mean > 2 * se)}


def summarise(rows: list[dict]) -> dict:
    flat_end = {r["seed"]: r["held_out_success_end"] for r in rows if r["setting"] == "flat"}
    summary = {}
    for setting in dict.fromkeys(r["setting"] for r in rows):
        mine = [r for r in rows if r["setting"] == setting]
        summary[setting] = {
            "start": mean_se([r["held_out_success_start"] for r in mine]),
            "end": mean_se([r["held_out_success_end"] for r in mine]),
            "gain": mean_se([r["gain"] for r in mine]),
            "all_fail_group_share": round(sum(r["all_fail_group_share"] for r in mine) / len(mine), 4),
            "all_fail_regime_named": sum(r["all_fail_regime_step"] is not None for r in mine)}
        paired = [r["held_out_success_end"] - flat_end[r["seed"]] for r in mine if r["seed"] in flat_end]
        if setting != "flat" and len(paired) > 1:
            summary[setting]["end_minus_flat_end"] = mean_se(paired)
    return summary


def diagnose(results: Path, rows: Path) -> dict:
    """What a model does on the held-out rows, from ``trace-eval``'s ``results.jsonl`` (its transcripts):
    the share of its turns that name one of the row's allowed numbers (a random digit 1-9: 1/3), and success
    by the row's number of turns."""
    by_id = {row["id"]: row for row in map(json.loads, rows.read_text().splitlines())}
    turns = allowed = 0
    success: dict[int, list[float]] = {}
    for record in map(json.loads, results.read_text().splitlines()):
        row = by_id[record["id"]]
        for sample in record["samples"]:
            success.setdefault(row["turns"], []).append(sample["reward"])
            for message in sample["transcript"]:
                if message["role"] == "assistant":
                    turns += 1
                    allowed += message["content"].strip().isdigit() and int(message["content"]) in row["numbers"]
    return {"turns": turns, "allowed_number_share": round(allowed / turns, 4),
            "success_by_row_turns": {str(k): {"episodes": len(v), "success": round(sum(v) / len(v), 4)}
                                     for k, v in sorted(success.items())}}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trace_train.bench.newcomer", description=__doc__.split("\n")[0])
    parser.add_argument("--settings", nargs="+", choices=list(SETTINGS), default=list(SETTINGS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--jobs", type=int, default=2, help="runs at once, one thread each")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "newcomer" / "target_sum.json"))
    parser.add_argument("--add", action="store_true", help="add these runs to --out's (replacing a setting's "
                        "runs of the same seed) and summarise them all; this batch's record goes under `added`")
    parser.add_argument("--diagnose", nargs="+", metavar="EVAL_DIR", help="only add to --out what the models "
                        "of these trace-eval output folders do on the held-out rows (diagnose())")
    ns = parser.parse_args(argv)
    if ns.diagnose:
        evidence = json.loads(Path(ns.out).read_text())
        evidence["diagnosis"] = {"command": origin("trace_train.bench.newcomer", argv)["command"], "models": {
            Path(d).name: {"model": json.loads((Path(d) / "config.json").read_text()).get("model"),
                           **diagnose(Path(d) / "results.jsonl", REPO / EXAMPLE / "rows_heldout.jsonl")}
            for d in ns.diagnose}}
        Path(ns.out).write_text(json.dumps(evidence, indent=1) + "\n")
        print(json.dumps(evidence["diagnosis"], indent=1))
        return 0
    record = origin("trace_train.bench.newcomer", argv)
    record["load_average_before"] = list(os.getloadavg())
    jobs = [(setting, seed) for setting in ns.settings for seed in ns.seeds]
    with ThreadPoolExecutor(ns.jobs) as pool:
        rows = list(pool.map(lambda job: run(*job), jobs))
    record["load_average_after"] = list(os.getloadavg())
    if ns.add:
        evidence = json.loads(Path(ns.out).read_text())
        mine = {(r["setting"], r["seed"]) for r in rows}
        rows = [r for r in evidence["runs"] if (r["setting"], r["seed"]) not in mine] + rows
        evidence["added"] = [*evidence.get("added", []), {**record, "settings": {s: SETTINGS[s] for s in ns.settings}}]
        evidence.update(runs=rows, summary=summarise(rows))
        Path(ns.out).write_text(json.dumps(evidence, indent=1) + "\n")
        print(json.dumps(evidence["summary"], indent=1))
        return 0
    evidence = {**record, "task": f"{EXAMPLE} (reach a target sum by naming allowed numbers, 1-3 turns; 96 rows)",
                "readme_command_args": readme_command(), "common": COMMON, "settings": SETTINGS,
                "runs": rows, "summary": summarise(rows)}
    Path(ns.out).parent.mkdir(parents=True, exist_ok=True)
    Path(ns.out).write_text(json.dumps(evidence, indent=1) + "\n")
    print(json.dumps(evidence["summary"], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
