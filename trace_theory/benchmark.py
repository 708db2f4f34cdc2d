"""Allocation speed on one core, next to a straightforward heap-based greedy measured in the same run.

Run ``python -m trace_theory.benchmark`` (``--quick`` for a smaller, faster run; ``--json PATH`` to
save the numbers). The process pins itself to one CPU core where the OS allows it.

Workloads (issue "trace_theory", section Speed):

* roots: 10,000 prompts with pass rates from Beta(0.5, 0.5), a budget of 81,920 rollouts
  (``allocate_roots``, no cap), against a heap greedy that activates a prompt with a pair of rollouts
  and then adds single rollouts by marginal gain (the obvious approach; not exact at the non-concave
  start, so its utility is reported too);
* prefixes: 100,000 anchors over 10,000 prompts, continuation budgets of 0-19 per prompt
  (``allocate_prefixes``), against a per-prompt heap greedy (exact here, since flip is concave).

Each timing is the median of several repeats after one warm-up call.
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import time
from pathlib import Path

import numpy as np

from .allocate import allocate_prefixes, allocate_roots, root_utility
from .contrast import flip_probability


def _median_seconds(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def heap_roots(v: np.ndarray, budget: int) -> np.ndarray:
    """Greedy with a heap: open a prompt with 2 rollouts (worth x (1 - x) each), then add single
    rollouts by marginal gain x^m (1 - x) + (1 - x)^m x, in plain Python floats."""
    m = [0] * len(v)
    vals = v.tolist()
    heap = [(-x * (1.0 - x), i) for i, x in enumerate(vals)]
    heapq.heapify(heap)
    left = budget
    while left > 0 and heap:
        _, i = heapq.heappop(heap)
        step = 2 if m[i] == 0 else 1
        if step > left:
            continue
        m[i] += step
        left -= step
        x, n = vals[i], m[i]
        heapq.heappush(heap, (-(x**n * (1.0 - x) + (1.0 - x) ** n * x), i))
    return np.asarray(m, dtype=np.int64)


def heap_prefixes(v: np.ndarray, r: np.ndarray, prompt: np.ndarray, budget: np.ndarray) -> np.ndarray:
    """Per-prompt greedy with a heap over the marginal flip gains q^k (1 - q)."""
    q = (r * v + (1 - r) * (1 - v)).tolist()
    k = [0] * len(v)
    order = np.argsort(prompt, kind="stable")
    bounds = np.searchsorted(prompt[order], np.arange(len(budget) + 1))
    for g in range(len(budget)):
        idx = order[bounds[g]:bounds[g + 1]]
        if not len(idx):
            continue
        heap = [(-(1.0 - q[a]), a) for a in idx.tolist()]
        heapq.heapify(heap)
        for _ in range(int(budget[g])):
            _, a = heapq.heappop(heap)
            k[a] += 1
            heapq.heappush(heap, (-(q[a] ** k[a]) * (1.0 - q[a]), a))
    return np.asarray(k, dtype=np.int64)


def run(*, quick: bool = False, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    n_prompts, budget = (1_000, 8_192) if quick else (10_000, 81_920)
    n_anchors, n_groups = (10_000, 1_000) if quick else (100_000, 10_000)
    repeats = 5 if quick else 15

    v = rng.beta(0.5, 0.5, n_prompts)
    exact = allocate_roots(v, budget)
    greedy = heap_roots(v, budget)
    roots = {
        "prompts": n_prompts,
        "budget": budget,
        "trace_ms": 1e3 * _median_seconds(lambda: allocate_roots(v, budget), repeats),
        "heap_greedy_ms": 1e3 * _median_seconds(lambda: heap_roots(v, budget), max(1, repeats // 5)),
        "trace_utility": root_utility(v, exact),
        "heap_greedy_utility": root_utility(v, greedy),
    }

    va = rng.random(n_anchors)
    ra = (rng.random(n_anchors) < va).astype(float)
    prompt = np.sort(rng.integers(0, n_groups, n_anchors))
    group_budget = rng.integers(0, 20, n_groups)
    k = allocate_prefixes(va, ra, prompt, group_budget).k
    k_heap = heap_prefixes(va, ra, prompt, group_budget)
    prefixes = {
        "anchors": n_anchors,
        "prompts": n_groups,
        "budget": int(group_budget.sum()),
        "trace_ms": 1e3 * _median_seconds(lambda: allocate_prefixes(va, ra, prompt, group_budget), repeats),
        "heap_greedy_ms": 1e3 * _median_seconds(lambda: heap_prefixes(va, ra, prompt, group_budget), max(1, repeats // 5)),
        "trace_utility": float(flip_probability(va, ra, k).sum()),
        "heap_greedy_utility": float(flip_probability(va, ra, k_heap).sum()),
    }
    return {"roots": roots, "prefixes": prefixes}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tenth of the sizes")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="also write the numbers to this file")
    args = parser.parse_args(argv)
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    result = run(quick=args.quick, seed=args.seed)
    for name, row in result.items():
        print(
            f"{name:<9} {row['trace_ms']:8.1f} ms  (heap greedy {row['heap_greedy_ms']:8.1f} ms)   "
            f"utility {row['trace_utility']:.4f} vs greedy {row['heap_greedy_utility']:.4f}   "
            + ", ".join(f"{k}={row[k]}" for k in row if k in ("prompts", "anchors", "budget"))
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
