"""Experiment 12 (issue 56): does prefix expansion pay on a task built for it? The key-then-lock MDP.

The world (:mod:`simulations.key_lock`): turn 1 picks one of K keys, turn 2 a binary choice; success only
with the right key and the right choice. Under the uniform policy V(root) = 1/(2K), a right-key prefix
has V = 1/2 and a wrong-key prefix V = 0, with K mixed across prompts (``keys``). This is the regime the
paper's prefix stage is for: roots near 0, one prefix near 1/2, and the predictor sees the key outcome
(a state's signal is logit V plus noise).

Protocol, fixed before the run:

* arms ``grpo``, ``root_only``, ``pcl`` and ``trace`` (learned predictor), M (1 + N) rollouts per step,
  tabular softmax policy from uniform, ``steps`` steps (:func:`.learning_curves.train_curve`);
* each arm's learning rate is the best of ``lrs`` (mean over ``tuning_seeds`` seeds, per view) on tuning
  seeds ``TUNING_BASE`` + i, disjoint from the report seeds 0 .. ``seeds`` - 1 (fresh tasks and streams);
* two views: final J after ``steps`` steps (equal rollouts) and J interpolated at the turns the cheapest
  arm spent (equal turns; a continuation from a depth-1 prefix generates one turn, a root two);
* **primary comparison: TRACE minus GRPO at equal turns**, paired by seed, 95% t-interval and two-sided
  paired t-test; the others (TRACE minus GRPO at equal rollouts, TRACE minus root-only and minus PCL in
  both views) Holm-corrected as one family;
* an arm whose best rate is an end of the grid is named (``on_grid_edge``): widen the grid and rerun.

The claim holds if the primary comparison is positive at p < 0.05 and TRACE beats root-only at equal
turns after Holm's correction. Per-seed rows (seed, arm, lr, metrics) are kept in ``details`` so that
the verdict can be recomputed; :func:`evidence` turns a summary into the committed evidence file.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from trace_theory import RolloutBudget

from ..key_lock import KeyLockMDP
from ..runner import Arm
from . import tuning
from .base import Experiment, Outcome, Units, register, tidy_metrics, unit_rng
from .common import check_arms
from .learning_curves import train_curve

NAME = "key_lock"
CLAIM = (
    "On the key-then-lock tree MDP (root V ~ 1/(2K), a right-key prefix V ~ 1/2), TRACE trains a better "
    "policy than GRPO at equal turns (the primary comparison) and than root-only allocation, each arm at "
    "its own best learning rate chosen on separate tuning seeds."
)
ARMS = ("grpo", "root_only", "pcl", "trace")
VIEWS = ("equal_rollouts", "equal_turns")
PRIMARY = ("trace", "grpo", "equal_turns")
TUNING_BASE = 10_000
"""Tuning seed i is ``TUNING_BASE + i``; report seeds are 0 .. seeds - 1 (disjoint by construction)."""
RUN_METRICS = ("success", "turns", "effective_ratio", "mixed_prompts_per_1k_turns")


@dataclass(frozen=True)
class Config:
    seed: int = 0
    seeds: int = 32
    """Paired report seeds (every arm trains on the same tasks within a seed)."""
    tuning_seeds: int = 6
    steps: int = 20
    roots: int = 32
    continuations: int = 2
    group_size: int = 8
    arms: tuple[str, ...] = ARMS
    lrs: tuple[float, ...] = (10.0, 20.0, 40.0, 80.0, 160.0, 320.0, 640.0, 1280.0, 2560.0, 5120.0)
    """Learning-rate grid, swept per arm on the tuning seeds (widened until no arm's best rate is an end
    or its score has flattened: in this tabular world with 0/1 rewards large steps saturate, not diverge)."""
    normalisation: str = "leaves"
    predictor_decay: float = 0.8
    world: KeyLockMDP = field(default_factory=lambda: KeyLockMDP(n_tasks=128))

    def __post_init__(self):
        for name in ("seeds", "tuning_seeds", "steps", "roots", "group_size"):
            value = getattr(self, name)
            if not (isinstance(value, int) and value >= 1):
                raise ValueError(f"`{name}` must be a positive integer, got {value!r}")
        if self.seeds < 2:
            raise ValueError(f"`seeds` must be at least 2 (paired intervals), got {self.seeds!r}")
        if not (isinstance(self.continuations, int) and self.continuations >= 0):
            raise ValueError(f"`continuations` must be a non-negative integer, got {self.continuations!r}")
        if not (self.lrs and all(np.isfinite(x) and x > 0 for x in self.lrs)):
            raise ValueError(f"`lrs` must be positive learning rates, got {self.lrs!r}")
        check_arms(self.arms)
        if not {"trace", "grpo"} <= set(self.arms):
            raise ValueError(f"`arms` must include 'trace' and 'grpo', got {self.arms!r}")
        need = -(-RolloutBudget(self.roots, self.continuations).total // self.group_size)
        if need > self.world.n_tasks:
            raise ValueError(f"flat arms draw up to {need} tasks per step; raise `world.n_tasks`")

    @property
    def tuning_seed_ids(self) -> list[int]:
        return [TUNING_BASE + i for i in range(self.tuning_seeds)]

    @classmethod
    def quick(cls) -> Config:
        return cls(seeds=3, tuning_seeds=2, steps=4, roots=16, lrs=(20.0, 80.0),
                   world=KeyLockMDP(n_tasks=32))


def run(config: Config, units: Units) -> Outcome:
    budget = RolloutBudget(config.roots, config.continuations)

    def unit(key) -> pd.DataFrame:
        arm_text, lr, s = key
        arm = Arm.parse(arm_text)
        rows = train_curve(
            config.world.build(unit_rng(config.seed, NAME, "tasks", s)),  # the same tasks for every arm
            arm, "trace", budget=budget, steps=config.steps, lr=lr, normalisation=config.normalisation,
            rng=unit_rng(config.seed, NAME, arm.label, s),  # the same stream at every rate
            group_size=config.group_size, predictor_decay=config.predictor_decay,
        )
        return tidy_metrics(NAME, rows, RUN_METRICS, arm=arm.label, lr=lr, seed=s,
                            budget=budget.total, index="step")

    labels = [Arm.parse(a).label for a in config.arms]
    tuned = units.map(unit, [(a, lr, s) for a in config.arms for lr in config.lrs
                             for s in config.tuning_seed_ids], desc=NAME + "-tuning")
    equal_turns = _equal_turns(tuned)
    scores = _scores(tuned, equal_turns)
    rates = tuning.best_rates(scores, config.tuning_seed_ids)
    keys = [(a, lr, s) for a, label in zip(config.arms, labels)
            for lr in sorted({rates[v][label] for v in VIEWS}) for s in range(config.seeds)]
    reported = units.map(unit, keys, desc=NAME + "-report")
    per_seed = _scores(reported, equal_turns)
    details = _details(per_seed, scores, rates, config, equal_turns)
    table = pd.concat([tuned.assign(stage="tuning"), reported.assign(stage="report")], ignore_index=True)
    return Outcome(table, details.pop("headline"), details["verdict"], details["held"], details)


def _equal_turns(table: pd.DataFrame) -> float:
    """The turns the cheapest arm spends in all its steps (mean over its runs)."""
    last = table[(table["metric"] == "turns") & (table["step"] == table["step"].max())]
    return float(last.groupby("arm")["value"].mean().min())


def _scores(table: pd.DataFrame, equal_turns: float) -> pd.DataFrame:
    """One row per run: ``final_success``, ``success_at_equal_turns``, ``mixed_share`` (mean over steps of
    the share of prompts with mixed outcomes), ``mixed_prompts_per_1k_turns`` (mean over steps) and the
    ``turns`` spent."""
    wide = table.pivot_table(index=["arm", "lr", "seed", "step"], columns="metric", values="value")
    rows = []
    for (arm, lr, seed), g in wide.groupby(level=["arm", "lr", "seed"], sort=False):
        g = g.sort_index(level="step")
        rows.append({
            "seed": int(seed), "arm": arm, "lr": float(lr),
            "final_success": float(g["success"].iloc[-1]),
            "success_at_equal_turns": float(np.interp(equal_turns, g["turns"], g["success"])),
            "mixed_share": float(g["effective_ratio"].iloc[1:].mean()),
            "mixed_prompts_per_1k_turns": float(g["mixed_prompts_per_1k_turns"].iloc[1:].mean()),
            "turns": float(g["turns"].iloc[-1]),
        })
    out = pd.DataFrame(rows)
    long = out.melt(id_vars=["seed", "arm", "lr"], value_vars=["final_success", "success_at_equal_turns"],
                    var_name="view", value_name="value")
    long["view"] = long["view"].map({"final_success": "equal_rollouts", "success_at_equal_turns": "equal_turns"})
    return out.merge(long, on=["seed", "arm", "lr"])


def paired(diff: np.ndarray) -> dict:
    """Mean of paired differences, its 95% t-interval and the two-sided paired t-test's p-value."""
    diff = np.asarray(diff, dtype=float)
    n = diff.size
    mean, se = float(diff.mean()), float(diff.std(ddof=1) / np.sqrt(n))
    half = float(stats.t.ppf(0.975, n - 1)) * se
    p = float(stats.ttest_1samp(diff, 0.0).pvalue) if se > 0 else (0.0 if mean != 0 else 1.0)
    return {"mean": round(mean, 4), "ci95": [round(mean - half, 4), round(mean + half, 4)],
            "stderr": round(se, 4), "p": round(p, 6), "n": n}


def holm(p_values: list[float]) -> list[float]:
    """Holm's step-down adjusted p-values (family-wise error), in the order given."""
    order = np.argsort(p_values)
    m, adjusted, running = len(p_values), [0.0] * len(p_values), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


def _details(per_seed: pd.DataFrame, scores: pd.DataFrame, rates: dict, config: Config,
             equal_turns: float) -> dict:
    labels = [Arm.parse(a).label for a in config.arms]
    value = {v: per_seed[(per_seed["view"] == v) & (per_seed["lr"] == per_seed["arm"].map(rates[v]))]
             .pivot_table(index="seed", columns="arm", values="value") for v in VIEWS}
    comparisons = []
    for view in VIEWS:
        for other in labels:
            if other != "trace":
                diff = (value[view]["trace"] - value[view][other]).dropna().to_numpy()
                comparisons.append({"trace_minus": other, "view": view,
                                    "primary": ("trace", other, view) == PRIMARY, **paired(diff)})
    secondary = [c for c in comparisons if not c["primary"]]
    for c, p in zip(secondary, holm([c["p"] for c in secondary])):
        c["p_holm"] = round(p, 6)
    headline = {}
    for label in labels:
        entry = {}
        for view in VIEWS:
            at = per_seed[(per_seed["arm"] == label) & (per_seed["lr"] == rates[view][label])
                          & (per_seed["view"] == view)]
            entry[view] = {"success": round(float(at["value"].mean()), 4),
                           "stderr": round(float(at["value"].std(ddof=1) / np.sqrt(len(at))), 4),
                           "lr": rates[view][label],
                           "mixed_share": round(float(at["mixed_share"].mean()), 4),
                           "mixed_prompts_per_1k_turns": round(float(at["mixed_prompts_per_1k_turns"].mean()), 2)}
        headline[label] = entry
    grid = scores.groupby(["view", "arm", "lr"])["value"].mean()
    edge = sorted({a for v in VIEWS for a in tuning.on_grid_edge(rates[v], config.lrs)})
    lrs = sorted(config.lrs)
    neighbour = {lrs[0]: lrs[min(1, len(lrs) - 1)], lrs[-1]: lrs[max(len(lrs) - 2, 0)]}
    flat = {a: round(max(abs(float(grid[v, a, rates[v][a]] - grid[v, a, neighbour[rates[v][a]]]))
                         for v in VIEWS if rates[v][a] in neighbour), 4) for a in edge}
    primary = next(c for c in comparisons if c["primary"])
    beats_root = [c for c in secondary if c["trace_minus"] == "root_only" and c["view"] == "equal_turns"]
    held = bool(primary["mean"] > 0 and primary["p"] < 0.05
                and all(c["mean"] > 0 and c["p_holm"] < 0.05 for c in beats_root))
    rows = per_seed[per_seed["view"] == "equal_rollouts"].drop(columns=["view", "value"])
    rows = rows.assign(best_for=[",".join(v for v in VIEWS if rates[v][a] == lr) for a, lr in zip(rows["arm"], rows["lr"])])
    details = {
        "headline": headline,
        "primary": "trace minus grpo at equal turns (paired by seed, two-sided t-test)",
        "comparisons": comparisons,
        "equal_turns": round(equal_turns, 1),
        "keys": list(config.world.keys),
        "uniform_success": round(float(np.mean(1.0 / (2.0 * config.world.key_counts()))), 4),
        "best_lr": rates,
        "lrs": list(config.lrs),
        "on_grid_edge": edge,
        "edge_change": flat,
        "tuning_mean": {v: {a: {f"{lr:g}": round(float(grid[v, a, lr]), 4) for lr in config.lrs}
                            for a in labels} for v in VIEWS},
        "tuning_seeds": config.tuning_seed_ids,
        "seeds": list(range(config.seeds)),
        "per_seed": rows.round(6).to_dict(orient="records"),
        "held": held,
    }
    details["verdict"] = _verdict(headline, comparisons, flat, held)
    return details


def _verdict(headline: dict, comparisons: list[dict], edge: dict, held: bool) -> str:
    def say(c):
        p = f"p = {c['p']:.3g}" if c["primary"] else f"Holm p = {c['p_holm']:.3g}"
        return (f"{c['trace_minus']} {c['mean']:+.3f} (95% CI {c['ci95'][0]:+.3f}..{c['ci95'][1]:+.3f}, {p}, "
                f"n = {c['n']})")

    def outcome(c):
        p = c["p"] if c["primary"] else c["p_holm"]
        return "beats" if c["mean"] > 0 and p < 0.05 else "loses to" if p < 0.05 else "does not separate from"

    at_turns = {c["trace_minus"]: c for c in comparisons if c["view"] == "equal_turns"}
    succ = ", ".join(f"{a} {h['equal_turns']['success']:.3f}" for a, h in headline.items())
    parts = [f"TRACE {'beats' if held else 'does not beat'} root-only and GRPO here: at equal turns it "
             + ", ".join(f"{outcome(c)} {name}" for name, c in at_turns.items())
             + " (GRPO: the primary comparison)", f"J at equal turns: {succ}"]
    for view in VIEWS:
        parts.append(f"TRACE minus, at {view.replace('_', ' ')}: "
                     + "; ".join(say(c) for c in comparisons if c["view"] == view))
    grpo_mixed = headline.get("grpo", {}).get("equal_turns", {}).get("mixed_share")
    if grpo_mixed is not None:
        parts.append(f"GRPO's mixed share {grpo_mixed:.2f}, TRACE's {headline['trace']['equal_turns']['mixed_share']:.2f}")
    if edge:
        parts.append("best rate at an end of the grid for " + ", ".join(
            f"{a} (tuning J {d:.4f} from the next rate in)" for a, d in edge.items()))
    else:
        parts.append("no best rate on the grid's edge")
    return ". ".join(parts) + "."


def evidence(summary: dict) -> dict:
    """The evidence file from a ``summary.json``: provenance, seeds, per-seed rows and the verdict first."""
    details = summary["details"]
    head = {k: summary[k] for k in ("commit", "dirty", "command", "load_average", "machine") if k in summary}
    return {**head, "verdict": details["verdict"], "held": summary["held"], "primary": details["primary"],
            "tuning_seeds": details["tuning_seeds"], "seeds": details["seeds"], "headline": summary["headline"],
            **{k: v for k, v in details.items() if k not in ("verdict", "held", "primary", "tuning_seeds", "seeds")},
            "runtime_s": summary.get("runtime_s")}


def main(argv: list[str] | None = None) -> int:
    """``python -m simulations.experiments.key_lock SUMMARY OUT``: write the evidence file."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m simulations.experiments.key_lock results/key_lock/summary.json OUT.json",
              file=sys.stderr)
        return 2
    Path(args[1]).write_text(json.dumps(evidence(json.loads(Path(args[0]).read_text())), indent=1) + "\n")
    return 0


if __name__ == "__main__":  # the package registered this module when it imported it
    sys.exit(main())
else:
    EXPERIMENT = register(Experiment(NAME, CLAIM, Config, run))
