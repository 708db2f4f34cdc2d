"""One look for every figure: the Okabe-Ito palette, a fixed style per policy, paper-ready sizes.

Colours are the Okabe-Ito set (distinguishable under the common colour-vision deficiencies). A policy
keeps its colour in every figure; a variant of a policy keeps the policy's colour and changes line
style and hatching: ``trace[oracle]`` is dashed and hatched, ``trace+local`` (another advantage
estimator) dotted. The paper's numbers are always drawn the same way, as open black diamonds, so that
they can never be mistaken for a measurement of ours. Uncertainty is a 95% confidence interval.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import matplotlib
import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter, PercentFormatter
from scipy import stats

matplotlib.use("Agg")  # figures are files: no display, and pyplot (never used here) would get Agg too

OKABE_ITO = {
    "black": "#000000",
    "orange": "#E69F00",
    "sky_blue": "#56B4E9",
    "bluish_green": "#009E73",
    "yellow": "#F0E442",
    "blue": "#0072B2",
    "vermillion": "#D55E00",
    "reddish_purple": "#CC79A7",
    "grey": "#999999",
}

POLICY_COLOURS = {
    "grpo": OKABE_ITO["blue"],
    "dapo": OKABE_ITO["sky_blue"],
    "pcl": OKABE_ITO["bluish_green"],
    "root_only": OKABE_ITO["orange"],
    "active_root_uniform_prefix": OKABE_ITO["yellow"],
    "prefix_only": OKABE_ITO["reddish_purple"],
    "uniform_tree": OKABE_ITO["black"],
    "random_prefix": OKABE_ITO["grey"],
    "trace": OKABE_ITO["vermillion"],
    "trace_beta": OKABE_ITO["vermillion"],
}
"""Colour of the policies the figures compare; TRACE's variants share vermillion and differ in line and hatch.
A policy not listed here (a new registration) is drawn in the default style of :func:`arm_style`."""

POLICY_NAMES = {
    "grpo": "GRPO",
    "dapo": "DAPO",
    "pcl": "PCL",
    "root_only": "active roots only",
    "active_root_uniform_prefix": "active roots + uniform prefixes",
    "prefix_only": "uniform roots + active prefixes",
    "uniform_tree": "uniform roots + uniform prefixes",
    "random_prefix": "random prefixes (TreePO-like)",
    "trace": "TRACE",
    "trace_beta": "TRACE-Beta",
}

PREDICTOR_NAMES = {"oracle": "oracle V", "noisy": "noisy oracle", "learned": "learned"}

PAPER = {"marker": "D", "markerfacecolor": "white", "markeredgecolor": "black", "markersize": 6, "mew": 1.2}
"""Marker style of every number taken from the paper."""

WIDTH = 7.0
"""Figure width in inches: the text width of a two-column paper."""

RC = {
    "font.size": 9,
    "axes.titlesize": 9.5,
    "axes.labelsize": 9,
    "legend.fontsize": 8,
    "xtick.labelsize": 8,
    "ytick.labelsize": 8,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.color": "#E5E5E5",
    "grid.linewidth": 0.6,
    "axes.axisbelow": True,
    "legend.frameon": False,
    "lines.linewidth": 1.6,
    "errorbar.capsize": 2.5,
    "hatch.linewidth": 0.8,
    "savefig.dpi": 200,
    "savefig.bbox": "tight",
    "pdf.fonttype": 42,
}

_ARM = re.compile(r"^(?P<policy>[a-z0-9_]+)(\[(?P<predictor>[a-z0-9_]+)\])?(\+(?P<estimator>[a-z0-9_]+))?$")


@dataclass(frozen=True)
class ArmStyle:
    """How one arm (``policy``, ``policy[predictor]`` or ``policy+estimator``) is drawn."""

    label: str
    colour: str
    linestyle: str
    marker: str
    hatch: str

    def line(self) -> dict:
        """Keyword arguments for ``Axes.plot``."""
        return {"color": self.colour, "linestyle": self.linestyle, "marker": self.marker, "label": self.label}

    def bar(self) -> dict:
        """Keyword arguments for ``Axes.bar`` / ``barh``."""
        return {"color": self.colour, "hatch": self.hatch, "edgecolor": "black", "linewidth": 0.6}


def arm_style(arm: str) -> ArmStyle:
    """The style of an arm label as the simulator writes it (``trace``, ``trace[oracle]``, ``trace+local``)."""
    match = _ARM.match(arm)
    if match is None:
        return ArmStyle(arm, OKABE_ITO["grey"], "-", "o", "")
    policy, predictor, estimator = match["policy"], match["predictor"], match["estimator"]
    if policy not in POLICY_COLOURS:  # a policy without a look of its own (newly registered): the default
        return ArmStyle(arm, OKABE_ITO["grey"], ":" if predictor or estimator else (0, (5, 1, 1, 1)), "x",
                        "xx" if predictor or estimator else "++")
    label = POLICY_NAMES[policy]
    linestyle, marker, hatch = "-", "o", ""
    if policy == "trace_beta":
        linestyle, marker, hatch = "-.", "s", "\\\\\\"
    if predictor and predictor != "learned":
        label += f" ({PREDICTOR_NAMES.get(predictor, predictor)})"
        linestyle, marker, hatch = "--", "^", "///"
    if estimator:
        label += f", {estimator} advantages"
        linestyle, marker, hatch = ":", "v", "..."
    return ArmStyle(label, POLICY_COLOURS[policy], linestyle, marker, hatch)


def new_figure(
    *, panels: int = 1, rows: int = 1, height: float = 2.6, width: float = WIDTH, **kwargs
) -> tuple[Figure, list]:
    """A figure of ``rows`` x ``panels`` axes, listed row by row (no pyplot, no global state).

    Call it, and draw, inside ``matplotlib.rc_context(RC)`` (``figures.render`` does), so that every
    artist picks up the house style.
    """
    figure = Figure(figsize=(width, height), layout="constrained")
    return figure, list(figure.subplots(rows, panels, squeeze=False, **kwargs).ravel())


def panel_label(ax: Axes, letter: str) -> None:
    """A bold panel letter (a, b, ...) above the axes' top-left corner."""
    ax.set_title(letter, loc="left", fontweight="bold")


def percent(ax: Axes, axis: str = "y") -> None:
    """Format an axis holding shares in [0, 1] as percentages."""
    getattr(ax, f"{axis}axis").set_major_formatter(PercentFormatter(1.0, decimals=0))


def ci95(stderr, n):
    """Half-width of a 95% confidence interval from a standard error over ``n`` seeds (Student t)."""
    return stats.t.ppf(0.975, df=np.maximum(np.asarray(n) - 1, 1)) * stderr


def shades(n: int) -> list:
    """``n`` colours of a colour-blind-safe sequential map (cividis), for ordered settings that are not
    policies (informativeness, M, temperature)."""
    return [matplotlib.colormaps["cividis"](x) for x in np.linspace(0.1, 0.8, n)]


def log_axis(ax: Axes, axis: str = "x", *, base: float = 10, ticks=None) -> None:
    """A log-scaled axis whose tick labels are plain numbers (64, 256, 1024), at ``ticks`` if given."""
    getattr(ax, f"set_{axis}scale")("log", base=base)
    target = getattr(ax, f"{axis}axis")
    if ticks is not None:
        target.set_ticks(list(ticks))
    else:
        target.set_major_locator(LogLocator(base=base, subs=(1.0, 2.0, 5.0)))
    target.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    target.set_minor_formatter(NullFormatter())


def new_mosaic(mosaic, *, height: float, width: float = WIDTH, **kwargs) -> tuple[Figure, dict]:
    """A figure laid out by ``Figure.subplot_mosaic`` (axes keyed by their letters), like :func:`new_figure`."""
    figure = Figure(figsize=(width, height), layout="constrained")
    return figure, figure.subplot_mosaic(mosaic, **kwargs)
