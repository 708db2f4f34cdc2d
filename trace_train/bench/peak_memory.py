"""Peak memory of a block of code: CUDA's allocator peak on a GPU, the process's peak RSS on a CPU.

    with PeakMemory(device) as peak:
        ...
    peak.bytes   # highest memory in use during the block, minus what was in use when it started

On CUDA this is ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats`` (tensors only). On
CPU it is Linux's high-water mark of the resident set (``VmHWM`` in ``/proc/self/status``), reset on
entry by writing 5 to ``/proc/self/clear_refs``: every allocation counts (tensors, allocator slack,
Python objects). Memory a block frees stays resident or not as glibc's sliding mmap threshold decides,
so one block measured -1 to 58 MB in repeated fresh processes; started with ``MALLOC_MMAP_THRESHOLD_=131072``
every allocation over 128 kB is mapped and unmapped by itself and the same block measured 17 MB each time
(``tests/update/test_logprobs.py``). Elsewhere :attr:`PeakMemory.supported` is
False and ``bytes`` is None.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

__all__ = ["PeakMemory"]

_STATUS = Path("/proc/self/status")


def _status_kb(field: str) -> int:
    return int(re.search(rf"{field}:\s+(\d+) kB", _STATUS.read_text()).group(1))


class PeakMemory:
    """Context manager measuring the peak memory of its block (see the module docstring)."""

    def __init__(self, device: str | torch.device = "cpu"):
        self.device = torch.device(device)
        self.bytes: int | None = None
        self.supported = self.device.type == "cuda" or _STATUS.exists()

    def __enter__(self) -> "PeakMemory":
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self._start = torch.cuda.memory_allocated(self.device)
        elif self.supported:
            try:
                Path("/proc/self/clear_refs").write_text("5")
            except OSError:
                self.supported = False
                return self
            self._start = _status_kb("VmRSS") * 1024
        return self

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.bytes = torch.cuda.max_memory_allocated(self.device) - self._start
        elif self.supported:
            self.bytes = _status_kb("VmHWM") * 1024 - self._start
