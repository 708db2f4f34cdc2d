"""The ``ngram`` predictor's numbers (hashed features, Adam steps), and a child process that fits it.

A training step fits the predictor on a worker thread while the policy updates (:mod:`.fitting`). On a CPU
the two contend for the GIL: every NumPy/SciPy call of the fit holds it between kernels, and the policy
update's Python (module calls, autograd, the optimiser) waits for it. So the whole fit runs in a child
interpreter that imports NumPy and SciPy only (this file, run by path, not as part of the package):
hashing the histories' n-grams, the calibration before the fit, ``steps_per_update`` Adam steps and the
calibration after it. The trainer's thread sends the histories' tokens, receives the batch's feature
columns, sends those columns' weights and moments, and receives the new ones; it waits without the GIL.
What the fit still costs a step is measured by ``python -m trace_train.bench.fit --compare --arms
grpo_fit grpo`` (GRPO that fits the predictor it never reads, against GRPO).

The child computes with the same functions on the same machine, so a fit gives the same numbers to the
last bit as inline; if the child cannot start or dies, the fit runs inline and says so once.

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
import weakref
from typing import Callable

import numpy as np
import scipy.sparse as sp
from scipy.special import expit

BETA1, BETA2, ADAM_EPS = 0.9, 0.999, 1e-8
_MIX, _FINAL = np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9)


# ---- the numbers -------------------------------------------------------------------------------------


def hashed_row(ids: np.ndarray, depth: int, *, n_buckets: int, ngram: int,
               max_depth: int) -> tuple[np.ndarray, np.ndarray]:
    """One history's feature columns (ascending: its n-gram buckets, then the one-hot of min(depth,
    ``max_depth``) at ``n_buckets + min(depth, max_depth)``) and values (the signed bucket counts,
    L2-normalised; 1 for the depth)."""
    return normalised_row(*gram_counts(ids, n_buckets=n_buckets, ngram=ngram), depth, n_buckets=n_buckets,
                          max_depth=max_depth)


def gram_counts(ids: np.ndarray, *, n_buckets: int, ngram: int, start: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """The signed bucket counts of the token n-grams (n <= ``ngram``) of ``ids`` that end at position
    ``start`` or later: (buckets, ascending; counts, whole numbers as floats)."""
    ids = np.asarray(ids, dtype=np.uint64)
    grams = [ids[start:]]
    for n in range(2, ngram + 1):
        first = max(start - n + 1, 0)  # the first gram of length n that ends at `start` or later
        if len(ids) - first >= n:
            mixed = ids[first: len(ids) - n + 1].copy()
            for j in range(1, n):
                mixed = mixed * _MIX + ids[first + j: len(ids) - n + 1 + j]
            grams.append(mixed + np.uint64(n))
    hashed = np.concatenate(grams) * _FINAL
    hashed ^= hashed >> np.uint64(31)
    bucket = (hashed % np.uint64(n_buckets)).astype(np.int64)
    sign = np.where((hashed >> np.uint64(63)) == 1, -1.0, 1.0)
    uniq, inverse = np.unique(bucket, return_inverse=True)
    return uniq, np.bincount(inverse, weights=sign, minlength=len(uniq))


def merged_counts(buckets: np.ndarray, counts: np.ndarray, more: np.ndarray,
                  more_counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The bucket counts of two sets of grams together (each as :func:`gram_counts` gives them): exactly
    the counts of hashing both at once, the sums being of whole numbers."""
    at = np.searchsorted(buckets, more)
    found = at < len(buckets)
    found[found] = buckets[at[found]] == more[found]
    counts = counts.copy()
    counts[at[found]] += more_counts[found]
    if found.all():
        return buckets, counts
    new = ~found
    slots = at[new] + np.arange(int(new.sum()))  # where the new buckets land among the old (both ascending)
    keep = np.ones(len(buckets) + len(slots), dtype=bool)
    keep[slots] = False
    merged, total = np.empty(len(keep), dtype=buckets.dtype), np.empty(len(keep))
    merged[keep], merged[slots] = buckets, more[new]
    total[keep], total[slots] = counts, more_counts[new]
    return merged, total


def normalised_row(buckets: np.ndarray, counts: np.ndarray, depth: int, *, n_buckets: int,
                   max_depth: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`hashed_row` from the bucket counts: L2-normalised, the depth's one-hot appended."""
    norm = np.linalg.norm(counts)
    if norm > 0:
        counts = counts / norm
    return np.append(buckets, n_buckets + min(int(depth), max_depth)), np.append(counts, 1.0)


def batch_gram_counts(tokens: np.ndarray, lengths: np.ndarray, *, n_buckets: int, ngram: int,
                      starts: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """:func:`gram_counts` of every row at once, for rows given as one array of ``tokens`` cut by ``lengths``
    (row r's grams that end at its position ``starts[r]`` or later; all of them by default): keys
    r * n_buckets + bucket, ascending (so by row, then bucket), and their counts. The same hash of the same
    tokens; the counts are sums of whole numbers, so they are exactly the per-row ones."""
    ids = np.asarray(tokens, dtype=np.uint64)
    lengths = np.asarray(lengths, dtype=np.int64)
    row = np.repeat(np.arange(len(lengths), dtype=np.int64), lengths)
    pos = np.arange(ids.size, dtype=np.int64) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    first = pos >= (0 if starts is None else np.repeat(np.asarray(starts, dtype=np.int64), lengths))
    grams, rows = [ids[first]], [row[first]]
    for n in range(2, ngram + 1):
        if ids.size < n:
            break
        mixed = ids[: ids.size - n + 1].copy()  # the gram that starts at each position
        for j in range(1, n):
            mixed = mixed * _MIX + ids[j: ids.size - n + 1 + j]
        end = slice(n - 1, None)  # a gram is kept at its last token: in its row's range and late enough
        keep = (pos[end] >= n - 1) & first[end]
        grams.append(mixed[keep] + np.uint64(n))
        rows.append(row[end][keep])
    hashed = np.concatenate(grams) * _FINAL
    hashed ^= hashed >> np.uint64(31)
    keys = np.concatenate(rows) * n_buckets + (hashed % np.uint64(n_buckets)).astype(np.int64)
    sign = np.where((hashed >> np.uint64(63)) == 1, -1.0, 1.0)
    uniq, inverse = np.unique(keys, return_inverse=True)
    return uniq, np.bincount(inverse, weights=sign, minlength=len(uniq))


def rows_from_counts(keys: np.ndarray, counts: np.ndarray, depths: np.ndarray, *, n_buckets: int,
                     max_depth: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The rows of :func:`normalised_row` from :func:`batch_gram_counts`' keys and counts, one per depth, as
    CSR arrays (data, columns, row pointers): each row's counts L2-normalised (a sum of squares of whole
    numbers, exact: the bits of the per-row norm), then its depth's one-hot."""
    n_rows = len(depths)
    row = keys // n_buckets
    norm = np.sqrt(np.bincount(row, weights=counts * counts, minlength=n_rows))
    values = counts / np.where(norm > 0, norm, 1.0)[row]
    indptr = np.zeros(n_rows + 1, dtype=np.int64)
    np.cumsum(np.bincount(row, minlength=n_rows) + 1, out=indptr[1:])  # its buckets, then its depth
    depth_at = indptr[1:] - 1
    cols, data = np.empty(indptr[-1], dtype=np.int64), np.ones(indptr[-1])
    grams = np.ones(indptr[-1], dtype=bool)
    grams[depth_at] = False
    cols[grams], data[grams] = keys % n_buckets, values
    cols[depth_at] = n_buckets + np.minimum(np.asarray(depths, dtype=np.int64), max_depth)
    return data, cols, indptr


def feature_matrix(tokens: np.ndarray, lengths: np.ndarray, depths: np.ndarray, *, n_buckets: int, ngram: int,
                   max_depth: int) -> sp.csr_matrix:
    """The rows of :func:`hashed_row` for histories given as one array of ``tokens`` cut by ``lengths``,
    hashed all at once (:func:`batch_gram_counts`)."""
    keys, counts = batch_gram_counts(tokens, lengths, n_buckets=n_buckets, ngram=ngram)
    return sp.csr_matrix(rows_from_counts(keys, counts, depths, n_buckets=n_buckets, max_depth=max_depth),
                         shape=(len(depths), n_buckets + max_depth + 1))


def restrict(X: sp.csr_matrix, dense: bool) -> tuple[sp.csr_matrix, np.ndarray]:
    """``X`` on the columns a fit moves, and those columns: every column (``dense``, Adam over every
    bucket) or the ones present in ``X`` (lazy Adam). A row's entries keep their order, so a product with
    the restricted weights sums the same terms in the same order as with all of them."""
    if dense:
        return X, np.arange(X.shape[1])
    active = np.unique(X.indices)
    return sp.csr_matrix((X.data, np.searchsorted(active, X.indices), X.indptr), shape=(X.shape[0], active.size)), active


def probability(X: sp.csr_matrix, theta: np.ndarray, eps: float) -> np.ndarray:
    """sigmoid(X theta[:-1] + theta[-1]), kept in [eps, 1 - eps]."""
    return np.clip(expit(X @ theta[:-1] + theta[-1]), eps, 1 - eps)


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


def scored_fit(X: sp.csr_matrix, theta: np.ndarray, m: np.ndarray, v: np.ndarray, t: int, y: np.ndarray,
               w: np.ndarray, *, eps: float, **adam):
    """:func:`adam_steps` with the predictions before and after: (before, theta, m, v, t, after)."""
    before = probability(X, theta, eps)
    theta, m, v, t = adam_steps(X, theta, m, v, t, y, w, **adam)
    return before, theta, m, v, t, probability(X, theta, eps)


State = Callable[[np.ndarray], tuple]
"""Given the columns a fit moves: (theta = their weights then the bias, m, v, t) to start it from."""


def fit_inline(encoding: dict, state: State, y: np.ndarray, w: np.ndarray, *, dense: bool, **fit) -> tuple:
    """The fit of :meth:`FitProcess.fit`, in this process: (columns, before, theta, m, v, t, after)."""
    X, cols = restrict(feature_matrix(**encoding), dense)
    return (cols, *scored_fit(X, *state(cols), y, w, **fit))


# ---- the child process -------------------------------------------------------------------------------


_BOOT = ("import sys; sys.path = [p for p in sys.path if p not in ('', '.')]; "
         "import runpy; runpy.run_path(sys.argv[1], run_name='__main__')")
"""The child's command (run with ``-I``: no working directory, ``PYTHONPATH`` or user site on ``sys.path``):
this file by path, without the working directory on ``sys.path``."""

_SHARED: "FitProcess | None" = None
_LIVE: "weakref.WeakSet[FitProcess]" = weakref.WeakSet()
"""Every :class:`FitProcess` of this process, for :func:`_after_fork`."""


def _after_fork() -> None:
    for fit_process in list(_LIVE):
        fit_process._forked()


def shared_process() -> "FitProcess":
    """This process's :class:`FitProcess` (one child serves every predictor; fits take turns)."""
    global _SHARED
    if _SHARED is None:
        _SHARED = FitProcess()
        atexit.register(_SHARED.close)  # before the interpreter tears modules down
    return _SHARED


class FitProcess:
    """The ``ngram`` fit in a child process (started at the first fit, one fit at a time).

    The child ends when its input pipe closes: at :meth:`close`, or when this process exits or is killed,
    so it never outlives the trainer.
    """

    def __init__(self):
        self._proc: subprocess.Popen | None = None
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self.failed: str | None = None
        """Why the child is not used (it could not start or died); the fits then run inline."""
        _LIVE.add(self)

    def _forked(self) -> None:
        """In a forked copy of this process: a fresh lock (the parent's may have been held by its fit thread,
        which the copy does not have) and no child (the parent's child answers the parent only)."""
        self._lock = threading.Lock()
        self._proc = None

    def fit(self, encoding: dict, state: State, y: np.ndarray, w: np.ndarray, *, dense: bool, eps: float,
            steps: int, learning_rate: float, l2: float) -> tuple:
        """Fit the model to histories (``encoding``: :func:`feature_matrix`'s arguments) with targets ``y``
        and weights ``w``, from ``state`` (read once the columns are known); returns (columns, predictions
        before, theta, m, v, t, predictions after), as :func:`fit_inline` does."""
        fit = dict(eps=eps, steps=steps, learning_rate=learning_rate, l2=l2)
        with self._lock:
            if self.failed is None:
                try:
                    cols = self._call("encode", encoding, dense)
                    return (cols, *self._call("fit", *state(cols), y, w, **fit))
                except (OSError, EOFError, pickle.UnpicklingError) as error:
                    self._give_up(f"{type(error).__name__}: {error}")
        return fit_inline(encoding, state, y, w, dense=dense, **fit)

    def _call(self, name: str, *args, **kwargs):
        if self._proc is not None and self._pid != os.getpid():  # a forked copy: the child is the parent's
            self._proc = None
        if self._proc is None:
            self._pid = os.getpid()
            env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
            self._proc = subprocess.Popen([sys.executable, "-I", "-c", _BOOT, os.path.abspath(__file__)],
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, close_fds=True)
        pickle.dump((name, args, kwargs), self._proc.stdin, protocol=pickle.HIGHEST_PROTOCOL)
        self._proc.stdin.flush()
        ok, result = pickle.load(self._proc.stdout)
        if not ok:  # the computation itself raised: the same error here, where it can be read
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


class _Child:
    """The child's side: ``encode`` builds the histories' features and keeps them for the ``fit`` that
    follows (the parent holds its lock across the two)."""

    def __init__(self):
        self.X: sp.csr_matrix | None = None

    def encode(self, encoding: dict, dense: bool) -> np.ndarray:
        self.X, cols = restrict(feature_matrix(**encoding), dense)
        return cols

    def fit(self, *args, **kwargs):
        X, self.X = self.X, None
        if X is None:
            raise RuntimeError("`fit` without `encode` before it")
        return scored_fit(X, *args, **kwargs)


def _serve(stdin, stdout) -> None:
    """Answer each pickled (name, args, kwargs) with (True, the result) or (False, the error)."""
    child = _Child()
    calls = {"encode": child.encode, "fit": child.fit}
    while True:
        try:
            name, args, kwargs = pickle.load(stdin)
        except EOFError:
            return
        try:
            answer = (True, calls[name](*args, **kwargs))
        except Exception as error:  # noqa: BLE001 - reported to the parent, which raises it
            answer = (False, f"{type(error).__name__}: {error}")
        pickle.dump(answer, stdout, protocol=pickle.HIGHEST_PROTOCOL)
        stdout.flush()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)

if __name__ == "__main__":
    import signal

    for _signal in (signal.SIGINT, signal.SIGTERM):  # it lives as long as its pipe: the trainer decides
        signal.signal(_signal, signal.SIG_IGN)
    _serve(sys.stdin.buffer, sys.stdout.buffer)
