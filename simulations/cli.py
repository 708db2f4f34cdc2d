"""``trace-sim``: list the experiments, or run them into a results folder.

    trace-sim list
    trace-sim run effective_ratio            # full size, into results/effective_ratio/
    trace-sim run all --quick --out /tmp/r   # every experiment at a few seconds each
    trace-sim run NAME --seed 3              # another seed (a separate --out keeps runs apart)
    trace-sim run effective_ratio --set 'arms=("grpo", "dapo{dapo_target=16}")' --out /tmp/dapo
                                             # change config fields; policy settings ride on the arm
    trace-sim run all --workers 1            # one process (default: one per CPU; same results)

A finished experiment is skipped on a rerun; an interrupted one continues from its finished units.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from .experiments import EXPERIMENTS
from .memory import keep_freed_memory
from .results import parse_override, run_experiment


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trace-sim", description="TRACE simulations: check the theory, compare allocators."
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("list", help="list the experiments and their claims")
    run = commands.add_parser("run", help="run experiments into OUT/NAME/")
    run.add_argument("names", nargs="+", metavar="NAME", help="experiment names, or 'all'")
    run.add_argument("--quick", action="store_true", help="a few seconds per experiment (smoke-test sizes)")
    run.add_argument("--seed", type=int, default=0, help="base seed (default 0)")
    run.add_argument("--out", type=Path, default=Path("results"), help="results folder (default ./results)")
    run.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                     help="change a config field (Python literal), e.g. seeds=3 or "
                     "'arms=(\"grpo\", \"dapo{dapo_target=16}\")'; repeatable")
    run.add_argument(
        "--workers", type=int, default=os.cpu_count() or 1,
        help="processes for an experiment's units (default: every CPU; results do not depend on it)",
    )
    return parser


def _names(requested: list[str]) -> list[str]:
    if requested == ["all"]:
        return list(EXPERIMENTS)
    unknown = [n for n in requested if n not in EXPERIMENTS]
    if unknown:
        raise ValueError(f"unknown experiment {unknown[0]!r}; known: {', '.join(EXPERIMENTS)} (or 'all')")
    return requested


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    keep_freed_memory()  # batch after batch reuses the same pages (simulations.memory)
    if args.command == "list":
        for name, experiment in EXPERIMENTS.items():
            print(f"{name}\n    {experiment.claim}")
        return 0
    try:
        if args.seed < 0:
            raise ValueError(f"--seed must be a non-negative integer, got {args.seed}")
        if args.workers < 1:
            raise ValueError(f"--workers must be a positive integer, got {args.workers}")
        overrides = dict(parse_override(text) for text in args.set)
        for name in _names(args.names):
            start = time.perf_counter()
            folder, ran = run_experiment(name, out=args.out, quick=args.quick, seed=args.seed,
                                         overrides=overrides, workers=args.workers)
            status = f"done in {time.perf_counter() - start:.1f} s" if ran else "already finished, skipped"
            print(f"{name}: {status} -> {folder}")
    except (ValueError, OSError) as error:
        print(f"trace-sim: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("trace-sim: interrupted; rerun the same command to resume (finished units are kept)",
              file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
