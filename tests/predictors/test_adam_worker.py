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
import scipy.sparse as sp

from trace_train.predictors.adam_worker import AdamWorker, adam_steps


def _problem(seed=0, rows=80, cols=300):
    rng = np.random.default_rng(seed)
    X = sp.random(rows, cols, density=0.05, format="csr", random_state=seed)
    theta, m, v = rng.normal(size=cols + 1), rng.normal(size=cols + 1) * 0.1, rng.uniform(0, 0.1, cols + 1)
    return (X, theta, m, v, 7, rng.uniform(0, 1, rows), rng.uniform(0.1, 1, rows)), dict(
        steps=50, learning_rate=0.1, l2=1e-4)


def _same(a, b):
    return all(np.array_equal(x, y) for x, y in zip(a[:3], b[:3])) and a[3] == b[3]


def test_the_process_fits_to_the_last_bit_what_inline_adam_does():
    worker = AdamWorker()
    try:
        for seed in range(3):
            args, kwargs = _problem(seed)
            assert _same(worker(*args, **kwargs), adam_steps(*args, **kwargs))
        assert worker.failed is None and worker._proc.poll() is None  # it ran in the child, which lives on
    finally:
        worker.close()
    assert worker._proc is None


def test_a_dead_child_leaves_the_fit_inline_with_one_warning():
    worker = AdamWorker()
    args, kwargs = _problem()
    expected = adam_steps(*args, **kwargs)
    worker(*args, **kwargs)
    worker._proc.kill()
    worker._proc.wait()
    with pytest.warns(RuntimeWarning, match="fit runs inline"):
        assert _same(worker(*args, **kwargs), expected)
    assert worker.failed is not None
    assert _same(worker(*args, **kwargs), expected)  # inline from now on, without another warning


def test_the_child_ignores_terminal_signals_and_ends_with_its_trainer():
    """Ctrl-C reaches the whole process group: the child keeps serving (the trainer decides when to stop),
    and once the trainer is gone, killed without a word, its child ends too (its input pipe closed)."""
    worker = AdamWorker()
    args, kwargs = _problem()
    worker(*args, **kwargs)
    os.kill(worker._proc.pid, signal.SIGINT)
    os.kill(worker._proc.pid, signal.SIGTERM)
    time.sleep(0.2)
    assert _same(worker(*args, **kwargs), adam_steps(*args, **kwargs)) and worker.failed is None
    worker.close()

    script = textwrap.dedent("""
        import os, sys
        sys.path.insert(0, sys.argv[1])
        import numpy as np, scipy.sparse as sp
        from trace_train.predictors.adam_worker import AdamWorker
        worker = AdamWorker()
        X = sp.random(5, 4, density=0.5, format="csr", random_state=0)
        worker(X, np.zeros(5), np.zeros(5), np.zeros(5), 0, np.ones(5) / 2, np.ones(5), steps=2, learning_rate=0.1,
               l2=0.0)
        print(worker._proc.pid, flush=True)
        os.kill(os.getpid(), 9)
    """)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    out = subprocess.run([sys.executable, "-c", script, root], capture_output=True, text=True, timeout=120)
    child = int(out.stdout.split()[0])
    deadline = time.monotonic() + 10
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
import numpy as np, scipy.sparse as sp
from trace_train.predictors.adam_worker import AdamWorker, adam_steps
X = sp.random(40, 30, density=0.2, format="csr", random_state=0)
args = (X, np.zeros(31), np.zeros(31), np.zeros(31), 0, np.full(40, 0.3), np.ones(40))
kwargs = dict(steps=20, learning_rate=0.1, l2=0.0)
want = adam_steps(*args, **kwargs)
same = lambda got: all(np.array_equal(a, b) for a, b in zip(got[:3], want[:3])) and got[3] == want[3]
worker = AdamWorker()
worker(*args, **kwargs)
parents_child = worker._proc.pid
read, write = os.pipe()
pid = os.fork()
if pid == 0:  # the forked copy: fit, and say whether a child of its own answered
    os.close(read)
    ok = same(worker(*args, **kwargs)) and worker._proc.pid != parents_child
    worker.close()
    os.write(write, b"1" if ok else b"0")
    os._exit(0)
os.close(write)
os.waitpid(pid, 0)
forked_ok = os.read(read, 1) == b"1"
print(forked_ok, worker._proc.pid == parents_child and same(worker(*args, **kwargs)) and worker.failed is None)
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
