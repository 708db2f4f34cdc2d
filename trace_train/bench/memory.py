"""Peak resident memory of a training run: ``trace-train`` in a child process, its RSS and its children's
summed from ``/proc`` every 50 ms, the highest sum reported (Linux only).

    python -m trace_train.bench.memory                                   # cpu_demo, 2 steps, hf and vllm
    python -m trace_train.bench.memory --backends vllm -- backend.kv_cache_memory_bytes=4000000000

Each run gets a fresh temporary ``run_dir`` and ``OMP_NUM_THREADS=1``; the JSON line per back end gives
``peak_rss_bytes``, the wall seconds and the load average at the start.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ..child_python import module_command
from . import BACKEND_NAMES, origin


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return out


def _rss(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def tree_rss(pid: int) -> int:
    """RSS of ``pid`` and all its descendants, in bytes."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        total += _rss(p)
        todo += _children(p)
    return total


def measure(command: list[str], env: dict | None = None, interval: float = 0.05) -> dict:
    """Run ``command`` to its end; its exit status, wall seconds and peak tree RSS."""
    load = os.getloadavg()[0]
    start = time.perf_counter()
    proc = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    peak = 0
    while proc.poll() is None:
        peak = max(peak, tree_rss(proc.pid))
        time.sleep(interval)
    err = proc.stderr.read()
    out = {"rc": proc.returncode, "seconds": round(time.perf_counter() - start, 1), "peak_rss_bytes": peak,
           "peak_rss_gb": round(peak / 1e9, 2), "load_avg_1min": load}
    if proc.returncode:
        out["stderr_tail"] = err[-800:]
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="cpu_demo")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--backends", nargs="+", default=list(BACKEND_NAMES), choices=BACKEND_NAMES)
    parser.add_argument("overrides", nargs="*", help="extra dotted overrides for trace-train (after --)")
    args = parser.parse_args(argv)
    print(json.dumps(origin("trace_train.bench.memory", argv)), flush=True)  # the run's record first
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for kind in args.backends:
        with tempfile.TemporaryDirectory() as tmp:
            cmd = [*module_command("trace_train.train"), "--config", args.config, f"steps={args.steps}",
                   f"backend.kind={kind}", f"run_dir={tmp}/run", "tensorboard=false", *args.overrides]
            print(json.dumps({"backend": kind, "overrides": args.overrides, **measure(cmd, env)}), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
