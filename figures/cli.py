"""``trace-figures``: render figures from an existing results folder and write its report.

    trace-figures                              # every figure -> results/figures/, and results/REPORT.md
    trace-figures --results /tmp/r effective_ratio ablation
    trace-figures list                         # the figures and the experiment each reads

Rendering every figure also writes ``RESULTS/REPORT.md``. Nothing is ever simulated here: a missing or
unusable results file is reported in one line naming the file, and the exit status is 2.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from . import FIGURES, figure_module
from .data import Results, ResultsError
from .render import render
from .report import write_report


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trace-figures",
        description="Render TRACE's figures from a trace-sim results folder; with no NAME, every figure and "
        "RESULTS/REPORT.md. `trace-figures list` lists the figures.",
    )
    parser.add_argument(
        "names", nargs="*", metavar="NAME", help="figures to render (default: all), or 'list'"
    )
    parser.add_argument(
        "--results", type=Path, default=Path("results"), help="results folder (default ./results)"
    )
    parser.add_argument("--out", type=Path, default=None, help="where figures go (default RESULTS/figures)")
    return parser


def _list() -> int:
    for name in FIGURES:
        module = figure_module(name)
        print(f"{name:<20} reads {module.EXPERIMENT:<20} {module.__doc__.strip().splitlines()[0]}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.names == ["list"]:
        return _list()
    unknown = [n for n in args.names if n not in FIGURES]
    if unknown:
        print(
            f"trace-figures: error: unknown figure {unknown[0]!r}; known: {', '.join(FIGURES)}",
            file=sys.stderr,
        )
        return 2
    if not args.results.is_dir():
        print(
            f"trace-figures: error: {args.results}: no such results folder; run `trace-sim run all` first",
            file=sys.stderr,
        )
        return 2
    results, out = Results(args.results), args.out or args.results / "figures"
    start, rendered, errors = time.perf_counter(), {}, []
    for name in args.names or FIGURES:
        try:
            done = render(name, results, out)
        except ResultsError as error:
            errors.append(str(error))
            continue
        rendered[name] = done
        print(f"{name}: {done.seconds:.1f} s -> {done.png} (+ .pdf)")
    report = None
    if not args.names and not errors:
        try:
            report = write_report(results, rendered, seconds=time.perf_counter() - start)
        except ResultsError as error:
            errors.append(str(error))
    for error in dict.fromkeys(errors):  # a file read by two figures is reported once
        print(f"trace-figures: error: {error}", file=sys.stderr)
    if errors:
        return 2
    print(f"figures: {len(rendered)} PNG + PDF in {out}{os.sep}")
    if report:
        print(f"report:  {report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
