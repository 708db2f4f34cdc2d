"""Testbeds no one here wrote: where the warmed tiny model starts on each, and how mixed GRPO's groups are.

    python -m trace_train.bench.testbeds --out benchmarks/testbeds/warm_start.json
    python -m trace_train.bench.testbeds --tasks aiw --seeds 0 1 2 --steps 8

For each task of :data:`TASKS` and each seed, in a fresh run directory (``OMP_NUM_THREADS=1``):

1. ``trace-train`` with GRPO (``rollout.policy=grpo``: every prompt gets a group of ``group_size`` rollouts)
   for ``--steps`` steps builds the tiny model, warms it on the task's scripted expert over training rows,
   evaluates held-out success before training and logs each step's ``effective_ratio``: the share of
   GRPO's groups that mix success and failure (the paper's GRPO: 26.8% on math with Qwen3-8B).
2. ``trace-eval`` scores the warmed starting model (``<run>/tiny_model``) on the held-out rows, ``--k``
   samples each, and the success is split by curriculum level (read from the row ids, ``.../L<level>/...``).

The JSON records the commit, the command, the machine, the load average before and after, per-seed rows and a summary
per task (means over seeds with their standard errors). Nothing here is a pass/fail test: the numbers are
evidence for ``docs/results.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from trace_train.child_python import module_command

REPO = Path(__file__).resolve().parents[2]

_GROUPS = ["rollout.pool_size=16", "rollout.roots=64", "rollout.group_size=8"]
"""Eight prompts a step, eight rollouts each: GRPO's mixed share is read over 8 groups a step."""

def _reasoning_gym(dataset: str, levels: list[int], what: str) -> dict:
    """A reasoning-gym task: one answer of at most 16 tokens per rollout, the tiny model warmed 200 steps."""
    return {
        "train": ["task.name=reasoning_gym", f"task.env.dataset={dataset}", f"task.env.levels={levels}",
                  "model.tiny_warm_steps=200", "rollout.limits.max_turns=1", "rollout.limits.max_turn_tokens=16",
                  *_GROUPS],
        "eval": {"benchmark": "reasoning_gym", "env_options": {"dataset": dataset, "levels": levels},
                 "max_turns": 1, "max_turn_tokens": 16},
        "what": what,
    }


TASKS: dict[str, dict] = {
    "aiw": _reasoning_gym("aiw", [0, 1], "reasoning-gym aiw (Alice in Wonderland: siblings' counts), levels 0-1, one answer"),
    "chain_sum": _reasoning_gym("chain_sum", [0, 1], "reasoning-gym chain_sum (add and subtract), levels 0-1, one answer"),
    "family_relationships": _reasoning_gym("family_relationships", [0],
                                           "reasoning-gym family_relationships (name the relation), level 0, one answer"),
    "frozen_lake": {
        "train": ["task.name=textarena", "task.env.env_id=[FrozenLake-v0,FrozenLake-v0-hardcore]",
                  "model.tiny_warm_steps=200", "rollout.limits.max_turns=10", "rollout.limits.max_turn_tokens=8",
                  "rollout.limits.max_context_tokens=2048", *_GROUPS],
        "eval": {"benchmark": "textarena", "env_options": {"env_id": ["FrozenLake-v0", "FrozenLake-v0-hardcore"]},
                 "max_turns": 10, "max_turn_tokens": 8, "max_context_tokens": 2048},
        "what": "textarena FrozenLake: walk the shown map to the goal, one move a turn; L0 4x4 with 3 holes, "
                "L1 5x5 with 6 holes",
    },
}
"""Task name -> trace-train overrides, trace-eval options and one line saying what a rollout is."""

_LEVEL = re.compile(r"/L(\d+|-)/")


def _run(args: list[str]) -> subprocess.CompletedProcess:
    """``python -m module args`` (``args``: ``["-m", module, ...]``), isolated from the caller's cwd and path."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(module_command(args[1], *args[2:]), cwd=REPO, env=env, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{' '.join(args[:3])} failed ({done.returncode}): {done.stderr[-2000:]}")
    return done


def success_by_level(results: Path) -> dict[str, float]:
    """Mean success per curriculum level of a trace-eval ``results.jsonl`` (level from each row id)."""
    by: dict[str, list[float]] = {}
    for line in results.read_text().splitlines():
        record = json.loads(line)
        match = _LEVEL.search(str(record["id"]))
        by.setdefault(match.group(1) if match else "-", []).extend(record["rewards"])
    return {level: round(float(np.mean(v)), 4) for level, v in sorted(by.items())}


def run_seed(name: str, seed: int, *, steps: int, k: int, limit: int) -> dict:
    task = TASKS[name]
    with tempfile.TemporaryDirectory(prefix="testbeds_") as tmp:
        run = Path(tmp) / "run"
        start = time.perf_counter()
        _run(["-m", "trace_train.train", *task["train"], "rollout.policy=grpo", f"steps={steps}",
              f"eval.every={steps}", f"seed={seed}", f"run_dir={run}", "tensorboard=false", "--quiet"])
        train_seconds = time.perf_counter() - start
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        ev = task["eval"]
        _run(["-m", "trace_train.evaluate", "--model", str(run / "tiny_model"), "--task", ev["benchmark"],
              "--env-options", json.dumps(ev["env_options"]), "--output-dir", str(Path(tmp) / "eval"),
              "--k", str(k), "--limit", str(limit), "--seed", str(seed), "--max-turns", str(ev["max_turns"]),
              "--max-turn-tokens", str(ev["max_turn_tokens"]),
              "--max-context-tokens", str(ev.get("max_context_tokens", 1024)), "--device", "cpu"])
        levels = success_by_level(Path(tmp) / "eval" / "results.jsonl")
        summary = json.loads((Path(tmp) / "eval" / "summary.json").read_text())
    mixed = [r["effective_ratio"] for r in rows if "effective_ratio" in r]
    evals = [(r["step"], round(r["eval_success"], 4)) for r in rows if "eval_success" in r]
    return {"task": name, "seed": seed, "grpo_mixed_share_per_step": [round(x, 4) for x in mixed],
            "grpo_mixed_share": round(float(np.mean(mixed)), 4), "held_out_success_per_eval": evals,
            "warmed_success_by_level": levels, "warmed_success": summary.get("metrics", summary),
            "train_seconds": round(train_seconds, 1)}


def summarize(rows: list[dict]) -> dict:
    """Per task: mean and standard error over seeds of GRPO's mixed share and the warmed success."""
    out = {}
    for name in dict.fromkeys(r["task"] for r in rows):
        mine = [r for r in rows if r["task"] == name]
        mixed = np.array([r["grpo_mixed_share"] for r in mine])
        start = np.array([r["held_out_success_per_eval"][0][1] for r in mine])
        se = lambda x: round(float(x.std(ddof=1) / np.sqrt(len(x))), 4) if len(x) > 1 else None  # noqa: E731
        levels = sorted({lv for r in mine for lv in r["warmed_success_by_level"]})
        out[name] = {"what": TASKS[name]["what"], "seeds": len(mine),
                     "grpo_mixed_share": round(float(mixed.mean()), 4), "grpo_mixed_share_se": se(mixed),
                     "held_out_success_at_start": round(float(start.mean()), 4), "held_out_success_at_start_se": se(start),
                     "warmed_success_by_level": {lv: round(float(np.mean([r["warmed_success_by_level"][lv] for r in mine
                                                                          if lv in r["warmed_success_by_level"]])), 4)
                                                 for lv in levels}}
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trace_train.bench.testbeds", description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=8, help="GRPO steps per run (its mixed share is their mean)")
    parser.add_argument("--k", type=int, default=4, help="trace-eval samples per held-out row")
    parser.add_argument("--limit", type=int, default=64, help="held-out rows trace-eval scores")
    parser.add_argument("--out", type=Path, default=None, help="write the evidence JSON here")
    ns = parser.parse_args(argv)
    from . import origin

    head = {**origin("trace_train.bench.testbeds", argv), "steps": ns.steps, "k": ns.k, "limit": ns.limit}
    print(json.dumps(head), flush=True)
    rows = []
    for name in ns.tasks:
        for seed in ns.seeds:
            rows.append(run_seed(name, seed, steps=ns.steps, k=ns.k, limit=ns.limit))
            print(json.dumps(rows[-1]), flush=True)
    result = {**head, "load_average_after": os.getloadavg(), "per_seed": rows, "summary": summarize(rows)}
    print(json.dumps(result["summary"], indent=1))
    if ns.out is not None:
        ns.out.parent.mkdir(parents=True, exist_ok=True)
        ns.out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {ns.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
