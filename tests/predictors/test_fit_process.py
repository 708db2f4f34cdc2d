"""The ngram predictor's fit process: the same numbers as inline, a fallback when it dies, no orphans."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from trace_train.predictors.fit_process import (FitProcess, batch_gram_counts, feature_matrix, fit_inline,
                                                gram_counts, hashed_row)

FIT = dict(dense=False, eps=1e-4, steps=50, learning_rate=0.1, l2=1e-4)


def _problem(seed=0, rows=80, n_buckets=512):
    """Histories as tokens cut by lengths, targets, weights and a model state over every column."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 60, size=rows)
    encoding = dict(tokens=rng.integers(0, 300, size=int(lengths.sum())).astype(np.uint64), lengths=lengths,
                    depths=rng.integers(0, 20, size=rows), n_buckets=n_buckets, ngram=2, max_depth=16)
    dim = n_buckets + 17
    weights, m, v = rng.normal(size=dim + 1), rng.normal(size=dim + 1) * 0.1, rng.uniform(0, 0.1, dim + 1)

    def state(cols):
        idx = np.append(cols, dim)
        return np.append(weights[cols], weights[dim]), m[idx], v[idx], 7

    return encoding, state, rng.uniform(0, 1, rows), rng.uniform(0.1, 1, rows)


def _same(a, b):
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("ngram", [1, 2, 3])
def test_hashing_every_row_at_once_gives_each_rows_own_counts(ngram):
    """``batch_gram_counts`` (every history of a batch hashed in one pass) gives each row exactly what
    ``gram_counts`` gives it alone, with and without a start, for empty, one-token and long rows: no gram
    spans two rows, none ends before the row's start."""
    rng = np.random.default_rng(ngram)
    lengths = np.array([0, 1, 2, 3, 40, 0, 7, 120, 1, 5])
    tokens = rng.integers(0, 300, lengths.sum()).astype(np.uint64)
    starts = np.array([0, 0, 1, 2, 17, 0, 7, 60, 1, 0])
    for rows_start in (None, starts):
        keys, counts = batch_gram_counts(tokens, lengths, n_buckets=97, ngram=ngram, starts=rows_start)
        ends = np.cumsum(lengths)
        for r, (e, n) in enumerate(zip(ends, lengths)):
            alone = gram_counts(tokens[e - n: e], n_buckets=97, ngram=ngram,
                                start=0 if rows_start is None else int(rows_start[r]))
            mine = (keys >= r * 97) & (keys < (r + 1) * 97)
            assert np.array_equal(keys[mine] - r * 97, alone[0]) and np.array_equal(counts[mine], alone[1]), r


def test_the_rows_are_the_hashed_rows_of_each_history():
    encoding, *_ = _problem(rows=5)
    X = feature_matrix(**encoding)
    ends = np.cumsum(encoding["lengths"])
    for i, (e, n, d) in enumerate(zip(ends, encoding["lengths"], encoding["depths"])):
        cols, vals = hashed_row(encoding["tokens"][e - n: e], d, n_buckets=512, ngram=2, max_depth=16)
        row = X.getrow(i)
        assert np.array_equal(row.indices, cols) and np.array_equal(row.data, vals)
        assert cols[-1] == 512 + min(d, 16) and np.isclose(np.linalg.norm(vals[:-1]), 1.0)


@pytest.mark.parametrize("dense", [False, True])
def test_the_process_fits_to_the_last_bit_what_the_inline_fit_does(dense):
    worker = FitProcess()
    try:
        for seed in range(3):
            encoding, state, y, w = _problem(seed)
            fit = {**FIT, "dense": dense}
            got = worker.fit(encoding, state, y, w, **fit)
            assert _same(got, fit_inline(encoding, state, y, w, **fit))
            assert got[0].size == (529 if dense else np.unique(feature_matrix(**encoding).indices).size)
        assert worker.failed is None and worker._proc.poll() is None  # it ran in the child, which lives on
    finally:
        worker.close()
    assert worker._proc is None


def test_a_dead_child_leaves_the_fit_inline_with_one_warning():
    worker = FitProcess()
    encoding, state, y, w = _problem()
    expected = fit_inline(encoding, state, y, w, **FIT)
    worker.fit(encoding, state, y, w, **FIT)
    worker._proc.kill()
    worker._proc.wait()
    with pytest.warns(RuntimeWarning, match="fit runs inline"):
        assert _same(worker.fit(encoding, state, y, w, **FIT), expected)
    assert worker.failed is not None
    assert _same(worker.fit(encoding, state, y, w, **FIT), expected)  # inline from now on, without another warning


def test_a_fault_in_the_computation_is_raised_not_hidden():
    worker = FitProcess()
    encoding, state, y, w = _problem()
    try:
        with pytest.raises(RuntimeError, match="fit process failed: ValueError"):
            worker.fit(encoding, state, y[:3], w[:3], **FIT)  # 3 targets for 80 histories
        assert worker.failed is None and _same(worker.fit(encoding, state, y, w, **FIT),
                                               fit_inline(encoding, state, y, w, **FIT))
    finally:
        worker.close()


def test_the_child_ignores_terminal_signals_and_ends_with_its_trainer():
    """Ctrl-C reaches the whole process group: the child keeps serving (the trainer decides when to stop),
    and once the trainer is gone, killed without a word, its child ends too (its input pipe closed)."""
    worker = FitProcess()
    encoding, state, y, w = _problem()
    worker.fit(encoding, state, y, w, **FIT)
    os.kill(worker._proc.pid, signal.SIGINT)
    os.kill(worker._proc.pid, signal.SIGTERM)
    time.sleep(0.2)
    assert _same(worker.fit(encoding, state, y, w, **FIT), fit_inline(encoding, state, y, w, **FIT))
    assert worker.failed is None
    worker.close()

    script = textwrap.dedent("""
        import os, sys
        sys.path.insert(0, sys.argv[1])
        import numpy as np
        from trace_train.predictors.fit_process import FitProcess
        worker = FitProcess()
        encoding = dict(tokens=np.arange(6, dtype=np.uint64), lengths=np.array([2, 4]), depths=np.array([0, 1]),
                        n_buckets=8, ngram=2, max_depth=16)
        state = lambda cols: (np.zeros(cols.size + 1), np.zeros(cols.size + 1), np.zeros(cols.size + 1), 0)
        worker.fit(encoding, state, np.ones(2) / 2, np.ones(2), dense=False, eps=1e-4, steps=2, learning_rate=0.1,
                   l2=0.0)
        print(worker._proc.pid, flush=True)
        os.kill(os.getpid(), 9)
    """)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run([sys.executable, "-c", script, root], capture_output=True, text=True, timeout=120)
    child = int(out.stdout.split()[0])
    deadline = time.monotonic() + 120  # ends as soon as the child has; a loaded machine may take long to run it
    while time.monotonic() < deadline and _alive(child):
        time.sleep(0.05)
    assert not _alive(child)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"  # a zombie has ended (its parent, gone, cannot reap it)
    except FileNotFoundError:
        return False


_FORK = """
import os, sys
sys.path.insert(0, sys.argv[1])
import numpy as np
from trace_train.predictors.fit_process import FitProcess, fit_inline
encoding = dict(tokens=np.arange(90, dtype=np.uint64) % 37, lengths=np.array([10, 30, 50]), depths=np.array([0, 1, 2]),
                n_buckets=64, ngram=2, max_depth=16)
state = lambda cols: (np.zeros(cols.size + 1), np.zeros(cols.size + 1), np.zeros(cols.size + 1), 0)
fit = dict(dense=False, eps=1e-4, steps=20, learning_rate=0.1, l2=0.0)
y, w = np.full(3, 0.3), np.ones(3)
want = fit_inline(encoding, state, y, w, **fit)
same = lambda got: all(np.array_equal(a, b) for a, b in zip(got, want))
worker = FitProcess()
worker.fit(encoding, state, y, w, **fit)
parents_child = worker._proc.pid
read, write = os.pipe()
pid = os.fork()
if pid == 0:  # the forked copy: fit, and say whether a child of its own answered
    os.close(read)
    ok = same(worker.fit(encoding, state, y, w, **fit)) and worker._proc.pid != parents_child
    worker.close()
    os.write(write, b"1" if ok else b"0")
    os._exit(0)
os.close(write)
os.waitpid(pid, 0)
forked_ok = os.read(read, 1) == b"1"
print(forked_ok, worker._proc.pid == parents_child and same(worker.fit(encoding, state, y, w, **fit))
      and worker.failed is None)
worker.close()
"""


def test_a_forked_trainer_starts_its_own_child_and_leaves_its_parents_alone():
    """A process forked after the first fit must not talk over its parent's pipes (the answers would
    cross): it starts a child of its own, and the parent's child still answers the parent. Forked in a
    fresh interpreter: forking the test process, with other tests' threads and locks in it, can hang."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run([sys.executable, "-c", _FORK, root], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["True", "True"]


_FORK_WHILE_FITTING = """
import os, sys, threading
sys.path.insert(0, sys.argv[1])
import numpy as np
from trace_train.predictors.fit_process import FitProcess, fit_inline
encoding = dict(tokens=np.arange(40, dtype=np.uint64) % 11, lengths=np.array([15, 25]), depths=np.array([0, 1]),
                n_buckets=32, ngram=2, max_depth=16)
state = lambda cols: (np.zeros(cols.size + 1), np.zeros(cols.size + 1), np.zeros(cols.size + 1), 0)
fit = dict(dense=False, eps=1e-4, steps=5, learning_rate=0.1, l2=0.0)
y, w = np.full(2, 0.3), np.ones(2)
want = fit_inline(encoding, state, y, w, **fit)
worker = FitProcess()
worker.fit(encoding, state, y, w, **fit)
held, release = threading.Event(), threading.Event()
def fitting():  # the trainer's fit thread, in the middle of a fit
    with worker._lock:
        held.set()
        release.wait()
threading.Thread(target=fitting).start()
held.wait()
pid = os.fork()
if pid == 0:  # the copy has no fit thread: its lock must not be the held one
    got = worker.fit(encoding, state, y, w, **fit)
    worker.close()
    os._exit(0 if all(np.array_equal(a, b) for a, b in zip(got, want)) else 1)
release.set()
_, status = os.waitpid(pid, 0)
print(os.waitstatus_to_exitcode(status))
worker.close()
"""


def test_a_copy_forked_during_a_fit_fits_on_its_own():
    """The lock a fit holds is copied held into a process forked meanwhile, where no thread will release
    it: the copy gets a fresh lock and its own child (in a fresh interpreter, for the reason above)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run([sys.executable, "-c", _FORK_WHILE_FITTING, root], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == ["0"]
