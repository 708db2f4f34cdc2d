"""``RESULTS/REPORT.md``: one section per claim, with its figures, the paper's numbers, ours, and the verdict.

Everything comes from the results folder: the claim, the measured result, whether it held and the
runtime from each ``summary.json``, the numbers through :mod:`figures.claims`, the captions from the
figure modules.
"""

from __future__ import annotations

import os
from pathlib import Path

from .claims import SECTIONS, Row, Section
from .data import Results, ResultsError
from .render import Rendered


def write_report(results: Results, rendered: dict[str, Rendered], *, seconds: float) -> Path:
    """Write ``RESULTS/REPORT.md`` from the summaries and the rendered figures; return its path.

    ``seconds`` is how long rendering took (reported next to the simulations' runtimes).
    """
    path = results.root / "REPORT.md"
    summaries = {s.experiment: results.summary(s.experiment) for s in SECTIONS}
    rows = {s.experiment: _numbers(results, s, summaries[s.experiment]) for s in SECTIONS}
    lines = _header(results, summaries, seconds)
    for number, section in enumerate(SECTIONS, start=1):
        summary = summaries[section.experiment]
        lines += _section(number, section, summary, rows[section.experiment], rendered, path.parent)
    path.write_text("\n".join(lines) + "\n")
    return path


def _header(results: Results, summaries: dict, seconds: float) -> list[str]:
    quick = any(s.get("quick") for s in summaries.values())
    seeds = sorted({s.get("seed") for s in summaries.values()}, key=str)
    total = sum(s["runtime_s"] for s in summaries.values())
    held = sum(bool(s["held"]) for s in summaries.values())
    lines = [
        "# TRACE in simulation: claims, figures, numbers",
        "",
        (
            f"Results folder `{results.root}` ({'quick smoke-test sizes: numbers are noisy' if quick else 'default sizes'}; "
            f"base seed {', '.join(map(str, seeds))}). Written by `trace-figures` from the folder's `summary.json`, "
            "`results.csv` and `config.json` files; nothing here was simulated by the report. "
            "The paper's numbers come from real LLM training (Qwen3-8B), ours from a simulator calibrated to the "
            "paper's GRPO effective ratio: compare directions, not sizes."
        ),
        "",
        f"**{held} of {len(summaries)} claims held.** Simulations: {total:.1f} s in all; figures: {seconds:.1f} s.",
        "",
        "| # | claim | held | simulation time |",
        "| --- | --- | --- | --- |",
    ]
    for number, section in enumerate(SECTIONS, start=1):
        summary = summaries[section.experiment]
        anchor = heading_anchor(f"{number}. {section.title}")
        lines.append(
            f"| {number} | [{section.title}](#{anchor}) | {_held(summary)} | {summary['runtime_s']:.1f} s |"
        )
    return lines + [""]


def heading_anchor(heading: str) -> str:
    """The link target GitHub gives a Markdown heading: lower case, every character that is not a letter, digit,
    space, hyphen or underscore dropped, spaces turned into hyphens ("8. Repeated expansion (beyond the
    paper)" -> "8-repeated-expansion-beyond-the-paper")."""
    kept = "".join(c for c in heading.strip().lower() if c.isalnum() or c in " -_")
    return kept.replace(" ", "-")


def _held(summary: dict) -> str:
    return "yes" if summary["held"] else "NO"


def _numbers(results: Results, section: Section, summary: dict) -> list[Row]:
    """The section's table of numbers; a summary whose headline has another layout is a ResultsError."""
    try:
        return section.numbers(summary)
    except (AttributeError, KeyError, TypeError, ValueError) as error:
        path = results.path(section.experiment, "summary.json")
        raise ResultsError(
            path, f"unexpected `headline` or `details` ({type(error).__name__}: {error})"
        ) from None


def _section(
    number: int, section: Section, summary: dict, rows: list[Row], rendered: dict[str, Rendered], base: Path
) -> list[str]:
    lines = [
        f"## {number}. {section.title}",
        "",
        f"**Claim** (`{section.experiment}`). {summary['claim']}",
        "",
        f"**Held: {_held(summary)}.** Simulated in {summary['runtime_s']:.1f} s.",
        "",
    ]
    if rows:
        lines += ["| quantity | paper | ours (± 1 SE over seeds where given) |", "| --- | --- | --- |"]
        lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows] + [""]
    lines += [f"**Measured.** {summary['result']}", ""]
    for index, name in enumerate(section.figures):
        if name not in rendered:
            continue
        figure = rendered[name]
        label = f"Figure {number}{'abcdefgh'[index] if len(section.figures) > 1 else ''}"
        png, pdf = (Path(os.path.relpath(p, base)).as_posix() for p in (figure.png, figure.pdf))
        lines += [
            f"![{label}: {name}]({png})",
            "",
            f"*{label}* ([PDF]({pdf}), `{name}`). {figure.caption}",
            "",
        ]
    return lines
