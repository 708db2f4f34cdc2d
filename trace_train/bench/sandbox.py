"""Per-call overhead of the Python sandbox: ``python -m trace_train.bench.sandbox [--calls N]``.

Times ``run_python("pass")`` (start, isolate, run nothing, clean up) and a five-cell
``PythonSession`` call (four cells replayed), each ``--calls`` times after one warm-up call, and prints
the median and the 90th percentile of the wall time in milliseconds, the mean CPU time (user + system)
of the sandbox's processes per call, the isolation layers obtained and the load average, and the CPU
time the caller spends draining a cell that writes without end (``flood_cost``). Wall times depend on
the machine's load; the CPU time much less so.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import resource
import statistics
import time

from ..tools.sandbox import PythonSession, SandboxLimits, run_python


def _children_cpu_ms() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return 1000 * (usage.ru_utime + usage.ru_stime)


def _times(call, calls: int) -> tuple[list[float], float]:
    """Wall times of ``calls`` calls (ms) and the mean CPU time of their child processes (ms)."""
    call()
    samples = []
    cpu = _children_cpu_ms()
    for _ in range(calls):
        start = time.perf_counter()
        call()
        samples.append(1000 * (time.perf_counter() - start))
    return samples, (_children_cpu_ms() - cpu) / calls


def main(calls: int = 20, namespaces: str = "auto") -> dict[str, tuple[float, float, float]]:
    limits = SandboxLimits(namespaces=namespaces)
    session = PythonSession(limits=limits)
    for cell in ("x = 1", "y = x + 1", "import math", "z = math.sqrt(y)"):
        session.run(cell)
    cells = session.snapshot()

    def session_call():
        session.restore(cells)
        session.run("print(z)")

    results = {}
    for name, call in (("run_python('pass')", lambda: run_python("pass", limits=limits)),
                       ("session call, 4 cells replayed", session_call)):
        samples, cpu = _times(call, calls)
        samples.sort()
        results[name] = (statistics.median(samples), samples[int(0.9 * (len(samples) - 1))], cpu)
    flood = flood_cost(limits)
    print(f"isolation: {', '.join(run_python('pass', limits=limits).isolation)}")
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}, euid {os.geteuid()}")
    for name, (median, p90, cpu) in results.items():
        print(f"{name:34s} wall median {median:6.1f} ms, p90 {p90:6.1f} ms; CPU {cpu:6.1f} ms per call")
    print(f"a cell writing without end for {flood['wall_s']:.1f} s: the caller spent {flood['caller_cpu_s']:.2f} s "
          f"of CPU draining it ({flood['caller_cpu_s'] / flood['wall_s']:.1%} of a core), "
          f"{flood['dropped_bytes'] / 1e6:.0f} MB dropped")
    return results


def flood_cost(limits: SandboxLimits, seconds: float = 4.0) -> dict[str, float]:
    """CPU time this process (the caller) spends draining a cell that writes 64 KiB blocks without end
    until its wall clock (``seconds``), the wall time and the bytes dropped past the output cap."""
    code = "import os\nblock = b'x' * 65536\nwhile True:\n    os.write(1, block)\n"
    flood = dataclasses.replace(limits, wall_seconds=seconds)
    before, start = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    result = run_python(code, limits=flood)
    after, wall = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter() - start
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": wall, "caller_cpu_s": cpu, "dropped_bytes": float(result.truncated_bytes)}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--namespaces", choices=("auto", "require", "off"), default="auto")
    args = parser.parse_args()
    main(args.calls, args.namespaces)
