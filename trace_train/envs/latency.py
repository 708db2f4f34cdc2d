"""Tool latency for benchmarks and tests: any environment, with each ``step`` delayed by a drawn time.

Real tools take time outside the model: a sandboxed Python cell tens to hundreds of milliseconds, a
search query a network round trip. :class:`Latency` describes the delay of one step (constant, or drawn
from an exponential or a heavy-tailed log-normal distribution with the given mean), and
:func:`with_latency` wraps an environment factory so that every ``step`` sleeps that long before the
wrapped environment answers. Sleeping releases the GIL, as waiting on a subprocess or a socket does.
"""

from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np

from .base import Environment, Message, StepResult, is_concurrency_safe

__all__ = ["Latency", "SlowEnv", "with_latency"]

DISTRIBUTIONS = ("constant", "exponential", "lognormal")


@dataclass(frozen=True)
class Latency:
    """Delay of one step: ``mean_s`` seconds, constant or drawn from ``distribution``.

    ``lognormal`` is heavy-tailed: log-delay ~ Normal(mu, ``sigma``^2) with mu = ln(mean) - sigma^2 / 2,
    so its mean is ``mean_s``; with sigma = 1.5 the slowest 1% of steps take over 10 times the mean.
    """

    mean_s: float = 0.0
    distribution: str = "constant"
    sigma: float = 1.5
    """Log-normal shape (ignored by the other distributions)."""

    def __post_init__(self):
        if not 0.0 <= self.mean_s < math.inf:
            raise ValueError(f"`mean_s` must be a finite number >= 0, got {self.mean_s!r}")
        if self.distribution not in DISTRIBUTIONS:
            raise ValueError(f"`distribution` must be one of {DISTRIBUTIONS}, got {self.distribution!r}")
        if not self.sigma > 0:
            raise ValueError(f"`sigma` must be positive, got {self.sigma!r}")

    def draw(self, rng: np.random.Generator) -> float:
        if self.mean_s == 0 or self.distribution == "constant":
            return self.mean_s
        if self.distribution == "exponential":
            return float(rng.exponential(self.mean_s))
        return float(rng.lognormal(math.log(self.mean_s) - self.sigma ** 2 / 2, self.sigma))


class SlowEnv:
    """An environment whose ``step`` sleeps ``latency.draw(rng)`` seconds, then asks ``inner``."""

    def __init__(self, inner: Environment, latency: Latency, rng: np.random.Generator):
        self.inner, self.latency, self.rng = inner, latency, rng

    def reset(self, row: Mapping[str, Any]) -> list[Message]:
        return self.inner.reset(row)

    def step(self, action: str) -> StepResult:
        time.sleep(self.latency.draw(self.rng))
        return self.inner.step(action)

    def verify(self) -> float:
        return self.inner.verify()

    def snapshot(self) -> Any:
        return self.inner.snapshot()

    def restore(self, snapshot: Any) -> None:
        self.inner.restore(snapshot)


def with_latency(make_env: Callable[[], Environment], latency: Latency, *, seed: int | None = None):
    """A factory of :class:`SlowEnv` around ``make_env``'s environments, as concurrency-safe as they are.

    Each environment draws from its own generator: spawned from ``seed`` in creation order, or from fresh
    OS entropy when ``seed`` is None (then the order in which steps finish differs from run to run).
    """
    root = np.random.SeedSequence(seed)
    lock = threading.Lock()

    def make() -> SlowEnv:
        with lock:
            child = root.spawn(1)[0]
        return SlowEnv(make_env(), latency, np.random.default_rng(child))

    make.concurrency_safe = is_concurrency_safe(make_env)
    return make
