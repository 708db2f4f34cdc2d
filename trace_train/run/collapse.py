"""A warning when a run moves the way a collapsing policy does: its turns grow long, or its held-out
success falls.

Two signals, both read from the step's metrics (``metrics.jsonl``'s names):

- **tokens per rollout**, ``generated_tokens / rollouts``. Its baseline is the median over the run's first
  ``baseline_steps`` steps; the watch warns when a step's value exceeds ``token_factor`` times the
  baseline (and the baseline by at least ``min_extra_tokens``). A policy drifting into degenerate text
  stops ending its turns: tokens per rollout climb towards the turn limit long before the reward shows it.
- **held-out success**, ``eval_success``, the mean of n = ``eval_rollouts`` 0/1 rewards. The watch warns
  when it is below the run's first evaluation (step 0, before any update) and below the best evaluation so
  far by more than ``z`` standard errors of a difference of two such means, ``z * sqrt(2 p (1 - p) / n)``
  with p their mean: a fall that noise alone makes unlikely.

Each signal warns once per run (a resumed run rebuilds the watch from its ``metrics.jsonl`` rows, so it
does not repeat a warning already given nor forget its baseline). A warning is advice, never a stop.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Iterable, Mapping

__all__ = ["CollapseWatch"]

ADVICE = "raise algorithm.loss.kl_coef (e.g. 0.05), lower optim.lr, or cap rollout.limits.max_turn_tokens"


@dataclass
class CollapseWatch:
    """Feed it each step's metrics with :meth:`check`; it returns the warnings to print (usually none)."""

    eval_rollouts: int
    """Rollouts behind one ``eval_success`` (held-out prompts x samples)."""
    baseline_steps: int = 3
    token_factor: float = 3.0
    min_extra_tokens: float = 8.0
    z: float = 2.0
    _tokens: list[float] = field(default_factory=list)
    _evals: list[tuple[int, float]] = field(default_factory=list)
    _warned: set[str] = field(default_factory=set)

    def replay(self, rows: Iterable[Mapping]) -> "CollapseWatch":
        """Rebuild the state from a resumed run's logged rows (warnings they would raise are not repeated)."""
        for row in rows:
            self.check(int(row["step"]), row)
        return self

    def check(self, step: int, metrics: Mapping) -> list[str]:
        out = []
        rollouts = _number(metrics.get("rollouts"))
        tokens = _number(metrics.get("generated_tokens"))
        if rollouts and tokens is not None:
            out += self._check_tokens(step, tokens / rollouts)
        success = _number(metrics.get("eval_success"))
        if success is not None:
            out += self._check_eval(step, success)
        return out

    def _check_tokens(self, step: int, per_rollout: float) -> list[str]:
        if len(self._tokens) < self.baseline_steps:
            self._tokens.append(per_rollout)
            return []
        base = statistics.median(self._tokens)
        if ("tokens" in self._warned or per_rollout <= self.token_factor * base
                or per_rollout - base < self.min_extra_tokens):
            return []
        self._warned.add("tokens")
        return [f"step {step}: {per_rollout:.1f} generated tokens per rollout, {per_rollout / base:.1f}x the first "
                f"steps' {base:.1f}: turns that grow this way usually mean the policy is collapsing into "
                f"degenerate text; {ADVICE}"]

    def _check_eval(self, step: int, success: float) -> list[str]:
        self._evals.append((step, success))
        start = self._evals[0][1]
        best_step, best = max(self._evals[:-1], key=lambda e: e[1], default=(step, success))
        p = (best + success) / 2
        se = math.sqrt(2 * p * (1 - p) / max(self.eval_rollouts, 1))
        if "eval" in self._warned or success >= start or best - success <= self.z * max(se, 1e-12):
            return []
        self._warned.add("eval")
        return [f"step {step}: held-out success {success:.3f} fell below its start ({start:.3f}) and its best "
                f"({best:.3f} at step {best_step}) by more than {self.z:g} standard errors ({self.z * se:.3f}): the "
                f"policy may be collapsing; {ADVICE}"]


def _number(value) -> float | None:
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None
