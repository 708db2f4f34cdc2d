"""figures: one module per figure; each reads a results folder (``figures.data``) and never runs an experiment.

A figure module defines ``EXPERIMENT`` (the results subfolder it reads) and
``draw(results) -> (matplotlib.figure.Figure, caption)``; ``figures.render`` saves it as PNG and PDF in
the house style (``figures.style``), and ``trace-figures`` (``figures.cli``) renders any of them and
writes the report (``figures.report``). Run one alone with ``python -m figures.NAME [--results DIR]``.
This package imports neither ``simulations`` nor ``trace_train`` (a test enforces it).
"""

import importlib
from types import ModuleType

FIGURES = (
    "contrast_potential",
    "mixed_probability",
    "propositions",
    "effective_ratio",
    "budget_allocation",
    "ablation",
    "budget_shape",
    "learning_curves",
    "learning_rates",
    "predictor_quality",
    "target_bias",
    "expansion_rounds",
    "sensitivity",
    "regime_map",
    "eager_expansion",
)
"""Every figure, in the order of the report."""


def figure_module(name: str) -> ModuleType:
    """The module that draws figure ``name``."""
    if name not in FIGURES:
        raise ValueError(f"unknown figure {name!r}; known: {', '.join(FIGURES)}")
    return importlib.import_module(f"{__name__}.{name}")
