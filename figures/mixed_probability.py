"""Probability that a group is mixed, mixed(v, m) = 1 - v^m - (1 - v)^m, against v for several group sizes.

(a) Groups of m continuations from one anchor: the curves of ``trace_theory.mixed_probability`` and the
shares the simulator measured per bin of the anchor's true v. (b) The same for flips (at least one of k
continuations ends differently from the factual rollout): averaged over the factual reward, which is 1
with probability v, flip(v, r, k) becomes mixed(v, k + 1).
"""

from __future__ import annotations

import numpy as np
from matplotlib.lines import Line2D

from trace_theory import mixed_probability

from .data import Results
from .style import ci95, new_figure, panel_label, percent, shades

EXPERIMENT = "contrast_identities"


def _pooled(table, check: str):
    """Per (group size, v bin): observed and theory shares pooled over informativeness, weighted by count."""
    rows = table[(table["check"] == check) & table["metric"].isin(["observed", "theory"])]
    wide = rows.pivot_table(
        index=["group_size", "v_low", "v_high", "informativeness"], columns="metric", values="value"
    ).join(
        rows[rows["metric"] == "observed"].set_index(["group_size", "v_low", "v_high", "informativeness"])[
            ["stderr", "n"]
        ]
    )
    wide["w"] = wide["n"] / wide.groupby(level=["group_size", "v_low"])["n"].transform("sum")
    pooled = (
        wide.assign(
            observed=wide["observed"] * wide["w"],
            theory=wide["theory"] * wide["w"],
            var=(wide["w"] * wide["stderr"]) ** 2,
        )
        .groupby(level=["group_size", "v_low", "v_high"])[["observed", "theory", "var", "n"]]
        .sum()
    )
    pooled["stderr"] = np.sqrt(pooled.pop("var"))
    return pooled.reset_index()


def _panel(ax, pooled, shift: int) -> None:
    sizes = sorted(pooled["group_size"].unique())
    grid = np.linspace(0, 1, 201)
    for m, colour, marker in zip(sizes, shades(len(sizes)), "osD^v"):
        rows = pooled[pooled["group_size"] == m]
        centre = (rows["v_low"] + rows["v_high"]) / 2
        ax.plot(grid, mixed_probability(grid, m + shift), color=colour, linewidth=1.2, label=f"{m}")
        ax.hlines(
            rows["theory"],
            rows["v_low"] + 0.01,
            rows["v_high"] - 0.01,
            color=colour,
            linewidth=2.5,
            alpha=0.35,
        )
        ax.errorbar(
            centre,
            rows["observed"],
            yerr=ci95(rows["stderr"], rows["n"]),
            color=colour,
            marker=marker,
            markeredgecolor="black",
            markeredgewidth=0.5,
            markersize=4.5,
            linestyle="none",
        )
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.02)
    percent(ax)


def draw(results: Results):
    """The figure, drawn from ``results`` alone, and its caption."""
    table = results.table(
        EXPERIMENT,
        metrics=("observed", "theory"),
        columns=("check", "group_size", "v_low", "v_high", "n", "informativeness"),
    )
    checks = set(table["check"])
    figure, (ax_mixed, ax_flip) = new_figure(panels=2, height=2.9, sharey=True)
    for ax, check, shift, title, legend in (
        (ax_mixed, "mixed", 0, "a  m continuations are mixed", "m"),
        (ax_flip, "flip", 1, "b  one of k continuations flips", "k"),
    ):
        if check not in checks:
            continue
        _panel(ax, _pooled(table, check), shift)
        ax.set_xlabel("anchor's success probability v")
        ax.legend(title=legend, loc="lower center")
        panel_label(ax, title)
    ax_mixed.set_ylabel("probability (% of groups)")
    key = [
        Line2D([], [], color="grey", linewidth=1.2, label="theory"),
        Line2D([], [], color="grey", linewidth=2.5, alpha=0.35, label="theory averaged over the bin"),
        Line2D([], [], color="grey", marker="o", linestyle="none", label="simulated (95% CI)"),
    ]
    figure.legend(handles=key, loc="outside lower center", ncols=3)
    caption = (
        "Mixed-group probability against the anchor's success probability v. Lines: mixed(v, m) = "
        "1 - v^m - (1 - v)^m (a) and, for flips, mixed(v, k + 1), which is flip(v, r, k) = "
        "1 - (r v + (1 - r)(1 - v))^k averaged over the factual reward r ~ Bernoulli(v) (b). Markers: shares "
        "measured in the simulator per bin of the anchor's true v, pooled over turn informativeness, with 95% "
        "confidence intervals; pale bars: the theory averaged over the anchors in the bin, which is what the "
        "markers estimate. Larger groups mix more often, and most where v is near 1/2."
    )
    return figure, caption


if __name__ == "__main__":  # python -m figures.NAME [--results DIR] [--out DIR]
    import sys

    from .cli import main

    sys.exit(main([*sys.argv[1:], __spec__.name.rpartition(".")[2]]))
