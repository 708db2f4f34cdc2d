"""Held-out evaluation during training: fresh rollouts on the fixed held-out prompts, dealt out over the ranks."""

from __future__ import annotations

from ..configs import TrainConfig
from .distributed import DistInfo, merge_metrics

__all__ = ["evaluate_held_out", "own_eval_rows"]


def evaluate_held_out(engine_eval, rows: list, step: int, info: DistInfo) -> dict:
    """Mean reward of fresh rollouts on the fixed held-out prompts (uniform groups, no predictor), with how
    many rollouts that is and how many of them ended in an environment failure: each rank plays its own
    share of the prompts (:func:`own_eval_rows`; ``engine_eval`` None: a rank with none), and the counts
    are summed over the ranks: eval_success = sum of rewards / rollouts, over every rank."""
    total, count, failed = 0.0, 0.0, 0.0
    if engine_eval is not None and rows:
        batch = engine_eval.rollout(rows, seed=10_000_019 + step)
        f, ends = batch.forest, batch.report.end_reasons
        total, count = float(f.reward[f.leaves].sum()), float(f.n_leaves)
        failed = float(ends.get("env_error", 0) + ends.get("env_timeout", 0))
    merged = merge_metrics({"reward_sum": total, "rollouts": count, "env_failures": failed}, 1.0, info,
                           sums=("reward_sum", "rollouts", "env_failures"))
    return {"eval_success": merged["reward_sum"] / merged["rollouts"] if merged["rollouts"] else float("nan"),
            "eval_rollouts": merged["rollouts"], "eval_env_failures": merged["env_failures"]}


def own_eval_rows(task, cfg: TrainConfig, info: DistInfo) -> list:
    """This rank's held-out prompts: the first ``eval.prompts`` rows dealt out over the ranks in turn
    (rank r plays rows r, r + W, ...; one process plays them all), so a held-out pass costs each GPU 1 / W
    of the whole instead of all of it."""
    return list(task.eval_rows[:cfg.eval.prompts])[info.rank::info.world_size]
