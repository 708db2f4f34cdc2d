"""Freed host memory kept in the process on CPU runs, so that each step does not page-fault it back in.

glibc's ``malloc`` serves a block above its *mmap threshold* with a fresh ``mmap`` and unmaps it again on
``free``, and gives the free top of its heap back to the kernel once it exceeds the *trim threshold*. The
next allocation of that memory faults in every 4 KiB page again, and the kernel zeroes each one. Both
thresholds start small (128 KiB, 256 KiB) and only grow with what was freed before, so a process that
allocates a mix of sizes, as a forward does (activations of a few MB per layer, per micro-batch, in an
order that changes with the rows), keeps paying the faults (``tests/run/test_malloc.py`` counts them). On
this project's CPU update they fell most on the arm whose micro-batches were largest; at a whole step's
scale the saving is within the run-to-run noise of ``python -m trace_train.bench.fit --compare --heap
glibc`` against its default (``docs/results.md``, the update per forwarded token).

:func:`keep_freed_memory` sets the mmap threshold to glibc's largest (32 MiB on 64-bit systems), the trim
threshold to 1 GiB and the top pad to 64 MiB, so a step's freed blocks stay in the heap for the next one.
The price: the resident memory stays near its peak instead of shrinking between steps, and a training
process reaches that peak every step anyway. It is the reason vLLM's CPU back end asks for tcmalloc, and
what PyTorch's CUDA allocator does for GPU memory. Blocks above 32 MiB are still mapped afresh.
"""

from __future__ import annotations

import ctypes

__all__ = ["keep_freed_memory", "leave_glibc_defaults", "MALLOPT"]

MALLOPT = {"M_TRIM_THRESHOLD": (-1, 1 << 30), "M_TOP_PAD": (-2, 64 << 20), "M_MMAP_THRESHOLD": (-3, 32 << 20)}
"""glibc's ``mallopt`` parameters (``malloc.h``: name -> (parameter, value))."""

_applied: list[bool] = []


def keep_freed_memory() -> bool:
    """Set :data:`MALLOPT` once per process (module docstring). True when glibc took every value; False where
    the C library is not glibc (macOS, musl: nothing changes)."""
    if not _applied:
        try:
            mallopt = ctypes.CDLL(None).mallopt
        except (AttributeError, OSError):
            _applied.append(False)
        else:
            mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
            _applied.append(all(mallopt(param, value) == 1 for param, value in MALLOPT.values()))
    return _applied[0]


def leave_glibc_defaults() -> None:
    """Keep glibc's own thresholds in this process: a later :func:`keep_freed_memory` changes nothing (for
    benchmarks that measure what keeping freed memory buys: their ``--heap glibc``). Refused once the
    thresholds were set: glibc's dynamic defaults cannot be set back."""
    if _applied and _applied[0]:
        raise RuntimeError("glibc's heap thresholds were set in this process: its defaults cannot return")
    if not _applied:
        _applied.append(False)
