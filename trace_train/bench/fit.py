"""What a TRACE step costs next to a GRPO step, and what fitting the success predictor costs a step.

    python -m trace_train.bench.fit --compare                      # TRACE (streamed, barrier) vs GRPO, 4 pairs
    python -m trace_train.bench.fit --compare --backend vllm       # the same on vLLM (CPU or GPU)
    python -m trace_train.bench.fit                                # grpo with and without the fit, 8 steps each
    python -m trace_train.bench.fit --policy trace                 # TRACE always fits (it allocates by V~)

``--compare``: interleaved pairs (by default trace, trace with ``rollout.expansion=barrier``, ``eager``
and ``pipelined``, then grpo;
``--arms`` adds ``trace_eager_lag1`` (eager decided one turn after each prefix forms, the default before
round 14), ``trace_dense_fit``, the dense ``predictor.fit=adam`` of before, ``trace_tokens``, or the
diagnostics ``trace_leaf`` (per-leaf update rows), ``grpo_fit`` (GRPO that fits the predictor) and
``grpo_block128`` (vLLM-CPU's own 128-token KV block instead of the default 32; each run's mean
``prefix_cache_hit_rate`` is reported); one
after another, so load drifts hit every arm alike) of ``cpu_demo``
runs on the mixed-difficulty games (``bench_policies --task mixed``) at equal generated tokens per step
(``rollout.token_budget``), one compute thread each, without evaluation. Per run: the mean step wall
time (rollout + train), its phases (``trace_train.run.step_metrics``' timing breakdown) and the
tokens generated per step (its wave's, ``wave_tokens``: under ``pipelined`` this step's bare rollouts and
the previous step's continuations; the tokens trained are ``trained_tokens``, with their
``stale_token_share``), leaving out the first step (warm-up; under ``pipelined`` the pipeline fill) and,
under ``pipelined``, the last (it drains the pipeline: continuations only); reported: each policy's mean over pairs,
the ratio to GRPO (mean of the per-pair ratios ± its standard error), the same per generated token (a
run's step seconds over its tokens per step, against its pair's GRPO run: the budget is met to within a
few tokens, not exactly) and the load average.

Without ``--compare``: each run is the ``cpu_demo`` preset without evaluation; ``log_predictor=true``
makes a policy that does not read V~ fit it anyway. Reported: the mean ``rollout_seconds`` and
``train_seconds`` per step, leaving out the first step. Timings depend on the machine's load: note ``uptime``.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

import numpy as np

from . import BACKEND_NAMES, origin
from ..config_loader import load_config
from ..run.metrics_log import read_metrics
from ..train import TrainConfig, main as train

MIXED_ROWS = "{low: 1, highs: [2, 6, 64], max_guesses: 3}"  # bench_policies.TASKS["mixed"]
PHASES = ("predict_seconds", "allocation_seconds", "bare_generation_seconds", "expansion_generation_seconds",
          "prepare_seconds", "update_seconds", "sync_seconds", "fit_wait_seconds", "predictor_fit_seconds",
          "predictor_fit_cpu_seconds")
ARMS = {"trace": ["rollout.policy=trace"], "trace_barrier": ["rollout.policy=trace", "rollout.expansion=barrier"],
        "trace_eager": ["rollout.policy=trace", "rollout.expansion=eager"],
        "trace_eager_lag1": ["rollout.policy=trace", "rollout.expansion=eager", "rollout.eager_lag=1"],
        "trace_pipelined": ["rollout.policy=trace", "rollout.expansion=pipelined"],
        "trace_dense_fit": ["rollout.policy=trace", "predictor.fit=adam"],
        "trace_tokens": ["rollout.policy=trace_tokens"], "grpo": ["rollout.policy=grpo"],
        # diagnostics: TRACE with per-leaf rows (what tree packing costs or saves the update), and GRPO
        # fitting the predictor it never reads (what the fit's thread costs a step beside the update)
        "trace_leaf": ["rollout.policy=trace", "algorithm.packing=leaf"],
        "grpo_fit": ["rollout.policy=grpo", "log_predictor=true"],
        # vLLM-CPU's own KV block (128 tokens) instead of ours (32): what the prefix cache serves
        "grpo_block128": ["rollout.policy=grpo", "backend.block_size=128"]}
DEFAULT_ARMS = ("trace", "trace_barrier", "trace_eager", "trace_pipelined", "grpo")


def measure(policy: str, steps: int, fit: bool, root: Path) -> dict:
    run_dir = root / f"{policy}-fit{int(fit)}"
    cfg = load_config(TrainConfig, "cpu_demo", [f"run_dir={run_dir}", f"steps={steps}", "eval.every=0",
                                                "tensorboard=false", f"rollout.policy={policy}",
                                                f"log_predictor={str(fit).lower()}", f"checkpoint_every={steps}"])
    train(cfg)
    rows = read_metrics(run_dir / "metrics.jsonl")[1:]
    return {"policy": policy, "fits_predictor": cfg.fits_predictor,
            "rollout_seconds": float(np.mean([r["rollout_seconds"] for r in rows])),
            "train_seconds": float(np.mean([r["train_seconds"] for r in rows]))}


def measure_arm(arm: str, pair: int, steps: int, token_budget: int, backend: str, root: Path) -> dict:
    """One run of an arm of ``--compare``: mean step seconds and phases over steps 2..steps."""
    run_dir = root / f"{arm}-{pair}"
    cfg = load_config(TrainConfig, "cpu_demo", [
        f"run_dir={run_dir}", f"seed={pair}", f"steps={steps}", "eval.every=0", "tensorboard=false",
        f"checkpoint_every={steps}", f"task.rows={MIXED_ROWS}", f"rollout.token_budget={token_budget}",
        f"backend.kind={backend}", "backend.threads=1", *ARMS[arm]])
    train(cfg)
    rows = read_metrics(run_dir / "metrics.jsonl")[1:]  # less the warm-up step (no evaluation rows)
    if cfg.rollout.expansion == "pipelined":  # less the last step too: it drains the pipeline (no bare rollouts)
        rows = rows[:-1]
    out = {"arm": arm, "pair": pair,
           "step_seconds": float(np.mean([r["rollout_seconds"] + r["train_seconds"] for r in rows])),
           "generated_tokens": float(np.mean([r.get("wave_tokens", r["generated_tokens"]) for r in rows])),
           "trained_tokens": float(np.mean([r["generated_tokens"] for r in rows])),
           "stale_token_share": float(np.mean([r.get("stale_token_share", 0.0) for r in rows])),
           "prefix_cache_hit_rate": float(np.mean([r.get("prefix_cache_hit_rate", 0.0) for r in rows]))}
    out.update({k: float(np.mean([r.get(k, 0.0) for r in rows])) for k in PHASES})
    return out


def compare(pairs: int, steps: int, token_budget: int, backend: str, arms=DEFAULT_ARMS) -> dict:
    results: list[dict] = []
    arms = tuple(dict.fromkeys((*arms, "grpo")))  # GRPO is the reference
    with tempfile.TemporaryDirectory() as tmp:
        for pair in range(pairs):
            for arm in arms:
                results.append(measure_arm(arm, pair, steps, token_budget, backend, Path(tmp)))
                print(json.dumps(results[-1]), flush=True)
    by = {arm: [r for r in results if r["arm"] == arm] for arm in arms}
    grpo = np.array([r["step_seconds"] for r in by["grpo"]])
    grpo_per_token = grpo / np.array([r["generated_tokens"] for r in by["grpo"]])
    lines = ["| arm | step s | ratio to GRPO (± SE) | per token (± SE) | tokens / step | predict | allocation | bare gen "
             "| expansion gen | update | sync | fit wait | fit (wall) | fit CPU-s |", "|---" * 14 + "|"]
    summary = {"backend": backend, "pairs": pairs, "steps": steps, "token_budget": token_budget}
    for arm, rows in by.items():
        ratio = np.array([r["step_seconds"] for r in rows]) / grpo
        per_token = np.array([r["step_seconds"] / r["generated_tokens"] for r in rows]) / grpo_per_token
        mean = {k: float(np.mean([r.get(k, 0.0) for r in rows]))
                for k in ("step_seconds", "generated_tokens", "trained_tokens", "stale_token_share",
                          "prefix_cache_hit_rate", *PHASES)}
        se, token_se = _se(ratio), _se(per_token)
        summary[arm] = {**mean, "ratio_to_grpo": float(ratio.mean()), "ratio_se": se,
                        "per_token_ratio_to_grpo": float(per_token.mean()), "per_token_ratio_se": token_se}
        lines.append(f"| {arm} | {mean['step_seconds']:.3f} | {ratio.mean():.2f} ± {se:.2f} | "
                     f"{per_token.mean():.2f} ± {token_se:.2f} | {mean['generated_tokens']:.0f} | " + " | ".join(
                         f"{mean[k]:.3f}" for k in ("predict_seconds", "allocation_seconds", "bare_generation_seconds",
                                                    "expansion_generation_seconds", "update_seconds", "sync_seconds",
                                                    "fit_wait_seconds", "predictor_fit_seconds",
                                                    "predictor_fit_cpu_seconds")) + " |")
    summary["load_average"] = os.getloadavg()
    print("\n".join(lines))
    print(f"load average: {summary['load_average']}")
    return summary


def _se(x: np.ndarray) -> float:
    """The standard error of the mean of ``x`` (NaN for one value)."""
    return float(x.std(ddof=1) / np.sqrt(len(x))) if len(x) > 1 else float("nan")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", default="grpo")
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--compare", action="store_true", help="TRACE against GRPO at equal tokens (docstring)")
    parser.add_argument("--pairs", type=int, default=4)
    parser.add_argument("--token-budget", type=int, default=600, help="generated tokens per step (--compare)")
    parser.add_argument("--backend", default="hf", choices=BACKEND_NAMES)
    parser.add_argument("--arms", nargs="+", default=list(DEFAULT_ARMS), choices=sorted(ARMS),
                        help="arms of --compare (GRPO always runs)")
    parser.add_argument("--json", type=Path, default=None, help="also write --compare's summary to this file")
    args = parser.parse_args(argv)
    record = origin("trace_train.bench.fit", argv)
    if args.compare:
        summary = compare(args.pairs, args.steps, args.token_budget, args.backend, args.arms)
        if args.json is not None:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps({**record, **summary}, indent=1) + "\n")
        return summary
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for fit in (True, False):
            results.append(measure(args.policy, args.steps, fit, Path(tmp)))
            print(json.dumps(results[-1]), flush=True)
    print(f"load average: {os.getloadavg()}")
    return results


if __name__ == "__main__":
    main()
