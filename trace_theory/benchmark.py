"""Allocation speed on one core: a scaling table of floor, heap greedy and ours, measured in one run.

Run ``python -m trace_theory.benchmark`` (``make bench``; ``--quick`` stops at 10^4; ``--json PATH``
saves the numbers). The process pins itself to one CPU core where the OS allows it.

Workloads, at n = 10^3, 10^4, 10^5 and 10^6 candidates:

* roots: n prompts with pass rates from Beta(0.5, 0.5) and a budget of 8 rollouts per prompt
  (``allocate_roots``, no cap), against a heap greedy that activates a prompt with a pair of rollouts
  and then adds single rollouts by marginal gain (the obvious approach; not exact at the non-concave
  start, so its utility is reported too);
* prefixes: n anchors over n / 10 prompts, continuation budgets of 0-19 per prompt
  (``allocate_prefixes``), against a per-prompt heap greedy (exact here, since flip is concave).

A second table holds the prompts fixed (1,000, uniform pass rates) and raises the root budget from 10^3
to 10^6: ``allocate_roots`` as it is ("ours", the closed form, whose cost does not grow with the budget)
against the doubling table it used before ("table", ``method="table"``, still the reference of the
tests and the solver for a Beta posterior), whose width follows the largest group. The table runs in a child process with a memory cap (``--table-memory-gb``) and a time
limit (``--table-seconds``) because at 10^6 it needs tens of GB; a row that hits one says so.

The **floor** is ``np.argpartition`` of the budget-th largest over the marginal gains themselves,
precomputed: each candidate's first w = 2 ceil(B / n) + 8 gains (the table ``allocate_roots`` starts
from). Any exact greedy must at least select among these, so no exact allocator can beat it by much;
``ours / floor`` is the figure of merit: floor and ours are called alternately (a warm-up each, then
several pairs), and the printed ratio is the median over pairs of their CPU-time ratio (``time.process_time``),
which other jobs on a shared machine disturb far less than wall time; the JSON keeps every pair's wall and
CPU milliseconds (``repeats``) and the load before and after. The ms columns are medians of wall time.
The heap greedy is timed once (it takes minutes at 10^6 prompts).

``--against DIR`` (another checkout's root) also times this checkout's ``allocate_prefixes`` and DIR's
side by side on the prefix workload (``--against-sizes``, default 10^5 and 10^6 anchors): two worker
processes pinned to the same core, the same inputs, calls alternating in ABBA order after a warm-up each;
per size the median over calls of other / this in CPU time (above 1: this checkout is faster), and the
ratio of the two lowest CPU times (``min_speedup``: on a machine whose steal time moves a call's CPU time
by a third, the fastest call is the best estimate of what the code itself costs). A code
change is judged by this ratio, not by two runs' ratios to the floor: the floor is bound by memory
bandwidth, which other tenants of a shared machine move, and the allocator by arithmetic.
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import platform
import resource
import shlex
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from .allocate import allocate_prefixes, allocate_roots, root_utility
from .contrast import flip_probability


def git_output(root: Path, *args: str) -> str | None:
    """``git -C root ARGS``'s output, stripped; None where git is missing, fails or takes over 10 s."""
    try:
        done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def provenance(module: str, argv=None) -> dict:
    """What every evidence file records about its run: ``commit`` (``git rev-parse HEAD`` of the checkout
    this package runs from; None outside a git checkout), ``dirty`` (uncommitted changes to tracked
    files), ``command`` (``python -m MODULE ARGS``; ``argv`` defaults to ``sys.argv[1:]``),
    ``load_average`` (``os.getloadavg()``, at the start of the run) and ``machine`` (CPUs, platform,
    Python). The benchmarks of ``simulations`` and ``trace_train`` call it too (``benchmarks/README.md``).
    """
    root = Path(__file__).resolve().parents[1]
    commit = git_output(root, "rev-parse", "HEAD")
    status = git_output(root, "status", "--porcelain", "--untracked-files=no") if commit else None
    args = sys.argv[1:] if argv is None else [str(a) for a in argv]
    return {
        "commit": commit,
        "dirty": bool(status) if status is not None else None,
        "command": shlex.join(["python", "-m", module, *args]),
        "load_average": list(os.getloadavg()),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                    "python": platform.python_version()},
    }


def _once(fn) -> tuple[object, float]:
    """(result, seconds) of one call of ``fn``."""
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def _paired(floor, ours, repeats: int) -> dict:
    """``floor`` and ``ours`` called alternately ``repeats`` times after a warm-up each, so that both see the
    same load: per repeat the wall and CPU (``time.process_time``) milliseconds of each; the medians; and
    ``trace_over_floor``, the median over repeats of ours / floor in CPU time (the figure of merit)."""
    floor(), ours()
    rows = []
    for _ in range(repeats):
        row = {}
        for name, fn in (("floor", floor), ("trace", ours)):
            wall, cpu = time.perf_counter(), time.process_time()
            fn()
            row[f"{name}_cpu_ms"] = 1e3 * (time.process_time() - cpu)
            row[f"{name}_ms"] = 1e3 * (time.perf_counter() - wall)
        rows.append(row)
    ratio = [r["trace_cpu_ms"] / max(r["floor_cpu_ms"], 1e-6) for r in rows]
    return {"floor_ms": float(np.median([r["floor_ms"] for r in rows])),
            "trace_ms": float(np.median([r["trace_ms"] for r in rows])),
            "trace_over_floor": float(np.median(ratio)), "repeats": rows}


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


SIZES = (1_000, 10_000, 100_000, 1_000_000)


def _width(budget: int, n: int) -> int:
    return 2 * -(-budget // n) + 8


def roots_row(n: int, rng: np.random.Generator, repeats: int) -> dict:
    """One row of the root table: n prompts, Beta(0.5, 0.5) pass rates, 8 rollouts per prompt."""
    v, budget = rng.beta(0.5, 0.5, n), 8 * n
    m = np.arange(_width(budget, n) + 1)
    from .contrast import mixed_probability

    gains = np.diff(mixed_probability(v[:, None], m[None, :]), axis=1)
    ours = allocate_roots(v, budget)
    greedy, heap_seconds = _once(lambda: heap_roots(v, budget))
    flat = gains.ravel()
    timed = _paired(lambda: np.argpartition(flat, flat.size - budget), lambda: allocate_roots(v, budget), repeats)
    return {
        "n": n,
        "budget": budget,
        "heap_greedy_ms": 1e3 * heap_seconds,
        "trace_utility": root_utility(v, ours),
        "heap_greedy_utility": root_utility(v, greedy),
        **timed,
    }


def prefixes_row(n: int, rng: np.random.Generator, repeats: int) -> dict:
    """One row of the prefix table: n anchors over n / 10 prompts, budgets of 0-19 per prompt."""
    groups = max(n // 10, 1)
    v = rng.random(n)
    r = (rng.random(n) < v).astype(float)
    prompt = np.sort(rng.integers(0, groups, n))
    budget = rng.integers(0, 20, groups)
    total = int(budget.sum())
    q = r * v + (1 - r) * (1 - v)
    gains = q[:, None] ** np.arange(_width(total, n))[None, :] * (1 - q)[:, None]
    ours = allocate_prefixes(v, r, prompt, budget).k
    greedy, heap_seconds = _once(lambda: heap_prefixes(v, r, prompt, budget))
    flat = gains.ravel()
    timed = _paired(lambda: np.argpartition(flat, flat.size - total),
                    lambda: allocate_prefixes(v, r, prompt, budget), repeats)
    return {
        "n": n,
        "budget": total,
        "heap_greedy_ms": 1e3 * heap_seconds,
        "trace_utility": float(flip_probability(v, r, ours).sum()),
        "heap_greedy_utility": float(flip_probability(v, r, greedy).sum()),
        **timed,
    }


def run(*, quick: bool = False, seed: int = 0, sizes=None) -> dict:
    """{"roots": [row per size], "prefixes": [row per size]}; see the module docstring."""
    rng = np.random.default_rng(seed)
    sizes = sizes or (SIZES[:2] if quick else SIZES)
    table = {"roots": [], "prefixes": []}
    for n in sizes:
        repeats = 5 if n >= 100_000 else 7
        table["roots"].append(roots_row(n, rng, repeats))
        table["prefixes"].append(prefixes_row(n, rng, repeats))
    return table


_AGAINST_WORKER = """
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
if hasattr(os, "sched_setaffinity"):
    os.sched_setaffinity(0, {int(sys.argv[2])})
import numpy as np
import trace_theory
from trace_theory.allocate import allocate_prefixes
print(json.dumps({"package": os.path.dirname(trace_theory.__file__)}), flush=True)
inputs = {}
for line in sys.stdin:
    n, seed = map(int, line.split())
    if (n, seed) not in inputs:
        rng = np.random.default_rng(seed)
        v = rng.random(n)
        r = (rng.random(n) < v).astype(float)
        groups = max(n // 10, 1)
        inputs[n, seed] = (v, r, np.sort(rng.integers(0, groups, n)), rng.integers(0, 20, groups))
    cpu = time.process_time()
    k = allocate_prefixes(*inputs[n, seed]).k
    cpu = time.process_time() - cpu
    print(json.dumps({"cpu_ms": 1e3 * cpu, "k_sum": int(k.sum()), "k_hash": int((k * np.arange(n) % 1000003).sum())}),
          flush=True)
"""


def against(other: Path, sizes=(100_000, 1_000_000), calls: int = 40, *, seed: int = 0) -> dict:
    """This checkout's ``allocate_prefixes`` and ``other``'s side by side (module docstring): per size, the
    per-call CPU milliseconds of both, whether they gave the same counts, ``median_speedup`` and
    ``min_speedup``."""
    here = Path(__file__).resolve().parents[1]
    core = str(min(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else "0"
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    env.pop("PYTHONPATH", None)
    workers = {}
    try:
        for name, root in (("this", here), ("other", Path(other).resolve())):
            proc = subprocess.Popen([sys.executable, "-I", "-c", _AGAINST_WORKER, str(root), core],
                                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
            workers[name] = proc
            package = json.loads(proc.stdout.readline())["package"]
            if Path(package).resolve().parent != root:
                raise RuntimeError(f"the {name} worker imported trace_theory from {package}, not from {root}")

        def one(name: str, n: int) -> dict:
            workers[name].stdin.write(f"{n} {seed}\n")
            workers[name].stdin.flush()
            return json.loads(workers[name].stdout.readline())

        rows = []
        for n in sizes:
            warm = {name: one(name, n) for name in workers}
            pairs = []
            for i in range(calls):
                order = ("this", "other") if i % 4 in (0, 3) else ("other", "this")
                got = {name: one(name, n) for name in order}
                pairs.append({"this_cpu_ms": got["this"]["cpu_ms"], "other_cpu_ms": got["other"]["cpu_ms"]})
            rows.append({"n": n, "same_counts": warm["this"]["k_sum"] == warm["other"]["k_sum"]
                         and warm["this"]["k_hash"] == warm["other"]["k_hash"],
                         "this_cpu_ms": float(np.median([p["this_cpu_ms"] for p in pairs])),
                         "other_cpu_ms": float(np.median([p["other_cpu_ms"] for p in pairs])),
                         "median_speedup": float(np.median([p["other_cpu_ms"] / max(p["this_cpu_ms"], 1e-6)
                                                            for p in pairs])),
                         "min_speedup": min(p["other_cpu_ms"] for p in pairs)
                         / max(min(p["this_cpu_ms"] for p in pairs), 1e-6),
                         "calls": pairs})
    finally:
        for proc in workers.values():
            proc.stdin.close()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
    return {"other": str(other), "other_commit": git_output(Path(other), "rev-parse", "HEAD"), "rows": rows}


BUDGETS = (1_000, 10_000, 100_000, 1_000_000)

# Run in a child process: today's doubling table for one budget; prints {"ms": ..., "m": [...]}.
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[1])
"""Where this ``trace_theory`` was imported from: the isolated (``-I``) child finds it there, and nothing in the
caller's working directory, ``PYTHONPATH`` or user site."""
_TABLE_CHILD = """
import json, sys, time
import numpy as np
from trace_theory.allocate import _solve_roots
from trace_theory.benchmark import budget_pool
n, budget, seed, repeats = map(int, sys.argv[1:])
v = budget_pool(n, seed)
times = []
for _ in range(repeats):
    start = time.perf_counter()
    m = _solve_roots(v, None, budget, 2, budget, method="table")
    times.append(time.perf_counter() - start)
    if times[0] > 1.0:
        break
print(json.dumps({"ms": 1e3 * float(np.median(times)), "m": m.tolist()}))
"""


def budget_pool(n: int, seed: int) -> np.ndarray:
    """The prompts of the budget table: n uniform pass rates."""
    return np.random.default_rng(seed).random(n)


def _table_in_child(n: int, budget: int, seed: int, repeats: int, seconds: float, memory_gb: float) -> dict:
    """{"ms", "m"} of the doubling table in a capped child process, or {"failed": reason}."""
    cap = int(memory_gb * 2**30)

    def limit_memory():
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    try:
        done = subprocess.run(
            [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {_PACKAGE_ROOT!r})\n{_TABLE_CHILD}",
             str(n), str(budget), str(seed), str(repeats)],
            capture_output=True, text=True, timeout=seconds, preexec_fn=limit_memory, env=env,
        )
    except subprocess.TimeoutExpired:
        return {"failed": f"> {seconds:g} s"}
    if done.returncode != 0:
        return {"failed": f"> {memory_gb:g} GB" if "MemoryError" in done.stderr else done.stderr.strip().splitlines()[-1]}
    return json.loads(done.stdout)


def budget_rows(*, n: int = 1_000, budgets=BUDGETS, seed: int = 0, repeats: int = 5, table_seconds: float = 120.0,
                table_memory_gb: float = 4.0) -> list[dict]:
    """Rows of the budget table: n uniform prompts, each budget; ours against the doubling table."""
    v = budget_pool(n, seed)
    rows = []
    for budget in budgets:
        ours = allocate_roots(v, budget)
        table = _table_in_child(n, budget, seed, repeats, table_seconds, table_memory_gb)
        rows.append({
            "n": n,
            "budget": budget,
            "largest_group": int(ours.max()),
            "table_ms": table.get("ms"),
            "table_failed": table.get("failed"),
            "trace_ms": 1e3 * _median_seconds(lambda: allocate_roots(v, budget), repeats),
            "same_as_table": None if "m" not in table else table["m"] == ours.tolist(),
        })
    return rows


def format_budget_table(rows: list[dict]) -> str:
    lines = [f"{'':<9} {'n':>9} {'budget':>9} {'largest':>9} {'table ms':>12} {'ours ms':>9}  same answer"]
    for row in rows:
        table = f"{row['table_ms']:>12.2f}" if row["table_ms"] is not None else f"{row['table_failed']:>12}"
        lines.append(
            f"{'budget':<9} {row['n']:>9,} {row['budget']:>9,} {row['largest_group']:>9,} {table} "
            f"{row['trace_ms']:>9.2f}  {row['same_as_table']}"
        )
    return "\n".join(lines)


def format_table(table: dict) -> str:
    lines = [f"{'':<9} {'n':>9} {'budget':>9} {'floor ms':>9} {'heap ms':>9} {'ours ms':>9} {'ours/floor':>10}  "
             "exact >= greedy"]
    for name, rows in table.items():
        if name not in ("roots", "prefixes"):
            continue
        for row in rows:
            lines.append(
                f"{name:<9} {row['n']:>9,} {row['budget']:>9,} {row['floor_ms']:>9.2f} {row['heap_greedy_ms']:>9.1f} "
                f"{row['trace_ms']:>9.2f} {row['trace_over_floor']:>10.2f}  "
                f"{row['trace_utility'] >= row['heap_greedy_utility'] - 1e-9}"
            )
    lines.append("(ms: median wall time; ours/floor: median over paired calls of the CPU-time ratio)")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="only n = 10^3 and 10^4")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, help="also write the numbers to this file")
    parser.add_argument("--table-seconds", type=float, default=120.0, help="time limit of one doubling-table call")
    parser.add_argument("--table-memory-gb", type=float, default=4.0, help="memory cap of the doubling table's process")
    parser.add_argument("--against", type=Path,
                        help="another checkout's root: time both prefix allocators side by side")
    parser.add_argument("--against-sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--against-only", action="store_true",
                        help="with --against: skip the floor and budget tables")
    args = parser.parse_args(argv)
    if args.against is not None and not (args.against / "trace_theory" / "allocate.py").is_file():
        parser.error(f"--against {args.against} holds no trace_theory/allocate.py (a checkout's root)")
    origin = provenance("trace_theory.benchmark", argv)
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    result = {}
    if not (args.against is not None and args.against_only):
        result = run(quick=args.quick, seed=args.seed)
        print(format_table(result))
        result["budgets"] = budget_rows(
            budgets=BUDGETS[:2] if args.quick else BUDGETS, seed=args.seed,
            table_seconds=args.table_seconds, table_memory_gb=args.table_memory_gb,
        )
        print(format_budget_table(result["budgets"]))
    if args.against is not None:
        result["against"] = against(args.against, args.against_sizes, seed=args.seed)
        for row in result["against"]["rows"]:
            print(f"against {result['against']['other_commit'] or args.against}: n = {row['n']:,}: this "
                  f"{row['this_cpu_ms']:.2f} ms, other {row['other_cpu_ms']:.2f} ms (CPU), median speed-up "
                  f"{row['median_speedup']:.2f}x (fastest calls: {row['min_speedup']:.2f}x), "
                  f"same counts: {row['same_counts']}")
    result["load_average_after"] = list(os.getloadavg())  # other jobs on the machine slow every figure
    print(f"load average {origin['load_average'][0]:.2f} before, {result['load_average_after'][0]:.2f} after")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({**origin, **result}, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
