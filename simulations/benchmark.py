"""Speed of the Bernoulli model: simulated turns per second, raw and through the whole batch pipeline.

    python -m simulations.benchmark                 # about 10 s
    python -m simulations.benchmark --json results/benchmarks/simulator.json
    python -m simulations.benchmark --rollouts 100000 --repeats 1
    python -m simulations.benchmark --scaling       # batches of 10^4 .. 10^6 prompts (several GB)

``raw`` times ``BernoulliTreeModel.rollouts`` alone (one rollout per prompt, vectorised over all of
them); ``batch`` times ``runner.sample_batch`` with TRACE and the oracle predictor, which adds the two
allocation stages and the ``RolloutForest`` bookkeeping. Best of ``repeats``; the process pins
itself to one CPU core where the OS allows it. ``--scaling`` times one batch per pool size
(10^4, 10^5, 10^6 prompts, four rollouts per prompt) and the process's peak memory after each, to
show that time and memory grow linearly with the batch.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

import numpy as np

from trace_theory import RolloutBudget, get_policy
from trace_theory.benchmark import provenance

from .experiments.common import PAPER_GRPO_RATIO, calibrated
from .model import BernoulliTreeModel
from .predictors import OraclePredictor
from .runner import sample_batch


def _best(fn, repeats: int) -> tuple[float, float]:
    """(turns, seconds) of the fastest of ``repeats`` calls of ``fn() -> turns``."""
    best = (0.0, np.inf)
    for _ in range(repeats):
        start = time.perf_counter()
        turns = fn()
        elapsed = time.perf_counter() - start
        if elapsed < best[1]:
            best = (turns, elapsed)
    return best


def measure(rollouts: int = 500_000, *, repeats: int = 3, seed: int = 0) -> dict[str, float]:
    """Millions of simulated turns per second: ``raw`` (model only) and ``batch`` (whole pipeline)."""
    model = calibrated(BernoulliTreeModel(), PAPER_GRPO_RATIO, 8)
    rng = np.random.default_rng(seed)
    v0 = model.pass_rates.sample(rollouts, rng)
    depth = np.zeros(rollouts, dtype=np.int64)
    raw = _best(lambda: float(model.rollouts({"v": v0}, depth, rng).length.sum()), repeats)

    budget = RolloutBudget(max(rollouts // 3, 2), 2)
    policy, oracle = get_policy("trace"), OraclePredictor()
    pool = 2 * budget.total // 8
    batch = _best(lambda: sample_batch(model, policy, budget, oracle, pool=pool, rng=rng).turns, repeats)
    return {"raw_mturns_per_s": raw[0] / raw[1] / 1e6, "batch_mturns_per_s": batch[0] / batch[1] / 1e6}


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
    parser.add_argument("--scaling", action="store_true", help="also time one batch of 10^4, 10^5 and 10^6 prompts")
    args = parser.parse_args(argv)
    if args.rollouts < 6 or args.repeats < 1:
        print("benchmark: error: --rollouts must be at least 6 and --repeats at least 1", file=sys.stderr)
        return 2
    record = provenance("simulations.benchmark", argv)
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    result = measure(args.rollouts, repeats=args.repeats)
    if args.scaling:
        result["scaling"] = scaling()
    result["load_average"] = round(os.getloadavg()[0], 2)  # other jobs on the machine slow every figure
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({**record, "rollouts": args.rollouts, **result}, indent=2) + "\n")
    print(f"raw model:      {result['raw_mturns_per_s']:.2f} M turns/s")
    print(f"batch pipeline: {result['batch_mturns_per_s']:.2f} M turns/s (TRACE, oracle predictor; "
          f"load average {result['load_average']})")
    for row in result.get("scaling", []):
        print(
            f"one batch of {row['prompts']:>9,} prompts ({row['rollouts']:,} rollouts, {row['turns']:,.0f} turns): "
            f"{row['seconds']:6.2f} s, {row['mturns_per_s']:.2f} M turns/s, peak memory {row['peak_mb']:,.0f} MB"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
