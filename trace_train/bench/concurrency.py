"""Benchmark: concurrent versus lockstep rollout scheduling, with tools of configurable latency.

Rolls out ``prompts x group_size`` (default 16 x 4 = 64) guess-the-number rollouts of ``turns`` turns
(default 4; the range is wide, so games rarely end early) with a tiny warm-started Qwen3 and an
agent-sized system prompt, on each back end, for each step latency (constant 0, 50 and 200 ms, and a
heavy-tailed log-normal with mean 200 ms), once with ``schedule="lockstep"`` (one batch per turn,
environments stepped one after another) and once with ``schedule="concurrent"`` (:mod:`.scheduler`).

For every run it reports wall time, the time the model was generating, the time at least one
environment call ran, their overlap, the longest time one rollout spent in its environment, and

    bound ratio = wall / max(generation time, longest rollout environment time),

which is at least 1 for any schedule; the target for the concurrent schedule at 200 ms is at most 1.5
(lockstep pays the sum of generation time and every environment's time, turn by turn).

Run it with ``python -m trace_train.bench.concurrency`` (``--backend hf`` or ``vllm`` for one back end);
results go to ``results/bench_concurrency.json``, with the load average at start and end.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile
import time
from dataclasses import dataclass
from functools import partial

import numpy as np

from . import BACKEND_NAMES, backend_choices, check_backends, chosen_backends, write_results

__all__ = ["ConcurrencyBenchConfig", "main"]

LATENCIES = {"0ms": (0.0, "constant"), "50ms": (0.05, "constant"), "200ms": (0.2, "constant"),
             "200ms_lognormal": (0.2, "lognormal")}


@dataclass(frozen=True)
class ConcurrencyBenchConfig:
    backends: tuple[str, ...] = BACKEND_NAMES
    """Back ends to measure, of "hf" and "vllm" (transformers first: vLLM sets torch to one thread)."""
    latencies: tuple[str, ...] = tuple(LATENCIES)
    """Step latencies to measure, by name in ``LATENCIES``."""
    prompts: int = 16
    group_size: int = 4
    """Rollouts per prompt: prompts x group_size rollouts per run."""
    schedules: tuple[str, ...] = ("lockstep", "concurrent")
    """Schedules to measure (``RolloutConfig.schedule``)."""
    turns: int = 4
    """Turns per rollout (``max_turns``; the range is wide enough that few games end sooner)."""
    env_workers: int = 64
    repeats: int = 1
    """Timed runs per setting, schedules interleaved (medians are reported), after one untimed warm-up
    run per back end."""
    examples: int = 12
    """Worked example games in the system prompt (its length)."""
    model: str | None = None
    """A model directory; default: a tiny Qwen3 built and warm-started here."""
    out: str = "results/bench_concurrency.json"
    seed: int = 0

    def __post_init__(self):
        check_backends(self.backends)
        if set(self.latencies) - set(LATENCIES) or not self.latencies:
            raise ValueError(f"`latencies` must be a non-empty subset of {tuple(LATENCIES)}, "
                             f"got {self.latencies!r}")
        if set(self.schedules) - {"lockstep", "concurrent"} or not self.schedules:
            raise ValueError(f"`schedules` must be a non-empty subset of ('lockstep', 'concurrent'), "
                             f"got {self.schedules!r}")
        for name in ("prompts", "group_size", "turns", "env_workers", "repeats"):
            if getattr(self, name) < 1:
                raise ValueError(f"`{name}` must be at least 1, got {getattr(self, name)}")


def _run(backend, make_env, pool, config: ConcurrencyBenchConfig, schedule: str, seed: int) -> dict:
    from ..configs import RolloutConfig
    from ..rollout.engine import RolloutEngine
    from ..envs.base import EpisodeLimits

    rollout = RolloutConfig(
        policy="grpo", roots=config.prompts * config.group_size, continuations_per_root=0,
        group_size=config.group_size, schedule=schedule, env_workers=config.env_workers,
        limits=EpisodeLimits(max_turns=config.turns, max_turn_tokens=8, max_context_tokens=4096),
    )
    if backend.capabilities.prefix_cache_reset:
        backend.reset_prefix_cache()
    report = RolloutEngine(backend, make_env, rollout).rollout(pool, seed=seed).report
    keys = ("rollouts", "generated_tokens", "seconds", "generation_seconds", "env_seconds", "overlap_seconds",
            "env_call_seconds", "generator_idle_share", "max_rollout_env_seconds")
    row = {k: getattr(report, k) for k in keys}
    row["bound_ratio"] = row["seconds"] / max(row["generation_seconds"], row["max_rollout_env_seconds"])
    return row


def _median(runs: list[dict]) -> dict:
    return {k: float(np.median([r[k] for r in runs])) for k in runs[0]}


def main(config: ConcurrencyBenchConfig) -> dict:
    """Run the benchmark, write ``config.out`` and return the results."""
    from .rollouts import _backend, system_prompt
    from ..envs.guess_number import GuessNumberEnv, make_rows
    from ..envs.latency import Latency, with_latency
    from ..tiny import save_tiny

    pool = make_rows(config.prompts, high=1000, max_guesses=config.turns, seed=config.seed)
    game = partial(GuessNumberEnv, system_prompt=system_prompt(config.examples, config.seed))
    game.concurrency_safe = True  # a partial of a safe class (set here so that the factory says so)
    results = {"config": dataclasses.asdict(config), "load_average_start": os.getloadavg(), "backends": {}}
    with tempfile.TemporaryDirectory() as tmp:
        model = config.model or save_tiny(tmp, seed=config.seed, warm_steps=60)
        for name in config.backends:
            backend = _backend(name, model)
            _run(backend, game, pool, config, "concurrent", seed=config.seed + 10_000)  # warm-up
            rows = {}
            for latency in config.latencies:
                mean, distribution = LATENCIES[latency]
                runs = {schedule: [] for schedule in config.schedules}
                for r in range(config.repeats):  # schedules interleaved: load drifts hit both alike
                    for schedule in config.schedules:
                        make_env = with_latency(game, Latency(mean, distribution), seed=config.seed + r)
                        row = _run(backend, make_env, pool, config, schedule, seed=config.seed + r)
                        runs[schedule].append(row)
                for schedule in config.schedules:
                    rows[f"{latency}/{schedule}"] = summary = _median(runs[schedule])
                    times = {k: v for k, v in summary.items() if k not in ("rollouts", "generated_tokens")}
                    print(f"{name:5s} {latency:16s} {schedule:10s} "
                          + " ".join(f"{k}={v:.3f}" for k, v in times.items()), flush=True)
                if len(config.schedules) == 2:
                    rows[f"{latency}/concurrent_vs_lockstep_seconds"] = (
                        rows[f"{latency}/concurrent"]["seconds"] / rows[f"{latency}/lockstep"]["seconds"])
            results["backends"][name] = rows
            del backend
    results["load_average_end"] = os.getloadavg()
    results["finished"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    write_results(results, config.out)
    return results


def _parse(argv=None) -> ConcurrencyBenchConfig:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    defaults = ConcurrencyBenchConfig()
    parser.add_argument("--backend", choices=backend_choices(), default="both")
    parser.add_argument("--latencies", nargs="+", choices=list(LATENCIES), default=list(defaults.latencies))
    parser.add_argument("--schedules", nargs="+", choices=["lockstep", "concurrent"],
                        default=list(defaults.schedules))
    for field in ("prompts", "group_size", "turns", "env_workers", "repeats", "examples", "seed"):
        parser.add_argument(f"--{field.replace('_', '-')}", type=int, default=getattr(defaults, field))
    parser.add_argument("--model", default=None)
    parser.add_argument("--out", default=defaults.out)
    args = vars(parser.parse_args(argv))
    backend = args.pop("backend")
    args["latencies"], args["schedules"] = tuple(args["latencies"]), tuple(args["schedules"])
    return ConcurrencyBenchConfig(backends=chosen_backends(backend), **args)


if __name__ == "__main__":
    try:
        main(_parse())
    except ValueError as err:
        raise SystemExit(f"error: {err}") from None
