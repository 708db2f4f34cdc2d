"""glibc's freed blocks kept in the process (``trace_train.run.malloc``): memory freed by one step is reused
by the next without faulting its pages in again."""

import platform
import subprocess
import sys

import pytest

GLIBC = platform.libc_ver()[0] == "glibc"

STEPS = """
import resource, sys
import numpy as np
if sys.argv[1] == "kept":
    from trace_train.run.malloc import keep_freed_memory
    assert keep_freed_memory()
def step():  # a forward's pattern: blocks of mixed sizes, a few alive at once, freed in turn
    live = []
    for mb in (1, 3, 6, 12, 24, 2, 5, 30, 8):
        block = np.empty(mb << 18, dtype=np.float32)
        block.fill(1.0)  # touch every page
        live.append(block)
        if len(live) > 3:
            live.pop(0)
for _ in range(3):
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    step()
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 10)
"""


def faults_per_step(mode: str) -> float:
    out = subprocess.run([sys.executable, "-c", STEPS, mode], capture_output=True, text=True, check=True)
    return float(out.stdout.split()[-1])


def test_a_step_reuses_what_the_last_one_freed():
    from trace_train.run.malloc import keep_freed_memory

    if not GLIBC:  # the platform, not the function under test, decides: a False on glibc is a failure
        assert keep_freed_memory() is False
        pytest.skip("not glibc (macOS, musl): its malloc thresholds do not exist, nothing is set")
    assert keep_freed_memory() is True
    default, kept = faults_per_step("default"), faults_per_step("kept")
    # 89 MB touched a step: glibc's defaults map most of it afresh (about 1,300 faults a step here, 4 KiB
    # each); kept, the heap serves it again (0 here; a few allowed for the interpreter's own)
    assert default > 300
    assert kept < 0.05 * default


def test_it_is_set_once_and_says_whether_it_took():
    from trace_train.run import malloc

    first = malloc.keep_freed_memory()
    assert malloc.keep_freed_memory() is first
    assert malloc._applied == [first]


def test_a_process_that_leaves_the_defaults_keeps_them():
    script = ("from trace_train.run.malloc import keep_freed_memory, leave_glibc_defaults\n"
              "leave_glibc_defaults()\n"
              "print(keep_freed_memory())\n"
              "leave_glibc_defaults()  # again: still nothing set\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False"]


def test_defaults_cannot_come_back_once_set():
    from trace_train.run import malloc

    if not GLIBC:
        pytest.skip("not glibc (macOS, musl): nothing is ever set, so the defaults always stay")
    assert malloc.keep_freed_memory() is True
    with pytest.raises(RuntimeError, match="cannot return"):
        malloc.leave_glibc_defaults()
