"""What a TRACE step costs next to a GRPO step, and what fitting the success predictor costs a step.

    python -m trace_train.bench.fit --compare                      # every expansion mode vs GRPO, 4 pairs
    python -m trace_train.bench.fit --compare --task guess_games --backend hf --pairs 6 --steps 12 --arms trace_eager trace --json benchmarks/step_cost/whole_step_hf_guess_games.json
    python -m trace_train.bench.fit --compare --backend vllm       # the same on vLLM (CPU or GPU)
    python -m trace_train.bench.fit                                # grpo with and without the fit, 8 steps each
    python -m trace_train.bench.fit --policy trace                 # TRACE always fits (it allocates by V~)

``--compare``: interleaved pairs (by default trace with ``rollout.expansion=streamed``, the paper's rule
and the default before 2026-12-07, ``barrier``, ``eager``, the default, and ``pipelined``, then grpo; every
``trace*`` arm that names no expansion runs streamed, as it did when its evidence was measured;
``--arms`` adds ``trace_eager_lag1`` (eager decided one turn after each prefix forms, the default before
round 14), ``trace_dense_fit``, the dense ``predictor.fit=adam`` of before, ``trace_tokens``, or the
diagnostics ``trace_leaf`` (per-leaf update rows), ``grpo_fit`` (GRPO that fits the predictor) and
``grpo_block128`` (vLLM-CPU's own 128-token KV block instead of the default 32; each run's mean
``prefix_cache_hit_rate`` is reported); one
after another, so load drifts hit every arm alike, the order rotating by one arm each pair, after one
discarded warm-up run that pays the process's imports and first model build) of ``cpu_demo``
runs on the mixed-difficulty games (``bench_policies --task mixed``) at equal generated tokens per step
(``rollout.token_budget``), one compute thread each, without evaluation. Per run: the mean step wall
time (rollout + train), its phases (``trace_train.run.step_metrics``' timing breakdown) and the
tokens generated per step (its wave's, ``wave_tokens``: under ``pipelined`` this step's bare rollouts and
the previous step's continuations; the tokens trained are ``trained_tokens``, with their
``stale_token_share``), its generation waves (``generation_polls``) and, streamed and eager, when its
continuations were placed (``trace_train.run.step_metrics.PLACEMENTS``), leaving out the first step
(warm-up; under ``pipelined`` the pipeline fill) and, under ``pipelined``, the last (it drains the
pipeline: continuations only); reported: each policy's mean over pairs,
the ratio to GRPO (mean of the per-pair ratios ± its standard error), the same per generated token (a
run's step seconds over its tokens per step, against its pair's GRPO run: the budget is met to within a
few tokens, not exactly) and the load average.

``--task`` picks the games (``TASKS``: ``mixed``, the default; ``cpu_demo``, the preset's own rows;
``guess_games``, 1-8 guesses as in ``bench.barrier``). The **whole-step table** that follows gives, per
arm, medians over runs of each run's median over its steps: the whole step (rollout + train) and per
1,000 generated tokens, the update (``update_seconds``), its forwarded tokens (``train_forward_tokens``)
and milliseconds per 1,000 of them, the rollout and its generation time, the prediction and the fit
(wall; ``fit wait``: how long the step waited for it after the update, 0 where it ran entirely beside
the update); and per-pair ratios to GRPO (mean ± SE) of the step per generated token and of the update
per forwarded token. Every run records the load average at its start; the JSON holds every run.
``--pool FILE...`` pools ``--compare`` files of one commit and measurement (:func:`pool_runs`: per seed,
then over seeds); one run of 6 pairs does not resolve 5% on a machine whose speed drifts between runs.
``--heap glibc`` runs every arm with glibc's default heap thresholds instead of the trainer's
(``trace_train.run.malloc``: freed memory kept in the heap on CPU), to measure what that buys.

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
from ..run.malloc import leave_glibc_defaults
from ..run.metrics_log import read_metrics
from ..run.step_metrics import PLACEMENTS
from ..train import TrainConfig, main as train

MIXED_ROWS = "{low: 1, highs: [2, 6, 64], max_guesses: 3}"  # bench_policies.TASKS["mixed"]
PHASES = ("predict_seconds", "allocation_seconds", "bare_generation_seconds", "expansion_generation_seconds",
          "prepare_seconds", "update_seconds", "sync_seconds", "fit_wait_seconds", "predictor_fit_seconds",
          "predictor_fit_cpu_seconds")
STREAMED = "rollout.expansion=streamed"  # arms named before eager became the default keep what they measured
ARMS = {"trace": ["rollout.policy=trace", STREAMED],
        "trace_barrier": ["rollout.policy=trace", "rollout.expansion=barrier"],
        "trace_eager": ["rollout.policy=trace", "rollout.expansion=eager"],
        "trace_eager_lag1": ["rollout.policy=trace", "rollout.expansion=eager", "rollout.eager_lag=1"],
        "trace_pipelined": ["rollout.policy=trace", "rollout.expansion=pipelined"],
        "trace_dense_fit": ["rollout.policy=trace", STREAMED, "predictor.fit=adam"],
        "trace_tokens": ["rollout.policy=trace_tokens", STREAMED], "grpo": ["rollout.policy=grpo"],
        # diagnostics: TRACE with per-leaf rows (what tree packing costs or saves the update), and GRPO
        # fitting the predictor it never reads (what the fit's thread costs a step beside the update)
        "trace_leaf": ["rollout.policy=trace", STREAMED, "algorithm.packing=leaf"],
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


TASKS = {"mixed": [f"task.rows={MIXED_ROWS}"], "cpu_demo": [],
         "guess_games": ["task.rows={low: 1, highs: [2, 6, 64], max_guesses: [1, 2, 4, 8]}",
                         "rollout.limits.max_turns=8"]}
"""The games of ``--compare``: ``mixed`` (3 guesses, ranges 2-64, the default), ``cpu_demo`` (the preset's
own rows) and ``guess_games`` (1-8 guesses, ranges 2-64: ``bench.barrier``'s games)."""
RUN_KEYS = ("step_seconds", "rollout_seconds", "train_seconds", "generation_seconds", "update_seconds",
            "update_ms_per_1k_forward_tokens", "train_forward_tokens", "step_seconds_per_1k_tokens")
"""Per-step quantities of which a run reports the median over its steps (``median_<key>``)."""


def measure_arm(arm: str, pair: int, steps: int, token_budget: int, backend: str, root: Path,
                task: str = "mixed") -> dict:
    """One run of an arm of ``--compare``: mean step seconds and phases over steps 2..steps, and the
    medians over the same steps of the whole step (rollout + train), its rollout, generation and update,
    the update's forwarded tokens and its milliseconds per 1,000 of them."""
    run_dir = root / f"{arm}-{pair}"
    load = os.getloadavg()[0]
    cfg = load_config(TrainConfig, "cpu_demo", [
        f"run_dir={run_dir}", f"seed={pair}", f"steps={steps}", "eval.every=0", "tensorboard=false",
        f"checkpoint_every={steps}", *TASKS[task], f"rollout.token_budget={token_budget}",
        f"backend.kind={backend}", "backend.threads=1", *ARMS[arm]])
    train(cfg)
    rows = read_metrics(run_dir / "metrics.jsonl")[1:]  # less the warm-up step (no evaluation rows)
    if cfg.rollout.expansion == "pipelined":  # less the last step too: it drains the pipeline (no bare rollouts)
        rows = rows[:-1]
    for r in rows:
        r["step_seconds"] = r["rollout_seconds"] + r["train_seconds"]
        r["update_ms_per_1k_forward_tokens"] = 1e6 * r["update_seconds"] / max(r["train_forward_tokens"], 1.0)
        r["step_seconds_per_1k_tokens"] = 1e3 * r["step_seconds"] / max(r.get("wave_tokens", r["generated_tokens"]), 1.0)
    out = {"arm": arm, "pair": pair, "task": task, "load_before": load,
           "step_seconds": float(np.mean([r["step_seconds"] for r in rows])),
           "generated_tokens": float(np.mean([r.get("wave_tokens", r["generated_tokens"]) for r in rows])),
           "trained_tokens": float(np.mean([r["generated_tokens"] for r in rows])),
           "stale_token_share": float(np.mean([r.get("stale_token_share", 0.0) for r in rows])),
           "prefix_cache_hit_rate": float(np.mean([r.get("prefix_cache_hit_rate", 0.0) for r in rows])),
           # the step's depth in generation waves and its turns: per-wave costs scale with the first
           "generation_polls": float(np.mean([r.get("generation_polls", 0.0) for r in rows])),
           "turns": float(np.mean([r.get("turns", 0.0) for r in rows]))}
    out.update({k: float(np.mean([r.get(k, 0.0) for r in rows])) for k in PHASES})
    # streamed and eager: when continuations were placed (what starts at a rollout's end adds waves)
    out.update({k: float(np.mean([r.get(k, 0.0) for r in rows])) for k in PLACEMENTS if any(k in r for r in rows)})
    out.update({f"median_{k}": float(np.median([r.get(k, 0.0) for r in rows])) for k in RUN_KEYS})
    return out


WARMUP_STEPS = 3
"""Steps of ``--compare``'s discarded warm-up run (the first is dropped as in every run; two remain)."""


def pair_order(arms: tuple, pair: int) -> tuple:
    """The order of the arms in ``pair``: rotated by one each pair, so that no arm always runs first (after
    a run of another arm's shape) or last (when the load drifts within a pair)."""
    shift = pair % len(arms)
    return arms[shift:] + arms[:shift]


def compare(pairs: int, steps: int, token_budget: int, backend: str, arms=DEFAULT_ARMS, task: str = "mixed",
            warm: bool = True) -> dict:
    """Interleaved pairs of every arm and GRPO (module docstring), after a discarded warm-up run of the first
    arm (``warm``; its seed, ``pairs``, is none of the pairs'), the arms' order rotating from pair to pair
    (:func:`pair_order`); the summary per arm: means over runs,
    ``whole_step`` (medians over runs of each run's median step quantities, ``RUN_KEYS``) and the per-pair
    ratios to GRPO (mean ± standard error) of the step, the step per generated token and the update per
    forwarded token."""
    results: list[dict] = []
    load_before = os.getloadavg()
    arms = tuple(dict.fromkeys((*arms, "grpo")))  # GRPO is the reference
    with tempfile.TemporaryDirectory() as tmp:
        # A discarded warm-up run first: the first run of a process pays the imports, the first model
        # build and the back end's start-up, which would otherwise land on the first arm of pair 0.
        warmup = measure_arm(arms[0], pairs, WARMUP_STEPS, token_budget, backend, Path(tmp), task) if warm else None
        for pair in range(pairs):
            for arm in pair_order(arms, pair):
                results.append(measure_arm(arm, pair, steps, token_budget, backend, Path(tmp), task))
                print(json.dumps(results[-1]), flush=True)
    by = {arm: [r for r in results if r["arm"] == arm] for arm in arms}
    grpo = np.array([r["step_seconds"] for r in by["grpo"]])
    grpo_per_token = grpo / np.array([r["generated_tokens"] for r in by["grpo"]])
    lines = ["| arm | step s | ratio to GRPO (± SE) | per token (± SE) | tokens / step | predict | allocation | bare gen "
             "| expansion gen | update | sync | fit wait | fit (wall) | fit CPU-s |", "|---" * 14 + "|"]
    summary = {"backend": backend, "task": task, "pairs": pairs, "steps": steps, "token_budget": token_budget,
               "load_average_before": load_before}
    grpo_update = np.array([r.get("median_update_ms_per_1k_forward_tokens", np.nan) for r in by["grpo"]])
    for arm, rows in by.items():
        ratio = np.array([r["step_seconds"] for r in rows]) / grpo
        per_token = np.array([r["step_seconds"] / r["generated_tokens"] for r in rows]) / grpo_per_token
        mean = {k: float(np.mean([r.get(k, 0.0) for r in rows]))
                for k in ("step_seconds", "generated_tokens", "trained_tokens", "stale_token_share",
                          "prefix_cache_hit_rate", "generation_polls", "turns", *PHASES,
                          *(k for k in PLACEMENTS if any(k in r for r in rows)))}
        se, token_se = _se(ratio), _se(per_token)
        update = np.array([r.get("median_update_ms_per_1k_forward_tokens", np.nan) for r in rows]) / grpo_update
        whole = {k: float(np.median([r.get(f"median_{k}", np.nan) for r in rows])) for k in RUN_KEYS}
        whole["generation_share_of_rollout"] = whole["generation_seconds"] / max(whole["rollout_seconds"], 1e-12)
        summary[arm] = {**mean, "ratio_to_grpo": float(ratio.mean()), "ratio_se": se,
                        "per_token_ratio_to_grpo": float(per_token.mean()), "per_token_ratio_se": token_se,
                        "update_per_forward_token_ratio_to_grpo": float(update.mean()),
                        "update_per_forward_token_ratio_se": _se(update), "whole_step": whole}
        lines.append(f"| {arm} | {mean['step_seconds']:.3f} | {ratio.mean():.2f} ± {se:.2f} | "
                     f"{per_token.mean():.2f} ± {token_se:.2f} | {mean['generated_tokens']:.0f} | " + " | ".join(
                         f"{mean[k]:.3f}" for k in ("predict_seconds", "allocation_seconds", "bare_generation_seconds",
                                                    "expansion_generation_seconds", "update_seconds", "sync_seconds",
                                                    "fit_wait_seconds", "predictor_fit_seconds",
                                                    "predictor_fit_cpu_seconds")) + " |")
    summary["load_average"] = os.getloadavg()
    summary["runs"] = results
    summary["warmup_run"] = warmup  # not in any statistic
    print("\n".join(lines))
    print(whole_step_table(summary, tuple(by)))
    print(f"load average: {summary['load_average']}")
    return summary


def whole_step_table(summary: dict, arms) -> str:
    """The whole-step table: medians per step and the per-pair ratios to GRPO."""
    lines = ["| arm | step s | per 1k tokens | ratio per token (± SE) | update s | forwarded tokens | update ms "
             "per 1k fwd | update ratio per fwd token (± SE) | rollout s | generation s | predict s | fit s |",
             "|---" * 12 + "|"]
    for arm in arms:
        s, w = summary[arm], summary[arm]["whole_step"]
        lines.append(f"| {arm} | {w['step_seconds']:.3f} | {w['step_seconds_per_1k_tokens']:.3f} | "
                     f"{s['per_token_ratio_to_grpo']:.3f} ± {s['per_token_ratio_se']:.3f} | {w['update_seconds']:.3f} | "
                     f"{w['train_forward_tokens']:.0f} | {w['update_ms_per_1k_forward_tokens']:.1f} | "
                     f"{s['update_per_forward_token_ratio_to_grpo']:.3f} ± {s['update_per_forward_token_ratio_se']:.3f} | "
                     f"{w['rollout_seconds']:.3f} | {w['generation_seconds']:.3f} | {s['predict_seconds']:.3f} | "
                     f"{s['predictor_fit_seconds']:.3f} |")
    return "\n".join(lines)


POOLED_FIELDS = ("backend", "task", "steps", "token_budget", "heap", "commit", "dirty")
"""What the files of :func:`pool_runs` must share: the same measurement of the same code."""


def pair_ratios(summary: dict, arm: str) -> dict[int, tuple[float, float]]:
    """Pair -> (step per generated token, update per forwarded token) of ``arm``'s run over its pair's GRPO run,
    from a ``--compare`` file's ``runs``."""
    runs = {(r["arm"], r["pair"]): r for r in summary["runs"]}
    out = {}
    for (name, pair), r in sorted(runs.items()):
        g = runs.get(("grpo", pair))
        if name != arm or g is None:
            continue
        step = (r["step_seconds"] / r["generated_tokens"]) / (g["step_seconds"] / g["generated_tokens"])
        update = r["median_update_ms_per_1k_forward_tokens"] / g["median_update_ms_per_1k_forward_tokens"]
        out[pair] = (float(step), float(update))
    return out


def pool_runs(summaries: list[dict], names: list[str]) -> dict:
    """Several ``--compare`` files of one measurement (:data:`POOLED_FIELDS`) as one: each arm's per-pair
    ratios to GRPO (per generated token; the update per forwarded token), averaged per pair seed over the
    files that ran it (a seed fixes the games, so a seed measured twice is one workload measured twice),
    then mean ± standard error over the seeds. Every file's own estimate is kept beside the pooled one.
    ``ValueError`` naming the files and the field when they differ."""
    if not summaries:
        raise ValueError("--pool needs at least one --compare file")
    for name, s in zip(names, summaries):
        missing = [k for k in (*POOLED_FIELDS, "runs") if k not in s]
        if missing:
            raise ValueError(f"{name} is not a --compare file of this version: it has no {', '.join(missing)}")
    for name, s in zip(names[1:], summaries[1:]):
        for key in POOLED_FIELDS:
            if s[key] != summaries[0][key]:
                raise ValueError(f"{names[0]} and {name} differ in {key} ({summaries[0][key]!r} against "
                                 f"{s[key]!r}): only runs of one measurement of one commit pool")
    arms = [a for a in dict.fromkeys(r["arm"] for s in summaries for r in s["runs"]) if a != "grpo"]
    pooled = {}
    for arm in arms:
        by_seed: dict[int, list[tuple[float, float]]] = {}
        for s in summaries:
            for pair, ratios in pair_ratios(s, arm).items():
                by_seed.setdefault(pair, []).append(ratios)
        seeds = sorted(by_seed)
        step = np.array([np.mean([r[0] for r in by_seed[k]]) for k in seeds])
        update = np.array([np.mean([r[1] for r in by_seed[k]]) for k in seeds])
        pooled[arm] = {"per_token_ratio_to_grpo": float(step.mean()), "per_token_ratio_se": _se(step),
                       "update_per_forward_token_ratio_to_grpo": float(update.mean()),
                       "update_per_forward_token_ratio_se": _se(update), "seeds": len(seeds),
                       "pairs": sum(len(v) for v in by_seed.values()),
                       "per_seed": [{"seed": k, "per_token_ratio": float(a), "update_ratio": float(b),
                                     "measurements": len(by_seed[k])} for k, a, b in zip(seeds, step, update)]}
    files = [{"file": name, "pairs": s.get("pairs"), "load_average_before": s.get("load_average_before"),
              "load_average": s.get("load_average"),
              **{arm: {k: s[arm][k] for k in ("per_token_ratio_to_grpo", "per_token_ratio_se",
                                              "update_per_forward_token_ratio_to_grpo")} for arm in arms if arm in s}}
             for name, s in zip(names, summaries)]
    return {**{k: summaries[0][k] for k in POOLED_FIELDS}, "files": files, "pooled": pooled}


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
    parser.add_argument("--task", default="mixed", choices=sorted(TASKS), help="the games of --compare")
    parser.add_argument("--json", type=Path, default=None, help="also write --compare's summary to this file")
    parser.add_argument("--pool", type=Path, nargs="+", default=None, metavar="FILE",
                        help="pool these --compare files of one commit and measurement (pool_runs) and print it")
    parser.add_argument("--heap", default="kept", choices=("kept", "glibc"),
                        help="kept: the trainer keeps freed memory in its heap on CPU (run.malloc); glibc: its "
                             "defaults, for every run of this process")
    args = parser.parse_args(argv)
    record = origin("trace_train.bench.fit", argv)
    if args.pool:
        pooled = pool_runs([json.loads(p.read_text()) for p in args.pool], [str(p) for p in args.pool])
        for arm, row in pooled["pooled"].items():
            print(f"{arm}: per generated token {row['per_token_ratio_to_grpo']:.3f} ± {row['per_token_ratio_se']:.3f} "
                  f"GRPO's ({row['seeds']} seeds, {row['pairs']} pairs); update per forwarded token "
                  f"{row['update_per_forward_token_ratio_to_grpo']:.3f} ± {row['update_per_forward_token_ratio_se']:.3f}")
        if args.json is not None:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            by = {k: record[k] for k in ("commit", "dirty", "command")}  # the files' commit is the measured code's
            args.json.write_text(json.dumps({**record, "pooled_by": by, **pooled}, indent=1) + "\n")
        return pooled
    if args.heap == "glibc":
        leave_glibc_defaults()
    if args.compare:
        summary = {"heap": args.heap,
                   **compare(args.pairs, args.steps, args.token_budget, args.backend, args.arms, args.task)}
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
