"""The ``ngram`` predictor's Adam steps, and a child process that runs them off the trainer's GIL.

A training step fits the predictor on a worker thread while the policy updates (:mod:`.fitting`). On a CPU
the two contend for the GIL: the fit's 200 small NumPy/SciPy steps hold it between kernels, and the
policy update's Python (module calls, autograd, the optimiser) waits for it. What the fit still costs a
step is measured by ``python -m trace_train.bench.fit --compare --arms grpo_fit grpo`` (GRPO that fits the
predictor it never reads, against GRPO; ``benchmarks/round12/fit_process_*.json``).
:class:`AdamWorker` runs :func:`adam_steps` in a child interpreter that imports NumPy and SciPy only
(this file is run by path, not as part of the package), fed over pipes with pickles; the fit thread waits
for the answer without holding the GIL. The child computes with the same code on the same machine, so a
fit gives the same numbers to the last bit as inline; if the child cannot start or dies, the fit runs
inline and says so once.

This file imports nothing from ``trace_train`` (the child runs it by path).
"""

from __future__ import annotations

import atexit
import os
import pickle
import subprocess
import sys
import threading
import warnings

import numpy as np
import scipy.sparse as sp
from scipy.special import expit

BETA1, BETA2, ADAM_EPS = 0.9, 0.999, 1e-8


def adam_steps(X: sp.csr_matrix, theta: np.ndarray, m: np.ndarray, v: np.ndarray, t: int, y: np.ndarray,
               w: np.ndarray, *, steps: int, learning_rate: float, l2: float):
    """``steps`` Adam steps on the weighted squared error sum_i w_i (sigmoid(x_i . theta[:-1] + theta[-1]) -
    y_i)^2 plus l2 ||theta[:-1]||^2 (the last entry is the bias, not penalised), from moments ``m``, ``v`` at
    step ``t``; returns the new (theta, m, v, t)."""
    theta = theta.copy()
    XT = X.T.tocsr()
    grad = np.empty_like(theta)
    for _ in range(steps):
        p = expit(X @ theta[:-1] + theta[-1])
        residual = w * 2.0 * (p - y) * p * (1.0 - p)  # d/dz of w (sigmoid(z) - y)^2
        grad[:-1] = XT @ residual + 2.0 * l2 * theta[:-1]
        grad[-1] = residual.sum()
        t += 1
        m = BETA1 * m + (1 - BETA1) * grad
        v = BETA2 * v + (1 - BETA2) * grad * grad
        m_hat = m / (1 - BETA1**t)
        v_hat = v / (1 - BETA2**t)
        theta -= learning_rate * m_hat / (np.sqrt(v_hat) + ADAM_EPS)
    return theta, m, v, t


_BOOT = ("import sys; sys.path = [p for p in sys.path if p not in ('', '.')]; "
         "import runpy; runpy.run_path(sys.argv[1], run_name='__main__')")
"""The child's command: this file by path, without the working directory on ``sys.path``."""

_SHARED: "AdamWorker | None" = None


def shared_worker() -> "AdamWorker":
    """This process's :class:`AdamWorker` (one child serves every predictor; calls take turns)."""
    global _SHARED
    if _SHARED is None:
        _SHARED = AdamWorker()
        atexit.register(_SHARED.close)  # before the interpreter tears modules down
    return _SHARED


class AdamWorker:
    """:func:`adam_steps` in a child process (started at the first call, one call at a time).

    The child ends when its input pipe closes: at :meth:`close`, or when this process exits or is killed,
    so it never outlives the trainer.
    """

    def __init__(self):
        self._proc: subprocess.Popen | None = None
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self.failed: str | None = None
        """Why the child is not used (it could not start or died); the fits then run inline."""

    def __call__(self, *args, **kwargs):
        with self._lock:
            if self.failed is None:
                try:
                    return self._remote(args, kwargs)
                except (OSError, EOFError, pickle.UnpicklingError) as error:
                    self._give_up(f"{type(error).__name__}: {error}")
        return adam_steps(*args, **kwargs)

    def _remote(self, args, kwargs):
        if self._proc is not None and self._pid != os.getpid():  # a forked copy: the child is the parent's
            self._proc = None
        if self._proc is None:
            self._pid = os.getpid()
            env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
            self._proc = subprocess.Popen([sys.executable, "-c", _BOOT, os.path.abspath(__file__)],
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, close_fds=True)
        pickle.dump((args, kwargs), self._proc.stdin, protocol=pickle.HIGHEST_PROTOCOL)
        self._proc.stdin.flush()
        ok, result = pickle.load(self._proc.stdout)
        if not ok:  # the computation itself raised: the same error inline, where it can be read
            raise RuntimeError(f"the predictor's fit process failed: {result}")
        return result

    def _give_up(self, why: str) -> None:
        self.failed = why
        warnings.warn(f"the predictor's fit runs inline from now on (its process: {why}); the policy update "
                      "may slow beside it", RuntimeWarning, stacklevel=3)
        self.close()

    def close(self) -> None:
        """End the child (it exits when its input closes)."""
        proc, self._proc = self._proc, None
        if proc is None or self._pid != os.getpid():  # a forked copy leaves the parent's child alone
            return
        for pipe in (proc.stdin, proc.stdout):
            try:
                pipe.close()
            except OSError:
                pass
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def __del__(self):
        self.close()


def _serve(stdin, stdout) -> None:
    """The child: answer each pickled (args, kwargs) with (True, adam_steps(...)) or (False, the error)."""
    while True:
        try:
            args, kwargs = pickle.load(stdin)
        except EOFError:
            return
        try:
            answer = (True, adam_steps(*args, **kwargs))
        except Exception as error:  # noqa: BLE001 - reported to the parent, which raises it
            answer = (False, f"{type(error).__name__}: {error}")
        pickle.dump(answer, stdout, protocol=pickle.HIGHEST_PROTOCOL)
        stdout.flush()


if __name__ == "__main__":
    import signal

    for _signal in (signal.SIGINT, signal.SIGTERM):  # it lives as long as its pipe: the trainer decides
        signal.signal(_signal, signal.SIG_IGN)
    _serve(sys.stdin.buffer, sys.stdout.buffer)
