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
from .claims import SECTIONS
from .data import Results, ResultsError
from .render import Rendered, render
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


def _bad_arguments(args) -> str | None:
    """Why the command line cannot be served, in one line, or None."""
    unknown = [n for n in args.names if n not in FIGURES]
    if unknown:
        return f"unknown figure {unknown[0]!r}; known: {', '.join(FIGURES)}"
    if not args.results.is_dir():
        return f"{args.results}: no such results folder; run `trace-sim run all --out {args.results}` first"
    return _unwritable(args.out or args.results / "figures")


def _unwritable(out: Path) -> str | None:
    """Why figures cannot be written into ``out``, in one line, or None (the folder is then created)."""
    if out.exists() and not out.is_dir():
        return f"--out {out}: is a file, not a folder"
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as error:
        return f"--out {out}: not writable ({error.strerror or error})"
    return None


def render_figures(names, results: Results, out: Path) -> tuple[dict[str, Rendered], list[str]]:
    """Render ``names`` (printing each as it is saved); the figures saved and one message per failure."""
    rendered, errors = {}, []
    for name in names:
        try:
            rendered[name] = done = render(name, results, out)
        except ResultsError as error:
            errors.append(str(error))
            continue
        print(f"{name}: {done.seconds:.1f} s -> {done.png} (+ .pdf)")
    return rendered, errors


def report_or_errors(
    results: Results, rendered: dict[str, Rendered], seconds: float, *, write: bool = True
) -> tuple[Path | None, list[str]]:
    """Write the report (if ``write``) when every summary it needs is usable; else one message per
    unusable file."""
    errors = []
    for section in SECTIONS:
        try:
            results.summary(section.experiment)
        except ResultsError as error:
            errors.append(str(error))
    if errors or not write:
        return None, errors
    try:
        return write_report(results, rendered, seconds=seconds), []
    except ResultsError as error:
        return None, [str(error)]


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.names == ["list"]:
        return _list()
    problem = _bad_arguments(args)
    if problem:
        print(f"trace-figures: error: {problem}", file=sys.stderr)
        return 2
    start, results, out = time.perf_counter(), Results(args.results), args.out or args.results / "figures"
    rendered, errors = render_figures(args.names or FIGURES, results, out)
    report = None
    if not args.names:
        report, more = report_or_errors(results, rendered, time.perf_counter() - start, write=not errors)
        errors += more
    for error in dict.fromkeys(errors):  # a file read by two figures is reported once
        print(f"trace-figures: error: {error}", file=sys.stderr)
    if errors:
        return 2
    if report:
        print(
            f"tables:  {args.results}{os.sep}NAME{os.sep}results.csv (+ summary.json, config.json), "
            f"one folder per experiment"
        )
    print(f"figures: {out}{os.sep} ({len(rendered)} PNG + PDF)")
    if report:
        print(f"report:  {report}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
