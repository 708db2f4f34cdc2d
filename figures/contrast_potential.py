"""Contrast potential V(1 - V) against the quadratic variation of V measured along simulated rollouts.

(a) Per bin of the anchor's true V: the mean sum of squared increments of V from the anchor to the
reward, against the bin's mean V(1 - V); on the diagonal when the identity holds. (b) The z-scores of
every bin of every check of experiment 1 (quadratic variation, mixed groups, flipped anchors) against
the standard normal they follow when the identities hold.
"""

from __future__ import annotations

import numpy as np
from scipy import stats

from .data import Results
from .style import OKABE_ITO, ci95, new_figure, panel_label, shades

EXPERIMENT = "contrast_identities"
KEYS = ["check", "informativeness", "group_size", "v_low"]


def draw(results: Results):
    """The figure, drawn from ``results`` alone, and its caption."""
    table = results.table(EXPERIMENT, metrics=("observed", "theory", "z"), columns=tuple(KEYS) + ("n",))
    z_limit = results.config(EXPERIMENT, "z_limit")["z_limit"]
    wide = table.pivot_table(index=KEYS, columns="metric", values="value").join(
        table[table["metric"] == "observed"].set_index(KEYS)[["stderr", "n"]]
    )
    figure, (ax_qv, ax_z) = new_figure(panels=2, height=2.9)

    qv = wide.xs("quadratic_variation", level="check")
    levels = sorted(qv.index.get_level_values("informativeness").unique())
    for s, colour, marker in zip(levels, shades(len(levels)), "osD^v"):
        rows = qv.xs(s, level="informativeness")
        ax_qv.errorbar(
            rows["theory"],
            rows["observed"],
            yerr=ci95(rows["stderr"], rows["n"]),
            marker=marker,
            color=colour,
            linestyle="none",
            markersize=4,
            label=f"s = {s:g}",
        )
    top = 0.26
    ax_qv.plot([0, top], [0, top], color="black", linewidth=0.8, label="identity: E[QV] = V(1 - V)", zorder=0)
    ax_qv.set_xlim(0, top)
    ax_qv.set_ylim(0, top)
    ax_qv.set_aspect("equal")
    ax_qv.set_xlabel("contrast potential V(1 - V), bin mean")
    ax_qv.set_ylabel("measured quadratic variation of V")
    ax_qv.legend(loc="upper left", title="turn informativeness")
    panel_label(ax_qv, "a")

    defined = wide[wide["stderr"] > 0]  # a bin whose outcomes cannot vary has no z
    z = defined["z"].to_numpy()
    edges = np.arange(-4.5, 4.51, 0.5)
    ax_z.hist(
        z,
        bins=edges,
        density=True,
        color=OKABE_ITO["sky_blue"],
        edgecolor="black",
        linewidth=0.5,
        label=f"{z.size} bins (all checks)",
    )
    grid = np.linspace(-4.5, 4.5, 200)
    ax_z.plot(grid, stats.norm.pdf(grid), color="black", label="standard normal")
    for side in (-z_limit, z_limit):
        ax_z.axvline(side, color=OKABE_ITO["vermillion"], linestyle="--", linewidth=1)
    ax_z.plot([], [], color=OKABE_ITO["vermillion"], linestyle="--", label=f"test limit |z| = {z_limit:g}")
    ax_z.set_xlabel("z = (observed - theory) / standard error")
    ax_z.set_ylabel("density")
    ax_z.legend(loc="upper left", fontsize=7.5)
    panel_label(ax_z, "b")

    worst = defined.groupby(level="check")["z"].apply(lambda x: x.abs().max())
    checks = ", ".join(f"{name.replace('_', ' ')} {value:.2f}" for name, value in worst.items())
    caption = (
        "The contrast potential is the expected quadratic variation of the success probability. "
        f"(a) For anchors binned by true V ({len(qv)} bins over turn informativeness s in "
        f"{{{', '.join(f'{s:g}' for s in levels)}}}), the mean sum of squared increments of V from the "
        "anchor to the reward against the bin's mean V(1 - V); whiskers: 95% confidence intervals; the "
        "line is the identity. (b) z-scores of all bins of the three checks of experiment 1 (quadratic "
        "variation, mixed groups of m continuations, flipped anchors after k continuations) against the "
        f"standard normal; {len(wide) - len(defined)} bins whose outcomes cannot vary (s = 1 makes V 0 or "
        f"1 after one turn) are left out. Largest |z|: {checks} (limit {z_limit:g})."
    )
    return figure, caption


if __name__ == "__main__":  # python -m figures.NAME [--results DIR] [--out DIR]
    import sys

    from .cli import main

    sys.exit(main([*sys.argv[1:], __spec__.name.rpartition(".")[2]]))
