"""Best against best in the tree MDP: each policy's final J against its learning rate, and the comparison at
each policy's own best rate next to the comparison at one shared rate.

(a-c) Final J against the learning rate on the tuning seeds (which choose each policy's rate and are
never reported), one panel per loss normalisation. (d) TRACE minus each policy on the report seeds,
paired by seed, at equal rollouts: at each policy's own best rate (filled) and at the shared rate (open),
for each normalisation.
"""

from __future__ import annotations

import numpy as np

from .data import Results, ResultsError, seed_summary
from .style import arm_style, ci95, log_axis, new_mosaic, panel_label

EXPERIMENT = "learning_curves"
NAMES = {"leaves": "all leaves", "mixed_leaves": "mixed leaves", "tokens": "tokens"}


def draw(results: Results):
    """The figure, drawn from ``results`` alone, and its caption."""
    table = results.table(EXPERIMENT, metrics=("success",), columns=("step", "lr", "normalisation", "stage"))
    tuned = results.summary(EXPERIMENT)["details"].get("tuned")
    if not tuned:
        raise ResultsError(
            results.path(EXPERIMENT, "summary.json"), "no `tuned` details (run without a sweep)"
        )
    config = results.config(
        EXPERIMENT, "steps", "swept_arms", "normalisations", "lr", "seeds", "tuning_seeds"
    )
    steps = config["steps"]
    final = table[(table["stage"] == "tuning") & (table["step"] == steps) & (table["metric"] == "success")]
    norms = list(config["normalisations"])
    arms = [a for a in dict.fromkeys(final["arm"])]

    mosaic = [[n for n in norms] + ["gap"]]
    figure, axes = new_mosaic(mosaic, height=3.0, width_ratios=[1] * len(norms) + [1.3])
    for n in norms:
        ax = axes[n]
        summary = seed_summary(final[final["normalisation"] == n], ["arm", "lr"])
        for arm in arms:
            rows = summary[summary["arm"] == arm].sort_values("lr")
            style = arm_style(arm)
            ax.plot(
                rows["lr"],
                rows["value"],
                marker="o",
                markersize=3,
                color=style.colour,
                linestyle=style.linestyle,
                label=style.label,
            )
        ax.axvline(config["lr"], color="grey", linewidth=0.8, linestyle=":")
        log_axis(ax, "x", base=2, ticks=tuned["lrs"])
        ax.set_xlabel("learning rate")
        ax.tick_params(axis="x", labelsize=6, rotation=45)
        panel_label(ax, f"{'abc'[norms.index(n)]}  / {NAMES.get(n, n)}")
        if n != norms[0]:
            ax.sharey(axes[norms[0]])
    axes[norms[0]].set_ylabel("final J, tuning seeds")

    ax = axes["gap"]
    others = [a for a in arms if a != "trace"]
    y0 = np.arange(len(others))[::-1]
    offsets = np.linspace(0.25, -0.25, len(norms))
    markers = "osD^v"
    for k, n in enumerate(norms):
        view = tuned[n]["equal_rollouts"]
        for filled, key in ((True, "best"), (False, "shared")):
            for i, arm in enumerate(others):
                gap = view[key]["gap"].get(arm)
                if gap is None:
                    continue
                colour = arm_style(arm).colour
                ax.errorbar(
                    gap["mean"],
                    y0[i] + offsets[k] + (0.0 if filled else -0.06),
                    xerr=ci95(gap["stderr"], config["seeds"]),
                    marker=markers[k % len(markers)],
                    color=colour,
                    markerfacecolor=colour if filled else "white",
                    linestyle="none",
                    markersize=4,
                )
        ax.plot([], [], markers[k % len(markers)], color="grey", label=f"step / {NAMES.get(n, n)}")
    ax.plot([], [], "o", color="grey", label="own best rates (filled)")
    ax.plot([], [], "o", color="grey", markerfacecolor="white", label=f"shared rate {config['lr']:g} (open)")
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_yticks(y0, [arm_style(a).label for a in others], fontsize=7)
    ax.yaxis.tick_right()
    ax.grid(axis="y", visible=False)
    ax.set_xlabel("TRACE minus policy, J")
    ax.xaxis.set_label_coords(0.5, -0.13)
    panel_label(ax, f"{'abcd'[len(norms)] if len(norms) < 4 else 'e'}  gaps")
    handles, labels = axes[norms[0]].get_legend_handles_labels()
    h2, l2 = ax.get_legend_handles_labels()
    figure.legend(handles + h2, labels + l2, loc="outside lower center", ncols=5, fontsize=7)

    best = {n: tuned[n]["equal_rollouts"]["best"]["gap"].get("grpo") for n in norms}
    said = "; ".join(
        f"step / {NAMES.get(n, n)}: {g['mean']:+.3f} ± {g['stderr']:.3f}" for n, g in best.items() if g
    )
    caption = (
        f"Learning rates tuned per policy in the tree MDP ({steps} steps; rates {', '.join(f'{x:g}' for x in tuned['lrs'])}). "
        f"(a-{'abc'[len(norms) - 1]}) Final exact success J against the learning rate, mean over the "
        f"{config['tuning_seeds']} tuning seeds that choose each policy's rate (never reported), one panel per loss "
        "normalisation (the step divided by all leaves, by the leaves of mixed prompts, or by the turns trained "
        "over the horizon); dotted: the shared rate of the default comparison. "
        f"(d) TRACE minus each policy on the {config['seeds']} report seeds, paired by seed, at equal rollouts, "
        "with 95% confidence intervals: each policy at its own best rate (filled) and every policy at the shared "
        f"rate (open). TRACE minus GRPO best against best: {said} (± 1 SE)."
    )
    return figure, caption


if __name__ == "__main__":  # python -m figures.NAME [--results DIR] [--out DIR]
    import sys

    from .cli import main

    sys.exit(main([*sys.argv[1:], __spec__.name.rpartition(".")[2]]))
