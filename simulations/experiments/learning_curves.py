"""Experiment 5: learning curves in the tree MDP, at equal rollouts and at equal turns.

Every arm trains a tabular softmax policy from uniform on the same tasks (per seed), spending M (1 + N)
rollouts per step, for ``steps`` steps. After each step we record the policy's exact success
probability J (mean over tasks of V(root), computed by enumeration) against the rollouts and turns spent
so far: the equal-rollout and the equal-token views. Flat arms use the ``default_estimator`` (on a
flat forest every estimator of ``trace_theory.ADVANTAGES`` that normalises like GRPO reduces to it);
``estimator_arm`` is also run with every estimator in ``estimators``.

Labels: ``arm`` for the default estimator, ``arm+estimator`` otherwise (``trace+local``).

**Best against best.** The run above uses one shared learning rate ``lr`` and the ``leaves``
normalisation (the step divided by all rollouts; see :mod:`simulations.mdp`). Each of ``swept_arms``
is also run over the grid ``lrs`` under every normalisation in ``normalisations``, on ``tuning_seeds``
seeds of their own (seed indices ``seeds`` .. ``seeds + tuning_seeds - 1``: other tasks); its best
rate there (per view: final J at equal rollouts, J at equal turns) is then run on the ``seeds`` report
seeds, and TRACE is compared with each other policy paired by seed (:mod:`.tuning`). The claim is held
only if TRACE beats GRPO best-against-best, under every normalisation, in both views.

Tidy-table columns beyond the shared ones: ``step``, ``estimator``, ``lr``, ``normalisation`` and
``stage`` (``report`` for the report seeds, ``tuning`` for the tuning seeds). Runs other than the
shared-rate ``leaves`` ones record every ``record_every``-th step.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from trace_theory import ADVANTAGES, budget_by_depth, effective_ratio, get_policy

from ..mdp import NORMALISATIONS, MDPWorld, TreeMDP, policy_gradient_step
from ..model import PassRates
from ..predictors import make_predictor
from ..runner import Arm, sample_batch
from .base import Experiment, Outcome, Units, mean_and_stderr, register, tidy_metrics, unit_rng
from . import tuning
from .common import BatchShape, PAPER_GRPO_RATIO, check_arms, yield_metrics

NAME = "learning_curves"
CLAIM = (
    "In an enumerable tree MDP, a policy trained on TRACE's trees reaches a higher true success probability "
    "than one trained on GRPO's groups, both at equal rollouts and at equal turns, with each policy at its "
    "own best learning rate, under every common loss normalisation."
)
ARMS = (
    "grpo",
    "dapo",
    "pcl",
    "root_only",
    "random_prefix",
    "prefix_only",
    "trace",
    "trace_beta",
    "trace[oracle]",
)


SWEPT_ARMS = ("grpo", "dapo", "pcl", "root_only", "random_prefix", "trace")
VIEWS = ("equal_rollouts", "equal_turns")
CURVE_METRICS = ("success", "rollouts", "turns", "prefix_turns")
BATCH_METRICS = (
    "mixed_prompts_per_1k_rollouts",
    "mixed_prompts_per_1k_turns",
    "contrast_pairs_per_1k_rollouts",
    "contrast_pairs_per_1k_turns",
    "effective_ratio",
)


@dataclass(frozen=True)
class Config(BatchShape):
    seed: int = 0
    seeds: int = 16
    """Report seeds (tasks drawn per seed; every arm trains on the same tasks within a seed)."""
    steps: int = 60
    lr: float = 20.0
    """The shared policy-gradient step size (every arm and estimator; the default comparison)."""
    roots: int = 32
    continuations: int = 2
    group_size: int = 8
    arms: tuple[str, ...] = ARMS
    default_estimator: str = "trace"
    estimator_arm: str = "trace"
    estimators: tuple[str, ...] = ("grpo", "local", "treerl", "treepo", "trace")
    predictor_decay: float = 0.8
    """Discount of the learned predictor's past statistics per step (the policy it predicts changes)."""
    swept_arms: tuple[str, ...] = SWEPT_ARMS
    """Arms whose learning rate is tuned (with the default estimator); TRACE and GRPO must be among them."""
    lrs: tuple[float, ...] = (5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0)
    """Learning-rate grid of the sweep (``lr`` must be on it)."""
    normalisations: tuple[str, ...] = NORMALISATIONS
    """Loss normalisations compared (``simulations.mdp.NORMALISATIONS``); ``leaves`` is the default."""
    tuning_seeds: int = 4
    """Seeds on which each arm's best rate is chosen (never reported as results)."""
    record_every: int = 5
    """Steps between recorded points of the sweep's runs (the shared-rate ``leaves`` runs record all)."""
    mdp: TreeMDP = field(
        default_factory=lambda: TreeMDP(pass_rates=PassRates().calibrated(PAPER_GRPO_RATIO, 8))
    )

    def __post_init__(self):
        for name in ("seeds", "steps", "roots", "group_size", "tuning_seeds", "record_every"):
            value = getattr(self, name)
            if not (isinstance(value, int) and value >= 1):
                raise ValueError(f"`{name}` must be a positive integer, got {value!r}")
        if not (isinstance(self.continuations, int) and self.continuations >= 0):
            raise ValueError(f"`continuations` must be a non-negative integer, got {self.continuations!r}")
        if not (np.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"`lr` must be finite and positive, got {self.lr!r}")
        if not (self.lrs and all(np.isfinite(x) and x > 0 for x in self.lrs) and self.lr in self.lrs):
            raise ValueError(f"`lrs` must be positive and include `lr` = {self.lr}, got {self.lrs!r}")
        if not 0.0 < self.predictor_decay <= 1.0:
            raise ValueError(f"`predictor_decay` must lie in (0, 1], got {self.predictor_decay!r}")
        check_arms(self.arms)
        check_arms(self.swept_arms)
        if not {"trace", "grpo"} <= set(self.swept_arms):
            raise ValueError(f"`swept_arms` must include 'trace' and 'grpo', got {self.swept_arms!r}")
        unknown = [n for n in self.normalisations if n not in NORMALISATIONS]
        if unknown or "leaves" not in self.normalisations:
            raise ValueError(
                f"`normalisations` must include 'leaves' and name only {', '.join(NORMALISATIONS)}, "
                f"got {self.normalisations!r}"
            )
        Arm.parse(self.estimator_arm)
        for name in (self.default_estimator, *self.estimators):
            ADVANTAGES.check(name)
        need = -(-self.budget.total // self.group_size)
        if need > self.mdp.n_tasks:
            raise ValueError(
                f"flat arms draw up to {need} tasks per step; raise `mdp.n_tasks` (got {self.mdp.n_tasks})"
            )

    @property
    def runs(self) -> list[tuple[str, str]]:
        """(arm, estimator) pairs: every arm with the default estimator, then the estimator study."""
        pairs = [(a, self.default_estimator) for a in self.arms]
        pairs += [(self.estimator_arm, e) for e in self.estimators if (self.estimator_arm, e) not in pairs]
        return pairs

    @property
    def tuning_seed_range(self) -> range:
        return range(self.seeds, self.seeds + self.tuning_seeds)

    def label(self, arm: str, estimator: str) -> str:
        text = Arm.parse(arm).label
        return text if estimator == self.default_estimator else f"{text}+{estimator}"

    @classmethod
    def quick(cls) -> Config:
        return cls(
            seeds=2,
            steps=6,
            roots=16,
            estimators=("grpo", "trace"),
            swept_arms=("grpo", "pcl", "trace"),
            lrs=(10.0, 20.0, 40.0),
            tuning_seeds=2,
            record_every=2,
            mdp=TreeMDP(n_tasks=16, horizon=3, pass_rates=PassRates().calibrated(PAPER_GRPO_RATIO, 8)),
        )


def train_curve(
    tasks,
    arm: Arm,
    estimator: str,
    *,
    budget,
    steps: int,
    lr: float,
    normalisation: str,
    rng: np.random.Generator,
    group_size: int = 8,
    predictor_decay: float = 0.8,
    record_every: int = 1,
) -> list[dict]:
    """Train from the uniform policy for ``steps`` steps of ``budget`` rollouts; one row per recorded step.

    A row holds the exact success ``success`` after the step, the ``rollouts``, ``turns`` and
    ``prefix_turns`` (turns of the prefixes that continuations started from: what a continuation would
    cost again without a prefix cache) spent so far, and the step's batch metrics (``BATCH_METRICS``).
    """
    policy = arm.allocation_policy(group_size=group_size)
    options = {"decay": predictor_decay} if arm.predictor == "learned" else {}
    predictor = make_predictor(arm.predictor, **options)
    theta = tasks.initial_logits()
    spent = {"rollouts": 0.0, "turns": 0.0, "prefix_turns": 0.0}
    rows = [{"step": 0, **spent, "success": float(tasks.success(theta).mean())}]
    for step in range(1, steps + 1):
        world = MDPWorld(tasks, theta)
        batch = sample_batch(world, policy, budget, predictor, pool=tasks.mdp.n_tasks, rng=rng)
        predictor = predictor.update(batch.sampled)
        theta = policy_gradient_step(
            world, batch.trained, estimator=estimator, lr=lr, normalisation=normalisation
        )
        forest = batch.sampled.forest
        by_depth = budget_by_depth(forest)
        spent["rollouts"] += batch.rollouts
        spent["turns"] += batch.turns
        spent["prefix_turns"] += float(np.dot(np.arange(by_depth.size), by_depth))
        if step % record_every and step != steps:
            continue
        rows.append(
            {
                "step": step,
                **spent,
                "success": float(tasks.success(theta).mean()),
                **yield_metrics(forest, rollouts=batch.rollouts, turns=batch.turns),
                "effective_ratio": effective_ratio(forest),
            }
        )
    return rows


def run(config: Config, units: Units) -> Outcome:
    def unit(key) -> pd.DataFrame:
        arm_text, estimator, normalisation, lr, s = key
        arm = Arm.parse(arm_text)
        default = normalisation == "leaves" and lr == config.lr
        rows = train_curve(
            config.mdp.build(unit_rng(config.seed, NAME, "tasks", s)),  # the same tasks for every arm
            arm,
            estimator,
            budget=config.budget,
            steps=config.steps,
            lr=lr,
            normalisation=normalisation,
            rng=unit_rng(config.seed, NAME, arm.label, estimator, s),  # the same stream at every rate
            group_size=config.group_size,
            predictor_decay=config.predictor_decay,
            record_every=1 if default else config.record_every,
        )
        return tidy_metrics(
            NAME,
            rows,
            CURVE_METRICS + BATCH_METRICS,
            arm=config.label(arm_text, estimator),
            policy=arm.policy,
            predictor=arm.predictor,
            estimator=estimator,
            normalisation=normalisation,
            lr=lr,
            stage="report" if s < config.seeds else "tuning",
            seed=s,
            budget=config.budget.total,
            index="step",
        )

    shared = [(a, e, "leaves", config.lr, s) for a, e in config.runs for s in range(config.seeds)]
    table = units.map(unit, shared, desc=NAME)
    default = table.copy()
    headline, details = _headline(default, config)

    e = config.default_estimator
    tune_keys = list(
        dict.fromkeys(
            (a, e, _run_as(a, n), lr, s)
            for n in config.normalisations
            for a in config.swept_arms
            for lr in config.lrs
            for s in config.tuning_seed_range
        )
    )
    tuned = units.map(unit, tune_keys, desc=NAME + "-tuning")
    scores = final_scores(_as_every_normalisation(tuned, config), details["equal_turns"])
    rates = {n: tuning.best_rates(scores[scores["normalisation"] == n], config.tuning_seed_range)
             for n in config.normalisations}
    done = set(shared)
    report_keys = list(
        dict.fromkeys(
            (a, e, _run_as(a, n), lr, s)
            for n in config.normalisations
            for a in config.swept_arms
            for lr in sorted({config.lr, *(rates[n][v][Arm.parse(a).label] for v in VIEWS)})
            for s in range(config.seeds)
            if (a, e, _run_as(a, n), lr, s) not in done
        )
    )
    reported = units.map(unit, report_keys, desc=NAME + "-report")
    table = _as_every_normalisation(pd.concat([table, tuned, reported], ignore_index=True), config)
    details["tuned"] = _tuned(table, config, rates, details["equal_turns"])
    result, held = _verdict(headline, details)
    return Outcome(table, headline, result, held, details)


def _run_as(arm: str, normalisation: str) -> str:
    """The normalisation a run is made with: on a flat forest every episode has H turns, so dividing by
    turns / H is dividing by leaves, and a flat arm's ``tokens`` run is its ``leaves`` run."""
    if normalisation == "tokens" and not get_policy(Arm.parse(arm).policy).branches:
        return "leaves"
    return normalisation


def _as_every_normalisation(table: pd.DataFrame, config: Config) -> pd.DataFrame:
    """``table`` plus, for flat arms, a copy of their ``leaves`` rows labelled ``tokens`` (see ``_run_as``)."""
    if "tokens" not in config.normalisations:
        return table
    flat = [Arm.parse(a).label for a in config.swept_arms if _run_as(a, "tokens") == "leaves"]
    rows = table[table["arm"].isin(flat) & (table["normalisation"] == "leaves")]
    have = table[table["normalisation"] == "tokens"]
    copy = rows.assign(normalisation="tokens")
    copy = copy[~copy.set_index(["arm", "lr", "seed"]).index.isin(have.set_index(["arm", "lr", "seed"]).index)]
    return pd.concat([table, copy], ignore_index=True)


def final_scores(table: pd.DataFrame, equal_turns: float, keys=("normalisation",)) -> pd.DataFrame:
    """One row per run and view: final J (equal rollouts) and J interpolated at ``equal_turns``.

    Columns ``arm, lr, seed, view, value`` and ``keys`` (the columns other than those that tell runs
    apart).
    """
    curves = table[table["metric"].isin(["success", "turns"])]
    wide = curves.pivot_table(index=["arm", *keys, "lr", "seed", "step"], columns="metric", values="value")
    rows = []
    for index, g in wide.groupby(level=["arm", *keys, "lr", "seed"], sort=False):
        base = dict(zip(["arm", *keys, "lr", "seed"], index))
        rows.append({**base, "view": "equal_rollouts", "value": float(g["success"].iloc[-1])})
        value = float(np.interp(equal_turns, g["turns"], g["success"]))
        rows.append({**base, "view": "equal_turns", "value": value})
    return pd.DataFrame(rows)


def _tuned(table: pd.DataFrame, config: Config, rates: dict, equal_turns: float) -> dict:
    """Per normalisation: the best rates, and the comparison at the best rates and at the shared rate."""
    swept = [Arm.parse(a).label for a in config.swept_arms]
    runs = table[(table["estimator"] == config.default_estimator) & table["arm"].isin(swept)]
    scores = final_scores(runs, equal_turns)
    report = range(config.seeds)
    out = {
        "lrs": list(config.lrs),
        "shared_lr": config.lr,
        "tuning_seeds": config.tuning_seeds,
        "report_seeds": config.seeds,
    }
    for n in config.normalisations:
        here = scores[scores["normalisation"] == n]
        grid = here[here["seed"].isin(list(config.tuning_seed_range))]
        out[n] = {
            "tuning_mean": {
                arm: {f"{lr:g}": round(float(v), 4) for lr, v in g.groupby("lr")["value"].mean().items()}
                for arm, g in grid[grid["view"] == "equal_rollouts"].groupby("arm")
            },
            "on_grid_edge": sorted({a for v in VIEWS for a in tuning.on_grid_edge(rates[n][v], config.lrs)}),
        }
        for view in VIEWS:
            shared = {arm: config.lr for arm in swept}
            out[n][view] = {
                "best": tuning.comparison(here, rates[n][view], view, report, "trace"),
                "shared": tuning.comparison(here, shared, view, report, "trace"),
            }
    return out


def _success_at_turns(curves: pd.DataFrame, budget_turns: float) -> pd.Series:
    """Per (arm, seed): success interpolated at ``budget_turns`` turns spent (the equal-token view)."""
    wide = curves.pivot_table(index=["arm", "seed", "step"], columns="metric", values="value")
    return wide.groupby(level=["arm", "seed"]).apply(
        lambda g: float(np.interp(budget_turns, g["turns"], g["success"]))
    )


def _headline(table: pd.DataFrame, config: Config) -> tuple[dict, dict]:
    final = table[(table["step"] == config.steps)]
    by = final.pivot_table(index=["arm", "seed"], columns="metric", values="value")
    equal_turns = float(by["turns"].groupby(level="arm").mean().min())
    at_turns = _success_at_turns(table, equal_turns)
    initial = float(table[(table["step"] == 0) & (table["metric"] == "success")]["value"].mean())
    headline = {}
    for arm in dict.fromkeys(table["arm"]):
        mean, se = mean_and_stderr(by.loc[arm, "success"])
        at, at_se = mean_and_stderr(at_turns.loc[arm])
        headline[arm] = {
            "final_success": round(mean, 4),
            "final_success_stderr": round(se, 4),
            "success_at_equal_turns": round(at, 4),
            "success_at_equal_turns_stderr": round(at_se, 4),
            "turns": round(float(by.loc[arm, "turns"].mean()), 1),
        }
    details = {
        "initial_success": round(initial, 4),
        "equal_turns": round(equal_turns, 1),
        "paired": _paired(by["success"], at_turns),
    }
    return headline, details


def _paired(final: pd.Series, at_turns: pd.Series) -> dict:
    """TRACE minus GRPO, paired by seed (same tasks), at equal rollouts and at equal turns."""
    if not {"trace", "grpo"} <= set(final.index.get_level_values("arm")):
        return {}
    out = {}
    for view, series in (("equal_rollouts", final), ("equal_turns", at_turns)):
        diff = series.loc["trace"] - series.loc["grpo"]
        mean, se = mean_and_stderr(diff.to_numpy())
        out[view] = {"trace_minus_grpo": round(mean, 4), "stderr": round(se, 4)}
    return out


def _verdict(headline: dict, details: dict) -> tuple[str, bool]:
    """Held only if TRACE beats GRPO best-against-best under every normalisation, in both views."""
    text = f"From J = {details['initial_success']:.3f} (uniform policy)"
    paired = details["paired"]
    if paired:
        eq_r, eq_t = paired["equal_rollouts"], paired["equal_turns"]
        text += (
            f"; at the shared learning rate (normalised by all leaves) TRACE {headline['trace']['final_success']:.3f}"
            f" vs GRPO {headline['grpo']['final_success']:.3f}: {eq_r['trace_minus_grpo']:+.3f} ± "
            f"{eq_r['stderr']:.3f} at equal rollouts, {eq_t['trace_minus_grpo']:+.3f} ± {eq_t['stderr']:.3f} "
            f"at equal turns ({details['equal_turns']:.0f})"
        )
    tuned = details.get("tuned", {})
    held, parts = True, []
    for n in (k for k in tuned if isinstance(tuned[k], dict) and "equal_rollouts" in tuned[k]):
        gaps = []
        for view in VIEWS:
            best = tuned[n][view]["best"]
            gap = best["gap"].get("grpo")
            held &= tuning.beats(gap)
            lr = {a: best["score"][a]["lr"] for a in ("trace", "grpo")}
            gaps.append(
                f"{view.replace('_', ' ')} {gap['mean']:+.3f} ± {gap['stderr']:.3f} "
                f"(TRACE lr {lr['trace']:g}, GRPO lr {lr['grpo']:g})"
            )
        top = max(tuned[n]["equal_rollouts"]["best"]["score"].items(), key=lambda kv: kv[1]["mean"])
        parts.append(
            f"normalised by {n.replace('_', ' ')}: TRACE minus GRPO {'; '.join(gaps)}; best arm {top[0]} "
            f"{top[1]['mean']:.3f}"
        )
    if parts:
        text += ". Best against best (each arm at its own rate, chosen on separate seeds): " + ". ".join(parts)
    else:
        held = False
    return text + ".", bool(held)


EXPERIMENT = register(Experiment(NAME, CLAIM, Config, run))
