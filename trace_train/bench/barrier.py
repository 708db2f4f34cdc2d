"""What waiting for the longest bare rollout costs: TRACE with streamed expansion, TRACE with the barrier,
and GRPO, side by side on episodes of variable length, on both back ends.

    python -m trace_train.bench.barrier                          # transformers and vLLM, no tool latency
    python -m trace_train.bench.barrier --step-seconds 0.05      # every environment step takes 50 ms
    python -m trace_train.bench.barrier --backend hf --repeats 3

The task is guess-the-number with mixed ranges and mixed guess budgets (``task.rows`` =
{highs: [2, 6, 64], max_guesses: [1, 2, 4, 8]}): episodes run 1 to 8 turns, so a step's bare rollouts
end at very different times. A tiny warm-started Qwen3 plays with an agent-sized system prompt; the
concurrent schedule runs; the environment answers at once or after ``--step-seconds`` (a slow tool).

Arms, one engine each, every arm at the same generated-token budget per call (``rollout.token_budget``,
its M derived from the arm's running token estimates after one untimed warm-up call):

* ``grpo``: flat groups of G;
* ``trace_streamed``: TRACE, each tree's continuations started as soon as its own bare rollouts end
  (``rollout.expansion=streamed``, the paper's rule; the default before 2026-12-07);
* ``trace_barrier``: TRACE, continuations started after every bare rollout has ended;
* ``trace_eager``: TRACE, continuations committed at the bare rollouts' turn boundaries
  (``rollout.expansion=eager``, the default since 2026-12-07, reserve 0), each decided as its prefix forms
  (``rollout.eager_lag=0``, the default since round 14): as deep as GRPO's step;
* ``trace_eager_lag1``: the same, each decided one turn after its prefix forms (``rollout.eager_lag=1``, the
  default before): one turn deeper than GRPO's step;
* ``trace_pipelined``: TRACE, the barrier's continuations grown in the next call's wave beside that call's
  bare rollouts (``rollout.expansion=pipelined``): a call is one episode deep. Its warm-up call fills the
  pipeline and a second one its first wave (so that the timed waves grow continuations of calls planned
  with the token estimates); each timed call is one wave, measured by the tokens it generated
  (``wave_tokens``: its bare rollouts and the previous call's continuations).

The TRACE arms use one fixed predictor (0.5 everywhere): this measures scheduling, not allocation;
with equal predictions streamed and barrier place the same continuations (``tests/rollout/test_engine.py``). The arms run
interleaved (repeat r of every arm, then r + 1), torch and OpenMP on one thread each. Per call:
wall seconds, generated tokens (the call's own, ``wave_tokens``), seconds per 1,000 of them, generation
steps (batches on transformers, engine steps on vLLM), samples in flight (the generator's occupancy, averaged over its
generating time) and the generator's idle share. Reported: medians per arm, the per-repeat ratios of
seconds per token to GRPO's (mean ± standard error), and occupancy at each tenth of one call's
duration; results (every call, occupancy over time included) go to ``results/bench_barrier.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import tempfile
from dataclasses import dataclass

import numpy as np

from . import BACKEND_NAMES, backend_choices, check_fields, chosen_backends, write_results

__all__ = ["BenchConfig", "main"]

ARMS = {"grpo": ("grpo", "barrier", {}), "trace_streamed": ("trace", "streamed", {}),
        "trace_barrier": ("trace", "barrier", {}), "trace_eager": ("trace", "eager", {}),
        "trace_eager_lag1": ("trace", "eager", {"eager_lag": 1}), "trace_pipelined": ("trace", "pipelined", {})}


@dataclass(frozen=True)
class BenchConfig:
    backends: tuple[str, ...] = BACKEND_NAMES
    """Back ends to measure, of "hf" and "vllm" (transformers first: vLLM sets torch to one thread)."""
    pool: int = 16
    """Candidate prompts per call."""
    token_budget: int = 600
    """Generated tokens per call, every arm (``rollout.token_budget``)."""
    continuations_per_root: int = 1
    """N for TRACE."""
    group_size: int = 4
    """G for GRPO."""
    max_guesses: tuple[int, ...] = (1, 2, 4, 8)
    """Guess budgets the games draw from: episode lengths."""
    step_seconds: float = 0.0
    """Latency of every environment step."""
    repeats: int = 5
    """Timed calls per arm (after one untimed warm-up call each)."""
    examples: int = 12
    """Worked example games in the system prompt (its length)."""
    model: str | None = None
    """A model directory; default: a tiny Qwen3 built and warm-started here."""
    out: str = "results/bench_barrier.json"
    seed: int = 0

    def __post_init__(self):
        check_fields(self, counts=("pool", "token_budget", "continuations_per_root", "group_size", "repeats"))
        if not self.max_guesses or min(self.max_guesses) < 1:
            raise ValueError(f"`max_guesses` must be positive guess budgets, got {self.max_guesses!r}")
        if not 0 <= self.step_seconds < float("inf"):
            raise ValueError(f"`step_seconds` must be a non-negative number, got {self.step_seconds!r}")


class Half:
    """A fixed predictor: 0.5 at every prompt and prefix (the arms differ in scheduling only)."""

    def __call__(self, histories):
        return np.full(len(histories), 0.5)


def _engine(backend, env, config: BenchConfig, arm: str):
    from ..configs import RolloutConfig
    from ..envs.base import EpisodeLimits
    from ..rollout.engine import RolloutEngine

    policy, expansion, extra = ARMS[arm]
    rollout = RolloutConfig(
        policy=policy, expansion=expansion, **extra, pool_size=config.pool, token_budget=config.token_budget,
        continuations_per_root=config.continuations_per_root, group_size=config.group_size,
        limits=EpisodeLimits(max_turns=max(config.max_guesses), max_turn_tokens=8, max_context_tokens=4096))
    return RolloutEngine(backend, env, rollout)


def _call(engine, backend, pool, seed: int) -> dict:
    if backend.capabilities.prefix_cache_reset:
        backend.reset_prefix_cache()
    batch = engine.rollout(pool, predictor=Half(), seed=seed)
    if batch is None:  # pipelined expansion's first call: the pipeline fills (the untimed warm-up)
        return {}
    report = batch.report
    out = report.as_dict()
    out["seconds_per_1k_tokens"] = 1000.0 * report.seconds / max(report.wave_tokens, 1)  # tokens of this call
    return out


def occupancy_by_tenth(run: dict) -> list[float]:
    """Samples in flight at each tenth of the call's duration (the last generation step started before it)."""
    points = run["occupancy"]
    if not points:
        return [0.0] * 10
    times = np.array([t for t, _ in points])
    held = np.array([n for _, n in points], dtype=float)
    at = np.searchsorted(times, run["seconds"] * np.arange(10) / 10, side="right") - 1
    return [float(held[i]) if i >= 0 else 0.0 for i in at]


def _summary(runs: list[dict], grpo: list[dict]) -> dict:
    ratio = np.array([r["seconds_per_1k_tokens"] / g["seconds_per_1k_tokens"] for r, g in zip(runs, grpo)])
    keys = ("seconds", "generated_tokens", "wave_tokens", "seconds_per_1k_tokens", "generation_polls",
            "samples_in_flight", "generator_idle_share", "rollouts", "continuations", "top_up_rollouts",
            "stale_token_share")
    out = {k: float(np.median([r[k] for r in runs])) for k in keys}
    out["per_token_ratio_to_grpo"] = float(ratio.mean())
    out["per_token_ratio_se"] = float(ratio.std(ddof=1) / np.sqrt(len(ratio))) if len(ratio) > 1 else float("nan")
    out["occupancy_by_tenth"] = occupancy_by_tenth(runs[0])
    return out


def main(config: BenchConfig) -> dict:
    """Run the benchmark, write ``config.out`` and return the results."""
    import torch

    from ..envs.registry import guess_rows
    from ..envs.guess_number import GuessNumberEnv
    from ..run.heap import startup_objects_frozen
    from ..tiny import save_tiny
    from .rollouts import _backend, system_prompt

    torch.set_num_threads(1)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from functools import partial

    pool = guess_rows(None, split="train", subset=None, size=config.pool, seed=config.seed, highs=[2, 6, 64],
                      max_guesses=list(config.max_guesses))
    env = partial(GuessNumberEnv, system_prompt=system_prompt(config.examples, config.seed),
                  step_seconds=config.step_seconds)
    results = {"config": dataclasses.asdict(config), "backends": {}, "load_average_before": os.getloadavg()}
    lines = ["| back end | arm | s / call | tokens | s / 1k tokens | ratio to GRPO (± SE) | steps | in flight "
             "| idle share | occupancy by tenth of the call |", "|---" * 10 + "|"]
    with tempfile.TemporaryDirectory() as tmp:
        model = config.model or save_tiny(tmp, seed=config.seed, warm_steps=60)
        for name in config.backends:
            backend = _backend(name, model)
            engines = {arm: _engine(backend, env, config, arm) for arm in ARMS}
            for arm, engine in engines.items():  # warm-up: the token estimates (pipelined: and a wave of them)
                for w in range(2 if engine.pipelined else 1):
                    _call(engine, backend, pool, seed=config.seed + 10_000 + w)
            runs: dict[str, list[dict]] = {arm: [] for arm in ARMS}
            with startup_objects_frozen():  # no full collection's pause lands on one arm's call
                for r in range(config.repeats):
                    for arm, engine in engines.items():
                        runs[arm].append(_call(engine, backend, pool, seed=config.seed + r))
            summary = {arm: _summary(runs[arm], runs["grpo"]) for arm in ARMS}
            summary["streamed_vs_barrier"] = float(np.mean(
                [s["seconds_per_1k_tokens"] / b["seconds_per_1k_tokens"]
                 for s, b in zip(runs["trace_streamed"], runs["trace_barrier"])]))
            results["backends"][name] = {"summary": summary, "runs": runs}
            for arm in ARMS:
                s = summary[arm]
                lines.append(f"| {name} | {arm} | {s['seconds']:.2f} | {s['wave_tokens']:.0f} | "
                             f"{s['seconds_per_1k_tokens']:.2f} | {s['per_token_ratio_to_grpo']:.2f} ± "
                             f"{s['per_token_ratio_se']:.2f} | {s['generation_polls']:.0f} | "
                             f"{s['samples_in_flight']:.1f} | {s['generator_idle_share']:.2f} | "
                             + " ".join(f"{x:.0f}" for x in s["occupancy_by_tenth"]) + " |")
    results["load_average_after"] = os.getloadavg()
    print("\n".join(lines))
    print(f"load average before / after: {results['load_average_before']} / {results['load_average_after']}")
    write_results(results, config.out)
    return results


def _parse(argv=None) -> BenchConfig:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    defaults = BenchConfig()
    parser.add_argument("--backend", choices=backend_choices(), default="both")
    for field in ("pool", "token_budget", "continuations_per_root", "group_size", "repeats", "examples", "seed"):
        parser.add_argument(f"--{field.replace('_', '-')}", type=int, default=getattr(defaults, field))
    parser.add_argument("--max-guesses", type=int, nargs="+", default=list(defaults.max_guesses))
    parser.add_argument("--step-seconds", type=float, default=defaults.step_seconds)
    parser.add_argument("--model", default=None)
    parser.add_argument("--out", default=defaults.out)
    args = vars(parser.parse_args(argv))
    backend = args.pop("backend")
    args["max_guesses"] = tuple(args["max_guesses"])
    return BenchConfig(backends=chosen_backends(backend), **args)


if __name__ == "__main__":
    try:
        main(_parse())
    except ValueError as err:
        raise SystemExit(f"error: {err}") from None
