"""Render one figure: draw it from a results folder in the house style and save it as PNG and PDF."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import matplotlib

from . import figure_module
from .data import Results
from .style import RC


@dataclass(frozen=True)
class Rendered:
    """A saved figure: its files, its caption and how long drawing and saving took."""

    name: str
    png: Path
    pdf: Path
    caption: str
    seconds: float


def render(name: str, results: Results, out: Path) -> Rendered:
    """Draw figure ``name`` from ``results`` and save ``out/NAME.png`` and ``out/NAME.pdf``.

    Raises
    ------
    figures.data.ResultsError
        If a file the figure reads is missing or unusable (before anything is written).
    """
    start = time.perf_counter()
    out = Path(out)
    with matplotlib.rc_context(RC):
        figure, caption = figure_module(name).draw(results)
        out.mkdir(parents=True, exist_ok=True)
        png, pdf = out / f"{name}.png", out / f"{name}.pdf"
        figure.savefig(png)
        figure.savefig(pdf, metadata={"CreationDate": None})  # the same results give the same file
    return Rendered(name, png, pdf, caption, time.perf_counter() - start)
