"""Per-call overhead of the Python sandbox: ``python -m trace_train.tools.bench_sandbox [--calls N]``.

Times ``run_python("pass")`` (start, isolate, run nothing, clean up) and a five-cell
``PythonSession`` call (four cells replayed), each ``--calls`` times after one warm-up call, and prints
the median and the 90th percentile in milliseconds with the isolation layers obtained and the load
average (the numbers depend on the machine's load; rerun on a quiet machine to compare).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from .sandbox import PythonSession, SandboxLimits, run_python


def _times(call, calls: int) -> list[float]:
    call()
    samples = []
    for _ in range(calls):
        start = time.perf_counter()
        call()
        samples.append(1000 * (time.perf_counter() - start))
    return samples


def main(calls: int = 20, namespaces: str = "auto") -> dict[str, tuple[float, float]]:
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
        samples = sorted(_times(call, calls))
        results[name] = (statistics.median(samples), samples[int(0.9 * (len(samples) - 1))])
    print(f"isolation: {', '.join(run_python('pass', limits=limits).isolation)}")
    print(f"load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}, euid {os.geteuid()}")
    for name, (median, p90) in results.items():
        print(f"{name:34s} median {median:7.1f} ms   p90 {p90:7.1f} ms")
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--namespaces", choices=("auto", "require", "off"), default="auto")
    args = parser.parse_args()
    main(args.calls, args.namespaces)
