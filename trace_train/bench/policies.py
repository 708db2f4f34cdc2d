"""TRACE against GRPO and other policies at equal generated tokens, each at its own best learning rate, on
paired seeds, with confidence intervals: is TRACE's lead significant?

    python -m trace_train.bench.policies                         # the full benchmark (see docs/results.md for time)
    python -m trace_train.bench.policies --policies trace grpo --lrs 1e-3 2e-3 --tuning-seeds 100 \\
        --seeds 0 1 --steps 4 --eval-every 2 --token-budget 300 --out runs/bench_small  # a reduced run
    python -m trace_train.bench.policies --task uniform          # games of about equal difficulty
    python -m trace_train.bench.policies --task chain_sum --policies trace grpo dapo --protocol \\
        --seeds fresh:24 --experiment chain-sum-1 --eval-prompts 128 --eval-samples 4  # a registered report run

Every run is the ``cpu_demo`` preset (tiny Qwen3, transformers back end) with the same generated-token
budget per step (``rollout.token_budget``: the engine sizes M so that each step generates about that
many tokens, whatever the policy) and the same held-out prompts. Two stages:

1. **Sweep.** Each policy runs at every learning rate of ``--lrs`` on the ``--tuning-seeds``; its best
   rate is the one with the largest mean gain in held-out success (end minus start). These seeds are
   never reported.
2. **Report.** Each policy runs at its best rate, and at the shared rate ``--shared-lr`` (the preset's),
   on the ``--seeds``: the same seeds, hence the same games, initial model and held-out prompts for every
   policy, so differences are paired by seed.

Reported per policy: held-out success at the start and at the end (mean of the last two evaluations),
the gain, the gain at equal training time (each seed's runs read over the same two-evaluation window as the
gain, placed at the training seconds of the seed's shortest run's last two evaluations, interpolated:
wall clock as the budget, not only tokens), the batches' contrast yield (mixed prompts per 1,000 rollouts and per 1,000 generated tokens,
which filtering cannot inflate) and effective ratio, tokens and minutes; then TRACE minus each other
policy, paired by seed, with a 95% confidence interval (Student t) and a paired t-test, and one line
each saying whether TRACE's lead is significant at equal tokens and at equal training time.

**The protocol** (``trace_train.bench.protocol``), for a report run (``--protocol``), is fixed before the
runs and written to ``OUT/TASK/protocol.json``; a later invocation that differs in any field stops with one
line naming it:

* report seeds drawn fresh per experiment (``--seeds fresh:N --experiment NAME``: a hash of task, arms and
  name picks N seeds clear of the tuning seeds and of the seeds 0-199 of every earlier run);
* each arm's learning rate swept on the tuning seeds, which are never reported;
* N from a power analysis of a pilot (``python -m trace_train.bench.protocol --pilot OUT/TASK --effect D``:
  a paired t-test's N for the difference D, at least 24);
* evaluation sized before seeds are added (``--eval-prompts``, ``--eval-samples``: its sampling noise
  should lie below the spread between seeds);
* the primary comparison named in advance (``--primary trace grpo``: gain at equal tokens, tested
  unadjusted at ``--alpha``); every other comparison (the reference against each other arm, each TRACE
  variant against each other arm, every pair at equal training time: the second reading) with a
  Holm-adjusted p-value. The shared-rate stage is exploratory and outside the protocol.

The summary (and the evidence copy) holds the protocol, ``per_seed`` rows (every run: seed, arm, rate,
stage and each metric, including mixed prompts and contrast pairs per second of training), every
comparison recomputed from those rows, and a one-sentence ``verdict``; ``python -m trace_train.bench.pool``
pools experiments from their rows.

Resumable: each run writes ``result.json`` in its directory when it finishes; a rerun skips finished
runs (the trainer resumes unfinished ones from their last checkpoint) and recomputes the summary from
the result files alone. Too slow for CI: run it by hand.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time
from pathlib import Path

import numpy as np

from . import origin, protocol
from ..config_loader import load_config
from ..child_python import spawn_pool
from ..run.metrics_log import read_metrics
from ..train import TrainConfig, main as train

DEFAULT_POLICIES = ("trace", "grpo", "dapo", "random_prefix")
YIELDS = ("mixed_prompts_per_1k_rollouts", "mixed_prompts_per_1k_tokens", "contrast_pairs_per_1k_rollouts")

_RG = ["task.rows={}", "model.tiny_warm_steps=200", "rollout.limits.max_turns=1", "rollout.limits.max_turn_tokens=16"]

TASKS = {
    "uniform": ["task.rows={low: 1, high: 6, max_guesses: 3, shift: 11}"],
    "mixed": ["task.rows={low: 1, highs: [2, 6, 64], max_guesses: 3, shift: 11}"],
    "aiw": ["task.name=reasoning_gym", "task.env={dataset: aiw, levels: [0, 1]}", *_RG],
    "family_relationships": ["task.name=reasoning_gym", "task.env={dataset: family_relationships, levels: [0]}", *_RG,
                             "task.eval_size=128", "eval.prompts=128", "eval.samples=4"],
    "chain_sum": ["task.name=reasoning_gym", "task.env={dataset: chain_sum, levels: [0, 1]}", *_RG],
    "frozen_lake": ["task.name=textarena", "task.env={env_id: [FrozenLake-v0, FrozenLake-v0-hardcore]}", "task.rows={}",
                    "model.tiny_warm_steps=200", "rollout.limits.max_turns=10", "rollout.limits.max_turn_tokens=8"],
    "key_lock": ["task.name=key_lock", "task.rows={keys: [2, 4, 8]}", "model.tiny_warm_steps=200",
                 "rollout.limits.max_turns=2", "rollout.limits.max_turn_tokens=8"],
}
"""Tasks, as overrides of the ``cpu_demo`` preset. Guess-the-number's difficulty mixes: ``uniform`` (every
prompt about equally hard) and ``mixed`` (a third of the prompts almost always solved, a third almost never,
as in real RL data sets); each row's range shifts by up to 11, so held-out games are ranges never trained on.
Testbeds no one here wrote (``trace_train.bench.testbeds`` measures where the warmed tiny model starts):
reasoning-gym's ``aiw`` (levels 0-1), ``family_relationships`` (level 0) and ``chain_sum`` (levels 0-1), one
answer per rollout; textarena's FrozenLake (4x4 and 5x5 maps mixed), one move a turn. ``family_relationships``
(the decisive experiment's testbed) evaluates on 128 held-out prompts x 4 samples, so an evaluation's noise
(SE about 0.02) is below the spread of the per-seed differences."""


ARM_FORM = "POLICY[+PREDICTOR_KIND][@EXPANSION][:ROLLOUT_FIELD=VALUE...]"


def arm(policy: str) -> tuple[str, str | None, str | None]:
    """``POLICY[+KIND][@EXPANSION][:FIELD=VALUE...]`` -> (policy, predictor kind or None, expansion or None).

    ``trace+probe`` runs TRACE with ``predictor.kind=probe``; ``trace@eager`` runs it with
    ``rollout.expansion=eager`` (continuations committed at turn boundaries, a step one episode deep);
    ``trace@eager:eager_lag=1`` also sets ``rollout.eager_lag=1`` (:func:`rollout_fields`)."""
    head = policy.partition(":")[0]
    head, at, expansion = head.partition("@")
    name, plus, kind = head.partition("+")
    if (plus and not kind) or (at and not expansion) or not name:
        raise ValueError(f"an arm is {ARM_FORM}, got {policy!r}")
    rollout_fields(policy)
    return name, kind or None, expansion or None


def rollout_fields(policy: str) -> list[str]:
    """The ``:FIELD=VALUE`` parts of an arm, as ``rollout.FIELD=VALUE`` overrides."""
    _, colon, rest = policy.partition(":")
    parts = rest.split(":") if colon else []
    if any(not field or not value for field, _, value in (part.partition("=") for part in parts)):
        raise ValueError(f"an arm is {ARM_FORM}, got {policy!r}")
    return [f"rollout.{part}" for part in parts]


def arm_overrides(policy: str) -> list[str]:
    """The config overrides of an arm (:func:`arm`)."""
    name, kind, expansion = arm(policy)
    return [f"rollout.policy={name}", *([f"predictor.kind={kind}"] if kind else []),
            *([f"rollout.expansion={expansion}"] if expansion else []), *rollout_fields(policy)]


def is_variant(policy: str) -> bool:
    """A TRACE arm other than plain ``trace`` (another predictor kind or expansion): paired against every arm."""
    return policy != "trace" and arm(policy)[0] == "trace"


def run_dir(out: Path, task: str, policy: str, lr: float, seed: int) -> Path:
    return out / task / f"{policy}-lr{lr:g}-seed{seed}"


def eval_overrides(prompts: int | None = None, samples: int | None = None) -> list[str]:
    """``eval.prompts``/``eval.samples`` overrides for the sizes given (None: the task's own)."""
    return [*([f"eval.prompts={prompts}"] if prompts else []), *([f"eval.samples={samples}"] if samples else [])]


def run_one(
    out: Path, policy: str, seed: int, steps: int, token_budget: int, task: str = "mixed", lr: float = 1e-3,
    eval_every: int = 5, threads: int | None = None, eval_prompts: int | None = None,
    eval_samples: int | None = None,
) -> dict:
    """Train one (policy, learning rate, seed) unless its ``result.json`` says it finished; return the result.

    ``eval_prompts``/``eval_samples`` (None: the task's) size the held-out evaluation; a finished run that
    records another size is refused, not mixed in."""
    folder = run_dir(out, task, policy, lr, seed)
    done = folder / "result.json"
    asked = {"eval_prompts": eval_prompts, "eval_samples": eval_samples}
    if done.exists():
        result = json.loads(done.read_text())
        if result.get("steps") == steps and result.get("eval_every", 5) == eval_every:
            for key, value in asked.items():
                if value is not None and result.get(key, value) != value:
                    raise ValueError(f"{folder} was evaluated with {key}={result[key]}, this invocation asks "
                                     f"{value}: use another --out")
            missing = [*(("curve", "train_seconds") if "curve" not in result else ()),  # written before wall
                       *(k for k in ("rollouts", "mixed_prompts", "contrast_pairs") if k not in result)]  # clock or
            if missing and (folder / "metrics.jsonl").exists():  # the batch totals were reported: read the metrics
                read = run_result(read_metrics(folder / "metrics.jsonl"))
                result.update({k: read[k] for k in missing})
            return result
    cfg = load_config(TrainConfig, "cpu_demo", [
        f"run_dir={folder}", f"seed={seed}", f"steps={steps}", *arm_overrides(policy),
        f"rollout.token_budget={token_budget}", "tensorboard=false", f"checkpoint_every={min(steps, 10)}",
        "max_length_cut_share=1",  # a rate that collapses the model into over-long turns is scored, not stopped
        *TASKS[task], f"optim.lr={lr}", f"eval.every={eval_every}", *eval_overrides(eval_prompts, eval_samples),
        *([f"backend.threads={threads}"] if threads else []),
    ])
    start = time.perf_counter()
    share_warm_start(cfg, out / task / "warm_start" / f"seed{seed}", folder)
    train(cfg)
    try:
        result = run_result(read_metrics(folder / "metrics.jsonl"))
    except ValueError as err:  # e.g. a finished checkpoint whose metrics file was lost: rerunning resumes nothing
        raise ValueError(f"{folder}: {err}; delete the folder to rerun this run from scratch") from None
    result.update(policy=policy, lr=lr, seed=seed, steps=steps, task=task, eval_every=eval_every,
                  eval_prompts=cfg.eval.prompts, eval_samples=cfg.eval.samples,
                  minutes=round((time.perf_counter() - start) / 60, 2), load_average=round(os.getloadavg()[0], 1))
    partial = done.with_suffix(".partial")
    partial.write_text(json.dumps(result, indent=2) + "\n")
    partial.replace(done)
    return result


def share_warm_start(cfg: TrainConfig, shared: Path, folder: Path) -> None:
    """Give a run the tiny model its seed's other arms start from, built once per seed.

    The tiny model depends only on the seed and the task's rows and expert (``run.policy.model_path``), not
    on the arm or its learning rate, so every arm of a seed starts from the same warmed weights whether it
    builds them or copies them; building them once saves most of a short run's time (the warm start is
    longer than 30 training steps of a single-turn testbed). A lock keeps two workers from building the
    same seed's model at once; the copy lands under its final name in one rename."""
    if cfg.model.name_or_path != "tiny" or (folder / "tiny_model").exists():
        return
    import fcntl
    import shutil

    from ..run.policy import model_path
    from ..tasks import build_task

    shared.mkdir(parents=True, exist_ok=True)
    with open(shared / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        built = Path(model_path(cfg.model, shared, seed=cfg.seed,
                                task=build_task(cfg.task, seed=cfg.seed, hold_out=cfg.eval.every > 0)))
    folder.mkdir(parents=True, exist_ok=True)
    partial = folder / "tiny_model.copying"
    shutil.rmtree(partial, ignore_errors=True)
    shutil.copytree(built, partial)
    partial.replace(folder / "tiny_model")


def run_result(rows: list[dict]) -> dict:
    """Held-out success at the start and the end (mean of the last two evaluations), batch metrics, tokens,
    batch totals (``rollouts``, ``mixed_prompts``, ``contrast_pairs``) and the success curve against training
    seconds (``curve``: [seconds, success] at each evaluation, the
    seconds summed over the steps before it of ``rollout_seconds + train_seconds``: generation, allocation,
    prediction, the update and the weight sync; evaluations themselves are not counted)."""
    evals = [r["eval_success"] for r in rows if "eval_success" in r]
    if len(evals) < 2:
        raise ValueError(f"a run needs at least two evaluations (eval.every <= steps), found {len(evals)}")
    start, end = float(evals[0]), float(np.mean(evals[-2:]))
    out = {"success_start": start, "success_end": end, "gain": end - start}
    seconds, curve = 0.0, []
    for r in rows:
        seconds += float(r.get("rollout_seconds", 0.0)) + float(r.get("train_seconds", 0.0))
        if "eval_success" in r:
            curve.append([seconds, float(r["eval_success"])])
    out["curve"], out["train_seconds"] = curve, seconds
    for key in ("effective_ratio", *YIELDS):
        values = [r[key] for r in rows if key in r]
        out[key] = float(np.nanmean(values)) if values else float("nan")
    out["generated_tokens"] = float(sum(r.get("generated_tokens", 0.0) for r in rows))
    # totals of the batches (per-step rates times their denominators): contrast per second of training
    out["rollouts"] = float(sum(r.get("rollouts", 0.0) for r in rows))
    out["mixed_prompts"] = float(sum(r.get("mixed_prompts_per_1k_tokens", 0.0) * r.get("generated_tokens", 0.0)
                                     for r in rows if "mixed_prompts_per_1k_tokens" in r) / 1000)
    out["contrast_pairs"] = float(sum(r.get("contrast_pairs_per_1k_rollouts", 0.0) * r.get("rollouts", 0.0)
                                      for r in rows if "contrast_pairs_per_1k_rollouts" in r) / 1000)
    return out


def success_at(curve: list, seconds: float) -> float:
    """Held-out success after ``seconds`` of training, linear between evaluations (the last one past it)."""
    t, y = np.array(curve, dtype=float).reshape(-1, 2).T
    return float(np.interp(seconds, t, y))


def at_equal_time(results: list[dict]) -> list[dict]:
    """Each result with ``gain_at_equal_time``: its success read at the training seconds of the last two
    evaluations of its seed's shortest run (``equal_time_window``), averaged, minus its start.

    The same two-evaluation window as ``gain`` (the mean of a run's last two evaluations), placed on the
    clock of the run that finished first: for that run the two numbers coincide, and a policy whose steps
    cost more is read after fewer steps. Runs of one seed share games, model and held-out prompts. Wall
    clock is load-dependent: the runs of a comparison should share a machine (the benchmark runs the arms
    of a seed next to each other).
    """
    shortest: dict[int, dict] = {}
    timed = [r for r in results if "curve" in r]  # results of earlier versions without their metrics: left out
    for r in timed:
        if r["seed"] not in shortest or r["train_seconds"] < shortest[r["seed"]]["train_seconds"]:
            shortest[r["seed"]] = r
    out = []
    for r in results:
        if "curve" not in r:
            out.append(dict(r, equal_time_seconds=np.nan, gain_at_equal_time=np.nan))
            continue
        first = shortest[r["seed"]]
        window = [t for t, _ in first["curve"][-2:]]
        success = float(np.mean([success_at(r["curve"], t) for t in window]))
        out.append(dict(r, equal_time_seconds=first["train_seconds"], equal_time_window=window,
                        gain_at_equal_time=success - r["success_start"]))
    return out


def best_rates(results: list[dict]) -> dict[str, float]:
    """{policy: the learning rate with the largest mean gain} over the given (tuning) results; ties: smaller."""
    gains: dict[tuple[str, float], list[float]] = {}
    for r in results:
        gains.setdefault((r["policy"], r["lr"]), []).append(r["gain"])
    best: dict[str, tuple[float, float]] = {}
    for (policy, lr), values in sorted(gains.items(), key=lambda kv: kv[0][1]):
        mean = float(np.mean(values))
        if policy not in best or mean > best[policy][1]:
            best[policy] = (lr, mean)
    return {policy: lr for policy, (lr, _) in best.items()}


def at_grid_edge(rates: dict[str, float], lrs) -> list[str]:
    """Policies whose best rate is the largest or smallest of a grid of several: their optimum may lie
    outside it, so the comparison is best-on-the-grid, not best-against-best (widen ``--lrs``)."""
    if len(lrs) < 2:
        return []
    return [p for p, lr in rates.items() if lr in (min(lrs), max(lrs))]


def paired(results: list[dict], reference: str = "trace", metric: str = "gain") -> dict[str, dict]:
    """``reference`` minus each other policy, paired by seed: mean, 95% CI (Student t), t-test p-value."""
    by: dict[str, dict] = {}
    for r in results:
        by.setdefault(r["policy"], {})[r["seed"]] = r.get(metric, np.nan)
    out = {}
    for policy in by:
        gap = None if policy == reference else protocol.paired_difference(by.get(reference, {}), by[policy])
        if gap is not None:
            out[policy] = gap
    return out


def per_policy(results: list[dict]) -> dict[str, dict]:
    """Means over seeds of every reported number, per policy (``gain_stderr``: its standard error)."""
    out = {}
    for policy in dict.fromkeys(r["policy"] for r in results):
        rows = [r for r in results if r["policy"] == policy]
        keys = ("success_start", "success_end", "gain", "gain_at_equal_time", *YIELDS, "effective_ratio",
                "generated_tokens", "train_seconds", "minutes")
        entry = {k: _finite_mean([r.get(k, np.nan) for r in rows]) for k in keys}
        gains = [r["gain"] for r in rows]
        entry["gain_stderr"] = float(np.std(gains, ddof=1) / np.sqrt(len(gains))) if len(gains) > 1 else float("nan")
        entry.update(lr=rows[0]["lr"], seeds=len(rows))
        out[policy] = entry
    return out


def _finite_mean(values) -> float:
    """Mean of the finite values; nan (without a warning) when there are none."""
    values = np.asarray(values, dtype=float)
    values = values[np.isfinite(values)]
    return float(values.mean()) if values.size else float("nan")


def conclusion(gaps: dict[str, dict], against: str = "grpo", budget: str = "") -> str:
    """One line: is TRACE's lead over ``against`` significant (95% CI of the paired difference above 0)?"""
    gap = gaps.get(against)
    if gap is None:
        return f"no paired TRACE vs {against} runs"
    lo, hi = gap["ci95"]
    verdict = "significant" if lo > 0 else ("a significant deficit" if hi < 0 else "not significant")
    return (f"TRACE minus {against} in held-out success gain{budget}: {gap['mean']:+.3f} (95% CI {lo:+.3f} to "
            f"{hi:+.3f}, p = {gap['p_value']:.2f}, {gap['seeds']} paired seeds): {verdict}.")


def table(policies: dict[str, dict]) -> str:
    lines = ["| policy | lr | held-out success: start -> end | gain (± SE) | gain at equal time | "
             "mixed prompts / 1k rollouts | / 1k tokens | effective ratio | tokens | training s | minutes per run |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for policy, s in policies.items():
        lines.append(
            f"| {policy} | {s['lr']:g} | {s['success_start']:.3f} -> {s['success_end']:.3f} | {s['gain']:+.3f} ± "
            f"{s['gain_stderr']:.3f} | {s['gain_at_equal_time']:+.3f} | {s['mixed_prompts_per_1k_rollouts']:.1f} | "
            f"{s['mixed_prompts_per_1k_tokens']:.2f} | {s['effective_ratio']:.1%} | {s['generated_tokens']:,.0f} | "
            f"{s['train_seconds']:.0f} | {s['minutes']:.1f} |")
    return "\n".join(lines)


def run_all(out: Path, jobs: list[tuple[str, int, float]], workers: int = 1, **one) -> list[dict]:
    """``run_one`` for every (policy, seed, lr) job, in order; ``workers > 1``: that many processes at once,
    each with one compute thread (a tiny model on a 2-core machine trains about twice as fast as two
    single-thread runs side by side than as one two-thread run; results do not depend on the thread count)."""
    if workers <= 1:
        return [run_one(out, p, s, lr=lr, **one) for p, s, lr in jobs]
    one = {**one, "threads": 1}
    # Leaving the block for any reason (an error, Ctrl-C, SIGTERM: see `cli`) terminates the workers, so
    # no run goes on writing after the benchmark has stopped; finished runs are kept and a rerun resumes.
    with spawn_pool(workers) as pool:
        pending = [pool.apply_async(run_one, (out, p, s), dict(lr=lr, **one)) for p, s, lr in jobs]
        return [job.get() for job in pending]


def benchmark(args) -> dict:
    """Sweep on the tuning seeds, then report at the best and at the shared rate; the summary as a dict."""
    start = time.perf_counter()
    one = dict(steps=args.steps, token_budget=args.token_budget, task=args.task, eval_every=args.eval_every,
               workers=getattr(args, "workers", 1), eval_prompts=getattr(args, "eval_prompts", None),
               eval_samples=getattr(args, "eval_samples", None))
    rows: list[dict] = []
    if getattr(args, "rates", None):  # rates chosen by an earlier sweep: no sweep here
        rates = {p: args.rates.get(p, args.lrs[0]) for p in args.policies}
    elif len(args.lrs) > 1:  # one rate needs no sweep
        tuning = run_all(args.out, [(p, s, lr) for s in args.tuning_seeds for lr in args.lrs for p in args.policies],
                         **one)
        rates = best_rates(tuning)
        for lr in args.lrs:  # equal time within each rate of the sweep
            rows += protocol.per_seed_rows(at_equal_time([r for r in tuning if r["lr"] == lr]), "tuning")
    else:
        rates = {p: args.lrs[0] for p in args.policies}
    summary = {"task": args.task, "steps": args.steps, "token_budget": args.token_budget,
               "eval_every": args.eval_every, "lrs": list(args.lrs),
               "tuning_seeds": list(args.tuning_seeds), "seeds": list(args.seeds), "best_lr": rates,
               "rates_given": dict(getattr(args, "rates", None) or {}),
               "best_at_grid_edge": at_grid_edge(rates, args.lrs)}
    for name, lr_of in (("best", rates), ("shared", {p: args.shared_lr for p in args.policies})):
        if name == "shared" and args.shared_lr is None:
            continue
        results = at_equal_time(run_all(args.out, [(p, s, lr_of[p]) for s in args.seeds for p in args.policies],
                                        **one))
        rows += protocol.per_seed_rows(results, "report" if name == "best" else "shared")
        gaps, timed = paired(results), paired(results, metric="gain_at_equal_time")
        unadjusted = " Unadjusted: the protocol's reading, Holm-adjusted, is in `comparisons` and `verdict`."
        summary[name] = {"policies": per_policy(results), "trace_minus": gaps, "conclusion": conclusion(gaps) + unadjusted,
                         "trace_minus_at_equal_time": timed,
                         "conclusion_at_equal_time": conclusion(timed, budget=" at equal training time") + unadjusted}
        variants = [p for p in args.policies if is_variant(p)]  # TRACE with another predictor kind or expansion
        if variants:
            summary[name]["variants_minus"] = {v: paired(results, reference=v) for v in variants}
            summary[name]["variants_minus_at_equal_time"] = {
                v: paired(results, reference=v, metric="gain_at_equal_time") for v in variants}
    plan = getattr(args, "plan", None) or plan_protocol(args)
    summary.update(protocol.evidence_part(rows, plan))
    summary["eval_size_mismatch"] = protocol.eval_size_mismatch(rows, plan)
    summary["minutes_this_invocation"] = round((time.perf_counter() - start) / 60, 1)
    summary["load_average"] = round(os.getloadavg()[0], 1)
    return summary


def plan_protocol(args) -> dict:
    """The protocol of an invocation (``trace_train.bench.protocol.make_protocol``), from its arguments."""
    reference, against = getattr(args, "primary", None) or ("trace", "grpo")
    trace_arms = [p for p in args.policies if arm(p)[0] == "trace" and p != reference]  # each against every arm
    primary, secondary = protocol.comparison_plan(args.policies, reference, against, trace_arms)
    cfg = load_config(TrainConfig, "cpu_demo", [*TASKS[args.task], *eval_overrides(
        getattr(args, "eval_prompts", None), getattr(args, "eval_samples", None))])
    return protocol.make_protocol(
        task=args.task, arms=args.policies, primary=primary, secondary=secondary, tuning_seeds=args.tuning_seeds,
        seeds=args.seeds, seed_source=getattr(args, "seed_source", "given"), experiment=getattr(args, "experiment", ""),
        lrs=args.lrs, shared_lr=args.shared_lr, rates_given=getattr(args, "rates", None) or {}, steps=args.steps,
        token_budget=args.token_budget, eval_every=args.eval_every, eval_prompts=cfg.eval.prompts,
        eval_samples=cfg.eval.samples, alpha=getattr(args, "alpha", protocol.ALPHA))


def _rate_or_none(text: str) -> float | None:
    """``--shared-lr``: a positive rate, or ``none``."""
    if text.lower() == "none":
        return None
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive rate or 'none', got {text!r}")
    return value


def _policy_rate(text: str) -> tuple[str, float]:
    """``POLICY=LR`` (``--rates``) -> (policy, rate)."""
    policy, sep, rate = text.partition("=")
    try:
        value = float(rate)
    except ValueError:
        value = float("nan")
    if not sep or not policy or not value > 0:
        raise argparse.ArgumentTypeError(f"expected POLICY=LR with a positive rate, got {text!r}")
    return policy, value


def _exit_on_sigterm(signum, frame):
    raise SystemExit(128 + signum)


def cli(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policies", nargs="+", default=list(DEFAULT_POLICIES),
                        help="policies to run (without trace: each policy's own numbers, no paired differences); "
                             "POLICY+KIND runs POLICY with predictor.kind=KIND (trace+probe, trace+running_mean), "
                             "POLICY@EXPANSION with rollout.expansion=EXPANSION (trace@eager), a suffix "
                             ":FIELD=VALUE sets rollout.FIELD (trace@eager:eager_lag=1), and each such "
                             "TRACE arm is also paired against every other arm")
    parser.add_argument("--lrs", nargs="+", type=float, default=[5e-4, 1e-3, 2e-3, 4e-3, 8e-3],
                        help="learning-rate grid")
    parser.add_argument("--shared-lr", type=_rate_or_none, default=1e-3,
                        help="the shared rate (the preset's); 'none' runs no shared-rate stage")
    parser.add_argument("--rates", nargs="+", type=_policy_rate, default=None, metavar="POLICY=LR",
                        help="each policy's rate as chosen by an earlier sweep (no sweep; a policy not named "
                             "runs at the first of --lrs); the summary records them under rates_given")
    parser.add_argument("--tuning-seeds", nargs="+", type=int, default=[100, 101])
    parser.add_argument("--seeds", nargs="+", type=protocol.seed_spec, default=list(range(8)),
                        help="report seeds (paired), or fresh:N: N seeds drawn from a hash of the experiment "
                             "(task, arms, --experiment), clear of the tuning seeds and of seeds 0-199")
    parser.add_argument("--experiment", default="", help="the experiment's name, for fresh:N seeds")
    parser.add_argument("--protocol", action="store_true",
                        help="a report run: write OUT/TASK/protocol.json before any run, and refuse to go on "
                             "if the one there differs")
    parser.add_argument("--primary", nargs=2, default=["trace", "grpo"], metavar=("REFERENCE", "AGAINST"),
                        help="the primary comparison (gain at equal tokens, unadjusted); REFERENCE is also "
                             "the reference of the secondaries (Holm-adjusted)")
    parser.add_argument("--alpha", type=float, default=protocol.ALPHA, help="significance level")
    parser.add_argument("--eval-prompts", type=int, default=None, help="held-out prompts (default: the task's)")
    parser.add_argument("--eval-samples", type=int, default=None,
                        help="held-out samples per prompt (default: the task's)")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--token-budget", type=int, default=600, help="generated tokens per step")
    parser.add_argument("--eval-every", type=int, default=5, help="steps between held-out evaluations")
    parser.add_argument("--task", choices=sorted(TASKS), default="mixed", help="the task (guess-the-number's difficulty mixes, or a testbed)")
    parser.add_argument("--out", type=Path, default=Path("runs/bench_policies"))
    parser.add_argument("--evidence", type=Path, default=None,
                        help="also copy summary.json to EVIDENCE/<task>.json (default: benchmarks/learning, "
                             "the tracked evidence docs/results.md cites, when --out is the default; 'none' disables)")
    parser.add_argument("--workers", type=int, default=1,
                        help="runs at once, one compute thread each (2 on a 2-core machine halves the time)")
    args = parser.parse_args(argv)
    record = origin("trace_train.bench.policies", argv)
    args.rates = dict(args.rates) if args.rates else None
    for policy in args.policies:
        try:
            load_config(TrainConfig, "cpu_demo", arm_overrides(policy))
        except ValueError as err:
            parser.error(f"--policies {policy}: {err}")
    fresh = [s for s in args.seeds if isinstance(s, str)]
    if fresh and len(args.seeds) > 1:
        parser.error("--seeds fresh:N stands alone")
    args.seed_source = "given"
    if fresh:
        args.seeds = protocol.fresh_seeds(int(fresh[0].partition(":")[2]), task=args.task, arms=args.policies,
                                          experiment=args.experiment, avoid=args.tuning_seeds)
        args.seed_source = f"{fresh[0]} (experiment {args.experiment!r})"
        print(f"report seeds drawn fresh for experiment {args.experiment!r}: {' '.join(map(str, args.seeds))}")
    if set(args.tuning_seeds) & set(args.seeds):
        parser.error("--tuning-seeds and --seeds must differ (rates are chosen on seeds that are not reported)")
    if args.protocol and not set(args.primary) <= set(args.policies):
        parser.error(f"--primary {' '.join(args.primary)}: both arms must be among --policies")
    try:
        args.plan = plan_protocol(args)
    except ValueError as err:  # e.g. --eval-samples 1
        parser.error(str(err))
    if args.protocol:
        try:
            registered = protocol.register(args.out / args.task, args.plan)
        except protocol.ProtocolError as err:
            parser.error(str(err))
        record["protocol_registration"] = {k: json.loads(registered.read_text())[k] for k in protocol.REGISTRATION}
        print(f"protocol registered in {registered}")
    previous = signal.signal(signal.SIGTERM, _exit_on_sigterm)  # unwinds `run_all`, which stops its workers
    try:
        summary = benchmark(args)
    finally:  # called in-process (tests), the caller keeps its own handler: one left behind was inherited
        signal.signal(signal.SIGTERM, previous)  # by later forked pool workers and held `Pool.terminate`
    path = args.out / args.task / "summary.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**record, **summary}, indent=2) + "\n")
    default_out = args.out == Path("runs/bench_policies")
    evidence = args.evidence or (Path("benchmarks/learning") if default_out else None)
    if evidence is not None and str(evidence) != "none":
        evidence.mkdir(parents=True, exist_ok=True)
        (evidence / f"{args.task}.json").write_text(path.read_text())
    if summary["eval_size_mismatch"]:
        print(f"warning: runs evaluated at another size than the protocol's: {summary['eval_size_mismatch']}")
    if summary["best_at_grid_edge"]:
        print(f"warning: the best rate of {', '.join(summary['best_at_grid_edge'])} lies at the edge of "
              f"--lrs {' '.join(f'{x:g}' for x in args.lrs)}; widen the grid for a best-against-best comparison")
    for name in ("best", "shared"):
        if name in summary:
            print(f"\n{name} learning rates:\n{table(summary[name]['policies'])}")
    print("\nthe protocol's comparisons, at each arm's best rate:")
    print("\n".join(protocol.conclusions(summary["comparisons"], args.alpha)))
    if "shared" in summary:
        print(f"shared rate (exploratory, unadjusted): {summary['shared']['conclusion']}")
    print(f"runs and summary.json in {args.out / args.task} ({summary['minutes_this_invocation']} min)")
    return 0


if __name__ == "__main__":
    raise SystemExit(cli())
