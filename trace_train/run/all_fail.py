"""The all-fail regime: a run whose groups almost never hold a success, so that a group-relative update has
nothing to learn from and held-out success stays flat. The opposite failure of a collapse (``collapse.py``).

Two signals, read from the step's metrics (``metrics.jsonl``'s names):

- **the share of all-fail groups**, ``all_fail_group_share``: the prompts of a step whose every rollout
  failed (no leaf reward above 0), over the prompts that got rollouts. Its mean over the last ``window``
  steps is the regime's first sign: at or above ``min_share`` most of the budget buys zero advantages.
- **held-out success that stays flat**: after ``flat_evals`` or more evaluations past the first (step 0),
  the best so far is not above the start by more than ``z`` standard errors of a difference of two means
  of n = ``eval_rollouts`` 0/1 rewards, ``z * sqrt(2 p (1 - p) / n)`` with p their mean (at least 1 / n).

Each step's row gets ``held_out_flat_evals`` (evaluations since the start without that rise) and
``all_fail_regime`` (1 while both signals hold). The watch warns once per run, naming what to try
(``docs/training.md``, "My run does not learn"). A resumed run rebuilds it from its rows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Mapping

__all__ = ["AllFailWatch", "all_fail_share", "ADVICE", "advice"]

_LATER = "an easier mix of rows, more roots (rollout.roots), a larger model (model.name_or_path)"
ADVICE = ("what to try, in order (docs/training.md, \"My run does not learn\"): warm-start demonstrations "
          "(a task_spec demonstration for model.name_or_path=tiny) and a warm-up long enough that the starting "
          f"model's groups mix (model.tiny_warm_steps, default 40), {_LATER}")


def advice(*, tiny: bool, demonstrated: bool, warm_steps: int) -> str:
    """What to try, fitted to the run: a tiny model warmed on the task's expert is told to lengthen the
    warm-up it had (not to add demonstrations it has); one without an expert, to add one; a real model
    starts from the easier mix of rows (the warm start applies to the tiny model only)."""
    head = "what to try, in order (docs/training.md, \"My run does not learn\"): "
    if not tiny:
        return head + _LATER
    if demonstrated:
        return (head + f"a longer warm-up on the task's demonstrations (model.tiny_warm_steps, now {warm_steps}; "
                f"check the start with trace-eval on the run's tiny_model until most groups mix), {_LATER}")
    return ADVICE


def all_fail_share(forest) -> float:
    """Share of a forest's prompts whose every leaf failed: ``mean over roots of [max leaf reward <= 0]``
    (NaN without prompts)."""
    import numpy as np

    if forest.n_prompts == 0:
        return float("nan")
    best = forest.subtree_extreme(np.where(forest.is_leaf, forest.reward, -np.inf), largest=True)
    return float((best[forest.roots] <= 0).mean())


@dataclass
class AllFailWatch:
    """Feed it each logged row with :meth:`check`; it returns the fields to add to the row and the warnings
    to print (usually none)."""

    eval_rollouts: int
    """Rollouts behind one ``eval_success`` (held-out prompts x samples)."""
    window: int = 5
    min_share: float = 0.5
    flat_evals: int = 3
    z: float = 2.0
    advice: str = ADVICE
    """What the warning says to try (:func:`advice` fits it to the run)."""
    _shares: list[float] = field(default_factory=list)
    _evals: list[float] = field(default_factory=list)
    _warned: bool = False

    def replay(self, rows: Iterable[Mapping]) -> "AllFailWatch":
        """Rebuild the state from a resumed run's logged rows (a warning they raised is not repeated)."""
        for row in rows:
            self.check(int(row["step"]), row)
        return self

    def check(self, step: int, metrics: Mapping) -> tuple[dict, list[str]]:
        share = _number(metrics.get("all_fail_group_share"))
        if share is not None:
            self._shares = (self._shares + [share])[-self.window:]
        success = _number(metrics.get("eval_success"))
        if success is not None:
            self._evals.append(success)
        flat = self._flat_evals()
        recent = sum(self._shares) / len(self._shares) if self._shares else None
        regime = flat >= self.flat_evals and recent is not None and recent >= self.min_share
        fields = {"held_out_flat_evals": float(flat), "all_fail_regime": float(regime)} if self._evals else {}
        if not regime or self._warned:
            return fields, []
        self._warned = True
        start, best = self._evals[0], max(self._evals)
        return fields, [f"step {step}: all-fail regime: {recent:.0%} of the groups of the last {len(self._shares)} "
                        f"steps had no success (nothing for a group-relative update to learn from), and held-out "
                        f"success has stayed within {self.z:g} standard errors of its start ({start:.3f}; best "
                        f"{best:.3f}) for {flat} evaluations; {self.advice}"]

    def _flat_evals(self) -> int:
        """Evaluations after the first whose best-so-far is not significantly above the first."""
        if len(self._evals) < 2:
            return 0
        start, n = self._evals[0], max(self.eval_rollouts, 1)
        flat = 0
        best = start
        for success in self._evals[1:]:
            best = max(best, success)
            p = (start + best) / 2
            se = max(math.sqrt(2 * p * (1 - p) / n), 1 / n)
            if best - start > self.z * se:
                return 0  # it rose: not flat (from then on)
            flat += 1
        return flat


def _number(value) -> float | None:
    try:
        x = float(value)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None
