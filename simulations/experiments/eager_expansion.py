"""Experiment 11: branching that never waits (eager expansion) against lazy TRACE, root-only and GRPO.

Lazy TRACE places a prefix's continuations once the factual outcome r is known, so a step is two
episodes deep: with the barrier, after every bare rollout; streamed, after its own tree's. Eager TRACE
(``trace_theory.eager``, ``run_step(eager=EagerPlan(reserve))``) commits 1 - reserve of each tree's
continuation budget at turn boundaries by the expected utility E_r[1 - q^k] = 1 - w v^k - (1 - w)(1 - v)^k
(w = v as the prefix forms, ``eager_now_*``; w the next prediction, or r at the rollout's end, one turn
later, ``eager_*``), with a threshold carried from the previous batch (its ``eager_level``), and spends
the reserve by the outcome-aware rule once the tree has ended.

**Table.** Per (predictor, episode-length spread, arm), online batches as in the other batch experiments
(the learned predictor fitted as it goes, the first ``warmup`` batches left out): contrast pairs and
mixed prompts per 1,000 turns (the simulator's token), the critical path (turns on the longest chain of
the step, :func:`simulations.runner.critical_path`), the share of the continuation budget committed at
boundaries, and the regret: on the batch's own rollouts and predictions, the prefix utility sum
flip(V, r, k) (true V) of the barrier's allocation minus the arm's, per 1,000 turns and as a share of the
barrier's (``regret_share``). The value of waiting,
per predictor, is lazy TRACE's contrast pairs per 1,000 turns minus eager TRACE's at reserve 0, relative.
``eager_joint_*`` arms use the rollout-joint gain (prefixes of one rollout share its outcome); the gap to
``eager_*`` is what ignoring that correlation costs.

**Learning.** In the exact tree MDP (:mod:`simulations.mdp`), each arm at its best learning rate (chosen on
tuning seeds that are not reported, per view) trains for ``steps`` steps; success J is compared at equal
turns and at an equal critical path (cumulative turns on the longest chain: the wall clock).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from trace_theory import EagerPlan, RolloutBudget, flip_probability, get_policy
from trace_theory.expansion import hindsight_continuations

from ..mdp import MDPWorld, TreeMDP, policy_gradient_step
from ..model import BernoulliTreeModel, PassRates
from ..predictors import make_predictor
from ..runner import Arm, critical_path, sample_batch, sample_pipelined
from . import tuning
from .base import Experiment, Outcome, Units, mean_and_stderr, register, summarise, tidy_metrics, unit_rng
from .common import BatchShape, PAPER_GRPO_RATIO, calibrated, yield_metrics

NAME = "eager_expansion"
CLAIM = (
    "Eager TRACE, committing continuations at turn boundaries by the expected utility before the outcome is "
    "known, keeps at least 90% of lazy TRACE's contrast pairs per 1,000 tokens with the learned predictor, "
    "with a critical path within one turn of GRPO's."
)
METRICS = ("contrast_pairs_per_1k_turns", "mixed_prompts_per_1k_turns", "critical_path", "eager_share",
           "regret_per_1k_turns", "regret_share", "turns", "rollouts")
SPREADS = {"fixed": 0.0, "mid": 0.2, "wide": 0.4}
"""Episode-length spread: the model's ``stop_prob`` (0: every episode runs ``max_turns``)."""
PREDICTOR_OPTIONS = {"noisy": {"noise": 1.0}}


def parse_arm(label: str, policy: str) -> tuple[str, str, EagerPlan | None]:
    """(policy, expansion, plan) of an arm label: ``grpo``, ``root_only``, ``trace_barrier``,
    ``trace_streamed``, ``pipelined`` (one-step-off continuations, ``trace_theory.pipelined``),
    ``eager_<reserve>``, ``eager_now_<reserve>`` or ``eager_joint_<reserve>``."""
    if label in ("grpo", "root_only"):
        return label, "barrier", None
    if label in ("trace_barrier", "trace_streamed"):
        return policy, label.split("_")[1], None
    if label == "pipelined":
        return policy, "pipelined", None
    for prefix, objective, lag in (("eager_joint_", "joint", 1), ("eager_now_", "additive", 0),
                                   ("eager_", "additive", 1)):
        if label.startswith(prefix):
            try:
                reserve = float(label[len(prefix):])
            except ValueError:
                break
            return policy, "eager", EagerPlan(reserve=reserve, objective=objective, lag=lag)
    raise ValueError(f"unknown arm {label!r}: grpo, root_only, trace_barrier, trace_streamed, pipelined, eager_R, "
                     "eager_now_R or eager_joint_R (R the reserve share)")


@dataclass(frozen=True)
class Config(BatchShape):
    seed: int = 0
    seeds: int = 3
    """Independent repetitions per cell of the table."""
    batches: int = 6
    warmup: int = 2
    roots: int = 96
    continuations: int = 4
    group_size: int = 8
    pool_factor: float = 2.0
    target_ratio: float = PAPER_GRPO_RATIO
    policy: str = "trace_tokens"
    """The TRACE policy of the lazy and eager arms (priced in tokens)."""
    arms: tuple[str, ...] = ("grpo", "root_only", "trace_barrier", "trace_streamed", "pipelined", "eager_0.0",
                             "eager_0.25", "eager_0.5", "eager_now_0.0", "eager_joint_0.0")
    """``eager_R``: reserve share R, decided one turn after the prefix forms (``EagerPlan.lag`` 1);
    ``eager_now_R``: as it forms (lag 0); ``eager_joint_R``: the rollout-joint gain."""
    predictors: tuple[str, ...] = ("oracle", "learned", "running_mean", "noisy")
    spreads: tuple[str, ...] = ("fixed", "mid", "wide")
    model: BernoulliTreeModel = field(default_factory=BernoulliTreeModel)
    # learning in the tree MDP
    learning_arms: tuple[str, ...] = ("grpo", "root_only", "trace_barrier", "pipelined", "eager_0.0", "eager_0.25")
    steps: int = 30
    learning_roots: int = 16
    learning_continuations: int = 2
    lrs: tuple[float, ...] = (20.0, 40.0, 80.0, 160.0, 320.0)
    report_seeds: int = 4
    tuning_seeds: int = 2
    mdp: TreeMDP = field(default_factory=lambda: TreeMDP(
        n_tasks=32, horizon=3, pass_rates=PassRates().calibrated(PAPER_GRPO_RATIO, 8)))

    def __post_init__(self):
        self.check_batches("seeds", "batches", "roots", "continuations", "group_size", "steps", "learning_roots",
                           "report_seeds", "tuning_seeds")
        self.check_pool_factor()
        for arm in self.arms + self.learning_arms:
            parse_arm(arm, self.policy)
        if "trace_barrier" not in self.arms or "eager_0.0" not in self.arms or "grpo" not in self.arms:
            raise ValueError("`arms` must include 'grpo', 'trace_barrier' and 'eager_0.0' (the headline)")
        for name in self.predictors:
            make_predictor(name)
        unknown = [s for s in self.spreads if s not in SPREADS]
        if unknown:
            raise ValueError(f"`spreads` must name {', '.join(SPREADS)}, got {unknown[0]!r}")
        if not get_policy(self.policy).branches:
            raise ValueError(f"`policy` must branch from prefixes, got {self.policy!r}")
        if not self.lrs or any(not (np.isfinite(x) and x > 0) for x in self.lrs):
            raise ValueError(f"`lrs` must be positive, got {self.lrs!r}")

    @classmethod
    def quick(cls) -> Config:
        return cls(seeds=2, batches=3, warmup=1, roots=24, predictors=("oracle", "learned"), spreads=("mid",),
                   arms=("grpo", "trace_barrier", "pipelined", "eager_0.0", "eager_0.5"),
                   learning_arms=("grpo", "pipelined", "eager_0.0"),
                   steps=3, lrs=(20.0, 40.0), report_seeds=2, tuning_seeds=1,
                   mdp=TreeMDP(n_tasks=16, horizon=3, pass_rates=PassRates().calibrated(PAPER_GRPO_RATIO, 8)))


# ---------------------------------------------------------------------------------------------------
# One batch's numbers
# ---------------------------------------------------------------------------------------------------


def regret(batch, policy_name: str, world) -> tuple[float, float]:
    """(sum flip(V, r, k) of the barrier's allocation on this batch's anchors minus the batch's own, the
    barrier's), true V: the regret against the hindsight optimum and what that optimum is worth."""
    record, forest = batch.record, batch.sampled.forest
    if record is None or record.node_ids.size == 0:
        return 0.0, 0.0
    anchors = record.node_ids
    r = forest.reward[forest.factual_leaf[anchors]]
    v_true = np.clip(batch.sampled.nodes["v"][anchors], 0.0, 1.0)
    leaves = forest.leaves
    first = forest.rollout_start[leaves]
    cont = first >= batch.planted
    k_arm = np.bincount(forest.parent[first[cont]], minlength=len(forest))[anchors]
    bare = ~cont
    m_tree = np.bincount(forest.tree_index[leaves[bare]], minlength=len(forest.roots))
    policy = get_policy(policy_name)
    per_root = (record.planned.continuations_per_root if record.planned is not None else 0)
    price = None
    if policy.priced_in_tokens:
        price = world.expected_turns(forest.depth[anchors]) / world.expected_turns(0)
    best = hindsight_continuations(policy, forest, anchors, record.node_v, per_root * m_tree, cost=price)
    optimum = float(flip_probability(v_true, r, best).sum())
    return optimum - float(flip_probability(v_true, r, k_arm).sum()), optimum


def batch_row(batch, policy_name: str, world, budget: RolloutBudget) -> dict:
    record = batch.record
    out = {**yield_metrics(batch.sampled.forest, rollouts=batch.rollouts, turns=batch.turns),
           "critical_path": float(critical_path(batch)), "turns": batch.turns, "rollouts": batch.rollouts}
    out["eager_share"] = float(record.eager_spent / max(budget.roots * budget.continuations_per_root, 1))
    branches = get_policy(policy_name).branches and record.node_ids.size
    lost, optimum = regret(batch, policy_name, world) if branches else (0.0, 0.0)
    out["regret_per_1k_turns"] = 1000.0 * lost / batch.turns
    out["regret_share"] = lost / optimum if optimum > 0 else 0.0
    return out


def run_arm(model, arm: str, config: Config, predictor_name: str, rng, *, batches: int) -> list[dict]:
    """Online batches of one arm; the eager threshold follows the previous batch's level."""
    policy_name, expansion, plan = parse_arm(arm, config.policy)
    policy = get_policy(policy_name, group_size=config.group_size)
    predictor = make_predictor(predictor_name, **PREDICTOR_OPTIONS.get(predictor_name, {}))
    if expansion == "pipelined":
        return _run_pipelined(model, policy, config, predictor, rng, batches=batches)
    rows = []
    for b in range(batches):
        batch = sample_batch(model, policy, config.budget, predictor, pool=config.pool, rng=rng,
                             expansion=expansion, eager=plan)
        predictor = predictor.update(batch.sampled)
        if plan is not None and batch.record.eager_level is not None:
            plan = dataclasses.replace(plan, threshold=batch.record.eager_level)
        rows.append({"batch": b, **batch_row(batch, policy_name, model, config.budget)})
    return rows


def _waves(world_of, policy, budget, predictor, pool: int, rng, steps: int):
    """Pipelined steps (``trace_theory.pipelined``): ``steps`` waves, then one that only grows the last
    step's continuations. Yields (wave, trained batch or None for the first wave, the wave's critical path)
    per wave; the predictor learns from whole trees only, one wave after their bare rollouts.
    ``world_of(wave)`` is the world of that wave (the tree MDP's current policy)."""
    pending = None
    for wave in range(steps + 1):
        out = sample_pipelined(world_of(wave), policy, budget, predictor, pool=pool, rng=rng, pending=pending,
                               plant=wave < steps)
        pending = out.pending
        if out.trained is not None:
            predictor = predictor.update(out.trained.sampled)
        yield wave, out.trained, out.wave_critical_path


def _run_pipelined(model, policy, config: Config, predictor, rng, *, batches: int) -> list[dict]:
    """Rows of the pipelined arm: batch b is the step planted in wave b, completed in wave b + 1 (its
    critical path is that wave's: one episode holding step b's continuations and step b + 1's bare rollouts).
    Every row's wave plants (the steady state): the last step's trees are not drained."""
    rows = []
    for wave, batch, path in _waves(lambda _: model, policy, config.budget, predictor, config.pool, rng, batches + 1):
        if batch is None or wave > batches:
            continue
        row = batch_row(batch, policy.name, model, config.budget)
        rows.append({"batch": wave - 1, **row, "critical_path": float(path)})
    return rows


# ---------------------------------------------------------------------------------------------------
# Learning in the tree MDP
# ---------------------------------------------------------------------------------------------------


def train(tasks, arm: str, config: Config, *, lr: float, rng) -> list[dict]:
    """Train from the uniform policy; one row per step: success J, turns and critical path spent so far."""
    policy_name, expansion, plan = parse_arm(arm, config.policy)
    policy = get_policy(policy_name, group_size=config.group_size)
    predictor = make_predictor("learned", decay=0.8)
    budget = RolloutBudget(config.learning_roots, config.learning_continuations)
    theta = tasks.initial_logits()
    spent = {"turns": 0.0, "critical_path": 0.0}
    rows = [{"step": 0, **spent, "success": float(tasks.success(theta).mean())}]
    if expansion == "pipelined":
        return rows + _train_pipelined(tasks, policy, budget, predictor, config, theta, spent, lr=lr, rng=rng)
    for step in range(1, config.steps + 1):
        world = MDPWorld(tasks, theta)
        batch = sample_batch(world, policy, budget, predictor, pool=tasks.mdp.n_tasks, rng=rng,
                             expansion=expansion, eager=plan)
        predictor = predictor.update(batch.sampled)
        if plan is not None and batch.record.eager_level is not None:
            plan = dataclasses.replace(plan, threshold=batch.record.eager_level)
        theta = policy_gradient_step(world, batch.trained, estimator="trace", lr=lr)
        spent["turns"] += batch.turns
        spent["critical_path"] += critical_path(batch)
        rows.append({"step": step, **spent, "success": float(tasks.success(theta).mean())})
    return rows


def _scores(curves: pd.DataFrame, at: dict[str, float]) -> pd.DataFrame:
    """Per run: J interpolated at equal turns and at an equal critical path."""
    wide = curves.pivot_table(index=["arm", "lr", "seed", "step"], columns="metric", values="value")
    rows = []
    for (arm, lr, seed), g in wide.groupby(level=["arm", "lr", "seed"]):
        for view, column in (("equal_turns", "turns"), ("equal_critical_path", "critical_path")):
            rows.append({"arm": arm, "lr": lr, "seed": seed, "view": view,
                         "value": float(np.interp(at[view], g[column], g["success"]))})
    return pd.DataFrame(rows)


# ---------------------------------------------------------------------------------------------------
# The experiment
# ---------------------------------------------------------------------------------------------------


def run(config: Config, units: Units) -> Outcome:
    def table_unit(key) -> pd.DataFrame:
        predictor, spread, arm, s = key
        model = calibrated(dataclasses.replace(config.model, stop_prob=SPREADS[spread]), config.target_ratio,
                           config.group_size)
        rng = unit_rng(config.seed, NAME, predictor, spread, s)  # every arm draws the same first batch
        rows = run_arm(model, arm, config, predictor, rng, batches=config.batches)
        return tidy_metrics(NAME, rows, METRICS, arm=arm, predictor=predictor, spread=spread, seed=s,
                            budget=config.budget.total, part="table")

    keys = [(p, sp, a, s) for p in config.predictors for sp in config.spreads for a in config.arms
            for s in range(config.seeds)]
    table = units.map(table_unit, keys, desc=NAME)
    steady = table[table["batch"] >= config.warmup]
    summary = summarise(steady, ["predictor", "spread", "arm", "metric"])

    def learn_unit(key) -> pd.DataFrame:
        arm, lr, s = key
        tasks = config.mdp.build(unit_rng(config.seed, NAME, "tasks", s))
        rows = train(tasks, arm, config, lr=lr, rng=unit_rng(config.seed, NAME, "learn", arm, s))
        return tidy_metrics(NAME, rows, ("success", "turns", "critical_path"), arm=arm, lr=lr, seed=s,
                            part="learning", index="step")

    seeds = range(config.report_seeds + config.tuning_seeds)
    learning = units.map(learn_unit, [(a, lr, s) for a in config.learning_arms for lr in config.lrs for s in seeds],
                         desc=NAME + "-learning")
    headline, details = _headline(summary, config)
    details["learning"] = _learning(learning, config)
    result, held = _verdict(headline, details, config)
    return Outcome(pd.concat([table, learning], ignore_index=True), headline, result, held, details)


def _cell(summary, predictor, spread, arm, metric):
    row = summary[(summary["predictor"] == predictor) & (summary["spread"] == spread) & (summary["arm"] == arm)
                  & (summary["metric"] == metric)]
    return (float(row["value"].iloc[0]), float(row["stderr"].iloc[0])) if len(row) else (float("nan"),) * 2


def _headline(summary: pd.DataFrame, config: Config) -> tuple[dict, dict]:
    headline: dict = {}
    for row in summary.itertuples():
        entry = headline.setdefault(row.predictor, {}).setdefault(row.spread, {}).setdefault(row.arm, {})
        entry[row.metric] = round(float(row.value), 4)
        entry[row.metric + "_stderr"] = round(float(row.stderr), 4)
    regime, waiting = {}, {}
    for p in config.predictors:
        for sp in config.spreads:
            lazy, _ = _cell(summary, p, sp, "trace_barrier", "contrast_pairs_per_1k_turns")
            grpo_path, _ = _cell(summary, p, sp, "grpo", "critical_path")
            for arm in config.arms:
                if not (arm.startswith("eager") or arm == "pipelined"):
                    continue
                pairs, _ = _cell(summary, p, sp, arm, "contrast_pairs_per_1k_turns")
                path, _ = _cell(summary, p, sp, arm, "critical_path")
                regime[f"{p}/{sp}/{arm}"] = {"pairs_kept": round(pairs / lazy, 4),
                                             "critical_path_over_grpo": round(path - grpo_path, 3)}
            eager0, _ = _cell(summary, p, sp, "eager_0.0", "contrast_pairs_per_1k_turns")
            waiting[f"{p}/{sp}"] = round(1.0 - eager0 / lazy, 4)
    return headline, {"regime": regime, "value_of_waiting": waiting}


def _learning(curves: pd.DataFrame, config: Config) -> dict:
    final = curves[curves["step"] == config.steps].pivot_table(index=["arm", "lr", "seed"], columns="metric",
                                                               values="value")
    at = {"equal_turns": float(final["turns"].groupby(level="arm").mean().min()),
          "equal_critical_path": float(final["critical_path"].groupby(level="arm").mean().min())}
    scores = _scores(curves, at)
    tuning_seeds = range(config.report_seeds, config.report_seeds + config.tuning_seeds)
    rates = tuning.best_rates(scores, tuning_seeds)
    out = {"at": {k: round(v, 1) for k, v in at.items()}, "lrs": list(config.lrs)}
    for view in ("equal_turns", "equal_critical_path"):
        comparison = tuning.comparison(scores, rates[view], view, range(config.report_seeds), "eager_0.0")
        out[view] = comparison
        out[view]["on_grid_edge"] = tuning.on_grid_edge(rates[view], config.lrs)
        if "pipelined" in config.learning_arms:
            out[view]["pipelined_gap"] = tuning.comparison(scores, rates[view], view, range(config.report_seeds),
                                                           "pipelined")["gap"]
    return out


def _verdict(headline: dict, details: dict, config: Config) -> tuple[str, bool]:
    parts, held = [], True
    learned = [k for k in details["regime"] if k.startswith("learned/") and k.endswith("/eager_0.0")]
    for key in learned:
        cell = details["regime"][key]
        spread = key.split("/")[1]
        parts.append(f"learned predictor, {spread} spread: eager (reserve 0) keeps {cell['pairs_kept']:.0%} of lazy "
                     f"TRACE's contrast pairs per 1k turns, critical path {cell['critical_path_over_grpo']:+.2f} "
                     "turns over GRPO's")
        held &= cell["pairs_kept"] >= 0.9 and cell["critical_path_over_grpo"] <= 1.0
        for reserve in ("0.25", "0.5"):
            other = details["regime"].get(key.replace("eager_0.0", f"eager_{reserve}"))
            if other:
                parts[-1] += (f" (reserve {reserve}: {other['pairs_kept']:.0%}, "
                              f"{other['critical_path_over_grpo']:+.2f} turns)")
    piped = [k for k in details["regime"] if k.startswith("learned/") and k.endswith("/pipelined")]
    for key in piped:
        cell = details["regime"][key]
        parts.append(f"pipelined (one-step-off continuations), learned, {key.split('/')[1]} spread: "
                     f"{cell['pairs_kept']:.0%} of lazy TRACE's contrast pairs per 1k turns, critical path per wave "
                     f"{cell['critical_path_over_grpo']:+.2f} turns over GRPO's")
    waiting = details["value_of_waiting"]
    parts.append("value of waiting (share of lazy TRACE's contrast pairs eager loses, mid spread): " + ", ".join(
        f"{k.split('/')[0]} {v:+.1%}" for k, v in waiting.items() if k.endswith("/mid") or len(config.spreads) == 1))
    for view in ("equal_turns", "equal_critical_path"):
        learn = details["learning"][view]
        gaps = ", ".join(f"vs {arm} {g['mean']:+.3f} ± {g['stderr']:.3f}" for arm, g in learn["gap"].items())
        parts.append(f"MDP learning at {view.replace('_', ' ')} (each arm at its best rate): eager_0.0 J "
                     f"{learn['score']['eager_0.0']['mean']:.3f}; {gaps}")
        if "pipelined_gap" in learn:
            gaps = ", ".join(f"vs {arm} {g['mean']:+.3f} ± {g['stderr']:.3f}" for arm, g in learn["pipelined_gap"].items())
            parts[-1] += f"; pipelined J {learn['score']['pipelined']['mean']:.3f}: {gaps}"
    return "; ".join(parts) + ".", bool(held and learned)


EXPERIMENT = register(Experiment(NAME, CLAIM, Config, run))


def _train_pipelined(tasks, policy, budget, predictor, config: Config, theta, spent, *, lr: float, rng) -> list[dict]:
    """Pipelined learning: wave s samples step s's bare rollouts and step s - 1's continuations from the
    current policy; the update trains step s - 1's whole trees, each turn weighted by its importance
    ratio against the policy that sampled it (``policy_gradient_step``: bare turns are one update old).
    The first wave trains nothing; ``config.steps`` updates, the last after a wave of continuations only.
    The critical path counts every wave (the first one's with the first update), turns every tree."""
    state = {"theta": theta}
    rows = []

    def world_of(_wave):
        return MDPWorld(tasks, state["theta"])

    for wave, batch, path in _waves(world_of, policy, budget, predictor, tasks.mdp.n_tasks, rng, config.steps):
        spent["critical_path"] += path
        if batch is None:
            continue
        state["theta"] = policy_gradient_step(world_of(wave), batch.trained, estimator="trace", lr=lr)
        spent["turns"] += batch.turns
        rows.append({"step": wave, **spent, "success": float(tasks.success(state["theta"]).mean())})
    return rows
