"""Render one figure: draw it from a results folder in the house style and save it as PNG and PDF."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import matplotlib

from . import figure_module
from .data import Results, ResultsError
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
        If a file the figure reads is missing or unusable, or its table does not have the layout the figure
        expects (before anything is written).
    """
    start = time.perf_counter()
    out = Path(out)
    module = figure_module(name)
    with matplotlib.rc_context(RC):
        try:
            figure, caption = module.draw(results)
        except (KeyError, IndexError, TypeError, ValueError) as error:  # a table of another layout
            path = results.path(module.EXPERIMENT, "results.csv")
            raise ResultsError(
                path, f"figure `{name}` cannot be drawn from it ({type(error).__name__}: {error})"
            ) from None
        out.mkdir(parents=True, exist_ok=True)
        png, pdf = out / f"{name}.png", out / f"{name}.pdf"
        figure.savefig(png)
        figure.savefig(pdf, metadata={"CreationDate": None})  # the same results give the same file
    return Rendered(name, png, pdf, caption, time.perf_counter() - start)
