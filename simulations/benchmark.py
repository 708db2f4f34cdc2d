"""Speed of the Bernoulli model: simulated turns per second, raw and through the whole batch pipeline.

    python -m simulations.benchmark                 # about 30 s on one quiet core
    python -m simulations.benchmark --json benchmarks/simulator_speed/simulator.json
    python -m simulations.benchmark --rollouts 100000 --repeats 1
    python -m simulations.benchmark --against /path/to/other/checkout --pairs 6   # paired, side by side
    python -m simulations.benchmark --scaling       # batches of 10^4 .. 10^6 prompts (several GB)

``raw`` times ``BernoulliTreeModel.rollouts`` alone (one rollout per prompt, vectorised over all of
them): the floor of the pipeline, whose ratio to it is printed. ``batch`` times ``runner.sample_batch``
with TRACE and the oracle predictor (barrier expansion), which adds the two allocation stages and the
``RolloutForest`` bookkeeping. Each figure is turns over the best of ``repeats`` calls, in wall time and
in the process's CPU time (``time.process_time``): on a shared machine the wall time counts the other
jobs' time slices too, the CPU time much less so (it still counts their cache and hyper-thread
contention). ``sizes`` repeats the batch at about 10^4, 10^5 and 10^6 turns (3,000, 30,000 and 300,000
rollouts) to show how throughput scales with the batch. The process pins itself to one CPU core where
the OS allows it; run it with ``OMP_NUM_THREADS=1``.

``--against DIR`` runs the batch in two worker processes, this checkout's and DIR's (another checkout's
repository root, e.g. ``git worktree add /tmp/old COMMIT``), pinned to the same core and taking turns
(ABBA order), so that both see the same load: per pair the ratio of CPU times, and their median.
``--scaling`` times one batch per pool size (10^4, 10^5, 10^6 prompts, four rollouts per prompt) and
the process's peak memory after each, to show that time and memory grow linearly with the batch.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from trace_theory import RolloutBudget, get_policy
from trace_theory.benchmark import git_output, provenance

from .experiments.common import PAPER_GRPO_RATIO, calibrated
from .memory import keep_freed_memory
from .model import BernoulliTreeModel
from .predictors import OraclePredictor
from .runner import sample_batch

SIZES = (3_000, 30_000, 300_000)
"""Rollouts per batch of the size table: about 10^4, 10^5 and 10^6 turns."""


def _timed(fn) -> dict[str, float]:
    """One call of ``fn() -> turns``: {"turns", "wall_s", "cpu_s", "system_s"} (system: the kernel's share
    of the CPU time, mostly page faults)."""
    wall, cpu, kernel = time.perf_counter(), time.process_time(), os.times().system
    turns = float(fn())
    return {"turns": turns, "wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu,
            "system_s": os.times().system - kernel}


def _rates(rows: list[dict]) -> dict[str, float]:
    """M turns per second over the fastest call, by wall and by CPU time."""
    return {"mturns_per_s": max(r["turns"] / r["wall_s"] for r in rows) / 1e6,
            "cpu_mturns_per_s": max(r["turns"] / r["cpu_s"] for r in rows) / 1e6}


def trace_batch(rollouts: int, rng: np.random.Generator, model=None) -> float:
    """Turns of one TRACE batch of ``rollouts`` rollouts (M = rollouts / 3 roots, N = 2; oracle predictor;
    a pool of two prompts per group of 8)."""
    model = model or calibrated(BernoulliTreeModel(), PAPER_GRPO_RATIO, 8)
    budget = RolloutBudget(max(rollouts // 3, 2), 2)
    pool = 2 * budget.total // 8
    return sample_batch(model, get_policy("trace"), budget, OraclePredictor(), pool=pool, rng=rng).turns


def measure(rollouts: int = 500_000, *, repeats: int = 3, seed: int = 0, sizes=SIZES) -> dict:
    """Millions of simulated turns per second: ``raw`` (model only) and ``batch`` (whole pipeline), by wall
    and CPU time, the batch's share of the raw rate, the batch at each of ``sizes``, and every call."""
    model = calibrated(BernoulliTreeModel(), PAPER_GRPO_RATIO, 8)
    rng = np.random.default_rng(seed)
    v0 = model.pass_rates.sample(rollouts, rng)
    depth = np.zeros(rollouts, dtype=np.int64)
    raw = [_timed(lambda: model.rollouts({"v": v0}, depth, rng).length.sum()) for _ in range(repeats)]
    batch = [_timed(lambda: trace_batch(rollouts, rng, model)) for _ in range(repeats)]
    raw_rate, batch_rate = _rates(raw), _rates(batch)
    table = []
    for size in sizes:
        rows = [_timed(lambda: trace_batch(size, rng, model)) for _ in range(repeats)]
        table.append({"rollouts": size, "turns": rows[0]["turns"], **_rates(rows), "calls": rows})
    return {
        "raw_mturns_per_s": raw_rate["mturns_per_s"], "batch_mturns_per_s": batch_rate["mturns_per_s"],
        "raw_cpu_mturns_per_s": raw_rate["cpu_mturns_per_s"],
        "batch_cpu_mturns_per_s": batch_rate["cpu_mturns_per_s"],
        "batch_over_raw": batch_rate["cpu_mturns_per_s"] / raw_rate["cpu_mturns_per_s"],
        "sizes": table,
        "calls": [{"what": "raw", **r} for r in raw] + [{"what": "batch", **r} for r in batch],
    }


_WORKER = """
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
if hasattr(os, "sched_setaffinity"):
    os.sched_setaffinity(0, {int(sys.argv[2])})
import numpy as np
import simulations
try:  # what that checkout's own entry points do
    from simulations.memory import keep_freed_memory
    keep_freed_memory()
except ImportError:
    pass
from simulations.experiments.common import PAPER_GRPO_RATIO, calibrated
from simulations.model import BernoulliTreeModel
from simulations.predictors import OraclePredictor
from simulations.runner import sample_batch
from trace_theory import RolloutBudget, get_policy
model = calibrated(BernoulliTreeModel(), PAPER_GRPO_RATIO, 8)
print(json.dumps({"package": os.path.dirname(simulations.__file__)}), flush=True)
for line in sys.stdin:
    rollouts, seed = map(int, line.split())
    budget = RolloutBudget(max(rollouts // 3, 2), 2)
    rng = np.random.default_rng(seed)
    wall, cpu, kernel = time.perf_counter(), time.process_time(), os.times().system
    turns = sample_batch(model, get_policy("trace"), budget, OraclePredictor(), pool=2 * budget.total // 8,
                         rng=rng).turns
    print(json.dumps({"turns": turns, "wall_s": time.perf_counter() - wall, "cpu_s": time.process_time() - cpu,
                      "system_s": os.times().system - kernel}), flush=True)
"""


def against(other: Path, rollouts: int, pairs: int, *, seed: int = 0) -> dict:
    """This checkout's batch and ``other``'s, side by side: ``pairs`` pairs of one batch each (same seed
    within a pair), in ABBA order, each worker pinned to this process's core. Returns per-pair rows and
    the median of this/other CPU-time speed-ups (above 1: this checkout is faster)."""
    here = Path(__file__).resolve().parents[1]
    core = str(min(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else "0"
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    env.pop("PYTHONPATH", None)
    workers = {}
    for name, root in (("this", here), ("other", other.resolve())):
        proc = subprocess.Popen([sys.executable, "-c", _WORKER, str(root), core], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True, env=env)
        package = json.loads(proc.stdout.readline())["package"]
        if Path(package).resolve().parent != root:
            proc.kill()
            raise RuntimeError(f"the {name} worker imported simulations from {package}, not from {root}")
        workers[name] = proc

    def one(name: str, pair_seed: int) -> dict:
        proc = workers[name]
        proc.stdin.write(f"{rollouts} {pair_seed}\n")
        proc.stdin.flush()
        return json.loads(proc.stdout.readline())

    rows = []
    try:
        for name in workers:  # a warm-up batch each
            one(name, seed)
        for i in range(pairs):
            order = ("this", "other") if i % 2 == 0 else ("other", "this")
            got = {name: one(name, seed + 1 + i) for name in order}
            rows.append({"this": got["this"], "other": got["other"],
                         "speedup": got["other"]["cpu_s"] / got["this"]["cpu_s"],
                         "load_average": round(os.getloadavg()[0], 2)})
    finally:
        for proc in workers.values():
            proc.stdin.close()
            proc.wait()
    return {"other": str(other), "other_commit": git_output(other, "rev-parse", "HEAD"), "rollouts": rollouts, "pairs": rows,
            "median_speedup": float(np.median([r["speedup"] for r in rows])),
            "this_cpu_mturns_per_s": float(np.median([r["this"]["turns"] / r["this"]["cpu_s"] for r in rows])) / 1e6,
            "other_cpu_mturns_per_s": float(np.median([r["other"]["turns"] / r["other"]["cpu_s"] for r in rows])) / 1e6}


def scaling(pools=(10_000, 100_000, 1_000_000), *, seed: int = 0) -> list[dict[str, float]]:
    """One TRACE batch per pool size (4 rollouts per prompt): seconds, turns/s and peak memory (MB).

    Pools run in increasing order, so the process's peak resident memory after each is that batch's
    peak (it includes the interpreter and NumPy, about 100 MB).
    """
    model = calibrated(BernoulliTreeModel(), PAPER_GRPO_RATIO, 8)
    rng = np.random.default_rng(seed)
    policy, oracle = get_policy("trace"), OraclePredictor()
    rows = []
    for pool in pools:
        budget = RolloutBudget(4 * pool // 3, 2)
        start = time.perf_counter()
        turns = sample_batch(model, policy, budget, oracle, pool=pool, rng=rng).turns
        seconds = time.perf_counter() - start
        peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        rows.append({"prompts": pool, "rollouts": budget.total, "turns": turns, "seconds": seconds,
                     "mturns_per_s": turns / seconds / 1e6, "peak_mb": peak_mb})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m simulations.benchmark", description=__doc__.splitlines()[0]
    )
    parser.add_argument(
        "--rollouts", type=int, default=500_000, help="rollouts per timed call (default 500000)"
    )
    parser.add_argument("--repeats", type=int, default=3, help="timed calls; the best counts (default 3)")
    parser.add_argument("--json", type=Path, help="also write the numbers to this JSON file")
    parser.add_argument("--no-sizes", action="store_true", help="skip the table of 10^4 .. 10^6 turns")
    parser.add_argument("--against", type=Path, help="another checkout's root: time both side by side")
    parser.add_argument("--pairs", type=int, default=6, help="pairs of batches with --against (default 6)")
    parser.add_argument("--scaling", action="store_true", help="also time one batch of 10^4, 10^5 and 10^6 prompts")
    args = parser.parse_args(argv)
    if args.rollouts < 6 or args.repeats < 1 or args.pairs < 1:
        print("benchmark: error: --rollouts must be at least 6, --repeats and --pairs at least 1", file=sys.stderr)
        return 2
    if args.against is not None and not (args.against / "simulations" / "runner.py").is_file():
        print(f"benchmark: error: --against {args.against} holds no simulations/runner.py (a checkout's root)",
              file=sys.stderr)
        return 2
    record = provenance("simulations.benchmark", argv)
    record["keeps_freed_memory"] = keep_freed_memory()  # as trace-sim does (simulations.memory)
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    result = measure(args.rollouts, repeats=args.repeats, sizes=() if args.no_sizes else SIZES)
    if args.against is not None:
        result["against"] = against(args.against, args.rollouts, args.pairs)
    if args.scaling:
        result["scaling"] = scaling()
    result["load_average_after"] = list(os.getloadavg())  # other jobs on the machine slow every figure
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({**record, "rollouts": args.rollouts, **result}, indent=2) + "\n")
    load = f"load average {record['load_average'][0]:.2f} before, {result['load_average_after'][0]:.2f} after"
    print(f"raw model:      {result['raw_mturns_per_s']:.2f} M turns/s wall, "
          f"{result['raw_cpu_mturns_per_s']:.2f} per CPU second (the floor)")
    print(f"batch pipeline: {result['batch_mturns_per_s']:.2f} M turns/s wall, "
          f"{result['batch_cpu_mturns_per_s']:.2f} per CPU second = {result['batch_over_raw']:.2f} of the floor "
          f"(TRACE, oracle predictor; {load})")
    for row in result["sizes"]:
        print(f"  batch of {row['rollouts']:>7,} rollouts ({row['turns']:>9,.0f} turns): {row['mturns_per_s']:.2f} M "
              f"turns/s wall, {row['cpu_mturns_per_s']:.2f} per CPU second")
    if "against" in result:
        a = result["against"]
        print(f"side by side with {a['other']} ({len(a['pairs'])} pairs): this {a['this_cpu_mturns_per_s']:.2f}, "
              f"other {a['other_cpu_mturns_per_s']:.2f} M turns per CPU second; median speed-up "
              f"{a['median_speedup']:.2f}x")
    for row in result.get("scaling", []):
        print(
            f"one batch of {row['prompts']:>9,} prompts ({row['rollouts']:,} rollouts, {row['turns']:,.0f} turns): "
            f"{row['seconds']:6.2f} s, {row['mturns_per_s']:.2f} M turns/s, peak memory {row['peak_mb']:,.0f} MB"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
