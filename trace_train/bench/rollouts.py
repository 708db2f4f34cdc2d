"""Benchmark: flat versus tree rollouts at the same number of leaves, on vLLM and on transformers.

Both modes roll out the same prompts of the guess-the-number task with a tiny warm-started Qwen3 and an
agent-sized system prompt (rules plus worked example games, about 600 tokens):

* **flat** (``grpo``): G (1 + N) independent rollouts per prompt;
* **tree** (``uniform_tree``): G bare rollouts per prompt, then G N continuations branched from their
  turn boundaries.

For each it reports generated tokens, prompt tokens computed versus served from the prefix cache, the
share of the continuations' shared-prefix tokens served from cache, and time per run (median wall
clock and median CPU time of this process, which a busy shared machine disturbs less) with generated
tokens per second. Token counts are deterministic for a seed. Each run starts from an empty prefix
cache.

Run it with ``python -m trace_train.bench.rollouts`` (add ``--backend hf`` for transformers only);
results go to ``results/bench_rollouts.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
import time
from dataclasses import dataclass
from functools import partial

import numpy as np

from . import BACKEND_NAMES, backend_choices, check_fields, chosen_backends, write_results

__all__ = ["BenchConfig", "main"]


@dataclass(frozen=True)
class BenchConfig:
    backends: tuple[str, ...] = BACKEND_NAMES
    """Back ends to measure, of "hf" and "vllm" (transformers first: vLLM sets torch to one thread)."""
    prompts: int = 8
    """Prompts rolled out per run."""
    group_size: int = 4
    """G: bare rollouts per prompt in tree mode."""
    continuations_per_root: int = 3
    """N: continuations per bare rollout (flat mode gets G (1 + N) rollouts per prompt)."""
    repeats: int = 5
    """Timed runs per mode (after one untimed warm-up run)."""
    examples: int = 12
    """Worked example games in the system prompt (its length)."""
    high: int = 16
    """Targets lie in [1, high]; with ``max_guesses`` it sets how long games run."""
    max_guesses: int = 5
    """Turns per game at most (longer games leave more shared turns for continuations to skip)."""
    model: str | None = None
    """A model directory; default: a tiny Qwen3 built and warm-started here."""
    out: str = "results/bench_rollouts.json"
    seed: int = 0

    def __post_init__(self):
        check_fields(self, counts=("prompts", "group_size", "repeats", "high", "max_guesses",
                                   "continuations_per_root"))


def system_prompt(examples: int, seed: int) -> str:
    """The game's rules followed by ``examples`` worked games played by binary search."""
    from ..envs.guess_number import SYSTEM_PROMPT, GuessNumberEnv, make_rows

    lines = [SYSTEM_PROMPT, "", "Example games:"]
    for row in make_rows(examples, high=16, max_guesses=5, seed=seed + 1):
        env, low, high, turns = GuessNumberEnv(), row["low"], row["high"], []
        env.reset(row)
        while True:
            guess = (low + high) // 2
            result = env.step(str(guess))
            turns.append(f"{guess}: {result.observation}")
            if result.done:
                break
            low, high = (guess + 1, high) if guess < row["target"] else (low, guess - 1)
        lines.append(" | ".join(turns))
    return "\n".join(lines)


_OPTIONS = {"vllm": dict(enforce_eager=True, block_size=32, kv_cache_memory_bytes=512 * 2**20, max_model_len=2048)}
"""Engine options per back end (others take their defaults): eager, a small fixed KV cache."""


def _backend(name: str, model: str):
    from ..backends import build_backend

    return build_backend(name, model, dtype="float32", device="cpu", **_OPTIONS.get(name, {}))


def _run(backend, env, pool, config: BenchConfig, mode: str, seed: int) -> dict:
    from ..configs import RolloutConfig
    from ..rollout.engine import RolloutEngine
    from ..envs.base import EpisodeLimits

    g, n = config.group_size, config.continuations_per_root
    rollout = RolloutConfig(
        policy="grpo" if mode == "flat" else "uniform_tree",
        roots=g * len(pool), continuations_per_root=n, group_size=g * (1 + n) if mode == "flat" else g,
        limits=EpisodeLimits(max_turns=config.max_guesses, max_turn_tokens=8, max_context_tokens=4096),
    )
    if backend.capabilities.prefix_cache_reset:
        backend.reset_prefix_cache()
    cpu = time.process_time()
    report = RolloutEngine(backend, env, rollout).rollout(pool, seed=seed).report
    return report.as_dict() | {"cpu_seconds": time.process_time() - cpu}


def _summary(runs: list[dict]) -> dict:
    """Token counts averaged over runs; times are medians (the machine may be shared)."""
    total = {k: sum(r[k] for r in runs) for k in ("rollouts", "generated_tokens", "prompt_tokens",
                                                   "cached_prompt_tokens", "continuation_prefix_tokens",
                                                   "continuation_prefix_cached")}
    computed = total["prompt_tokens"] - total["cached_prompt_tokens"]
    wall = float(np.median([r["seconds"] for r in runs]))
    cpu = float(np.median([r["cpu_seconds"] for r in runs]))
    generated = total["generated_tokens"] / len(runs)
    return {
        "leaves_per_run": total["rollouts"] / len(runs),
        "generated_tokens_per_run": generated,
        "prompt_tokens_per_run": total["prompt_tokens"] / len(runs),
        "computed_prompt_tokens_per_run": computed / len(runs),
        "cached_prompt_share": total["cached_prompt_tokens"] / max(1, total["prompt_tokens"]),
        "continuation_prefix_hit_rate": (
            total["continuation_prefix_cached"] / total["continuation_prefix_tokens"]
            if total["continuation_prefix_tokens"] else None
        ),
        "seconds_per_run": wall,
        "cpu_seconds_per_run": cpu,
        "generated_tokens_per_second": generated / wall,
        "generated_tokens_per_cpu_second": generated / cpu,
    }


def main(config: BenchConfig) -> dict:
    """Run the benchmark, write ``config.out`` and return the results."""
    from ..envs.guess_number import GuessNumberEnv, make_rows
    from ..tiny import save_tiny

    pool = make_rows(config.prompts, high=config.high, max_guesses=config.max_guesses, seed=config.seed)
    env = partial(GuessNumberEnv, system_prompt=system_prompt(config.examples, config.seed))
    results = {"config": dataclasses.asdict(config), "backends": {}}
    with tempfile.TemporaryDirectory() as tmp:
        model = config.model or save_tiny(tmp, seed=config.seed, warm_steps=60)
        for name in config.backends:
            backend = _backend(name, model)
            _run(backend, env, pool, config, "tree", seed=config.seed + 10_000)  # warm-up, not timed
            modes = {}
            for mode in ("flat", "tree"):
                runs = [_run(backend, env, pool, config, mode, seed=config.seed + r)
                        for r in range(config.repeats)]
                modes[mode] = {"summary": _summary(runs), "runs": runs}
                print(f"{name:5s} {mode:5s} " + json.dumps({k: round(v, 3) if isinstance(v, float) else v
                                                            for k, v in modes[mode]["summary"].items()}))
            flat, tree = modes["flat"]["summary"], modes["tree"]["summary"]
            modes["tree_vs_flat"] = {
                "computed_prompt_tokens": (tree["computed_prompt_tokens_per_run"]
                                           / flat["computed_prompt_tokens_per_run"]),
                "prompt_tokens": tree["prompt_tokens_per_run"] / flat["prompt_tokens_per_run"],
                "generated_tokens": tree["generated_tokens_per_run"] / flat["generated_tokens_per_run"],
                "seconds": tree["seconds_per_run"] / flat["seconds_per_run"],
                "cpu_seconds": tree["cpu_seconds_per_run"] / flat["cpu_seconds_per_run"],
            }
            results["backends"][name] = modes
    write_results(results, config.out)
    return results


def _parse(argv=None) -> BenchConfig:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    defaults = BenchConfig()
    parser.add_argument("--backend", choices=backend_choices(), default="both")
    for field in ("prompts", "group_size", "continuations_per_root", "repeats", "examples", "high", "max_guesses",
                  "seed"):
        parser.add_argument(f"--{field.replace('_', '-')}", type=int, default=getattr(defaults, field))
    parser.add_argument("--model", default=None)
    parser.add_argument("--out", default=defaults.out)
    args = vars(parser.parse_args(argv))
    backend = args.pop("backend")
    return BenchConfig(backends=chosen_backends(backend), **args)


if __name__ == "__main__":
    try:
        main(_parse())
    except ValueError as err:
        raise SystemExit(f"error: {err}") from None
