"""The README's own-task quickstart on several seeds: held-out success at the start and the end, tokens.

    python -m trace_train.bench.quickstart                       # the README's command, seeds 0 1 2
    python -m trace_train.bench.quickstart --defaults            # the trainer's defaults (no overrides)
    python -m trace_train.bench.quickstart -- optim.lr=1e-3      # the README's command plus overrides

The command is read from README.md (the block after ``<!-- quickstart: own task -->``) and run as
``python -m trace_train.train`` from the repository root, each seed in a fresh temporary ``run_dir``
(``OMP_NUM_THREADS=1``). One JSON line per seed: held-out success per evaluation step, generated tokens
per step (first, largest, last), wall seconds; then a summary line with the count of seeds that ended
above their start. The load average at the start is recorded, as the machine may be shared.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from trace_train.child_python import module_command
from . import origin

REPO = Path(__file__).resolve().parents[2]
MARKER = "<!-- quickstart: own task -->"


def readme_command(readme: Path = REPO / "README.md") -> list[str]:
    """The arguments of the README's own-task command (after the program name), continuations joined."""
    text = readme.read_text()
    block = re.search(r"```(?:bash)?\n(.*?)```", text[text.index(MARKER):], re.S).group(1)
    line = next(ln for ln in re.sub(r"\s*\\\n\s*", " ", block).splitlines()
                if ln.strip() and not ln.lstrip().startswith("#"))
    return shlex.split(line, comments=True)[1:]


def run_seed(args: list[str], seed: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="quickstart_") as tmp:
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        start = time.perf_counter()
        done = subprocess.run([*module_command("trace_train.train"), *args, f"seed={seed}", f"run_dir={tmp}/run",
                               "--quiet"], cwd=REPO, env=env, capture_output=True, text=True)
        seconds = time.perf_counter() - start
        if done.returncode:
            raise SystemExit(f"seed {seed} failed: {done.stderr[-2000:]}")
        rows = [json.loads(line) for line in (Path(tmp) / "run" / "metrics.jsonl").read_text().splitlines()]
    evals = [(r["step"], round(r["eval_success"], 4)) for r in rows if "eval_success" in r]
    tokens = [int(r["generated_tokens"]) for r in rows if "generated_tokens" in r]
    warnings = [ln for ln in done.stderr.splitlines() if "warning:" in ln]
    return {"seed": seed, "eval_success": evals, "start": evals[0][1], "end": evals[-1][1],
            "tokens_first_max_last": [tokens[0], max(tokens), tokens[-1]], "warnings": warnings,
            "wall_seconds": round(seconds, 1)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trace_train.bench.quickstart", description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--defaults", action="store_true", help="only task.name and task.train (the trainer's defaults)")
    parser.add_argument("overrides", nargs="*", help="more dotted.key=value overrides, after --")
    ns = parser.parse_args(argv)
    record = origin("trace_train.bench.quickstart", argv)
    args = readme_command()
    if ns.defaults:
        args = [a for a in args if a.startswith(("task.name=", "task.train="))]
    args += ns.overrides
    print(json.dumps({**record, "trace_train_args": args}), flush=True)  # the header line: the run's record
    results = [run_seed(args, seed) for seed in ns.seeds]
    for r in results:
        print(json.dumps(r), flush=True)
    above = sum(r["end"] > r["start"] for r in results)
    print(json.dumps({"seeds": len(results), "ended_above_start": above,
                      "mean_gain": round(sum(r["end"] - r["start"] for r in results) / len(results), 4)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
