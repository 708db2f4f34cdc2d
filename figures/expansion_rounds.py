"""Repeated expansion: R = 1, 2, 3 rounds of branching from prefixes, at equal rollouts and at equal turns.

(a) Effective ratio, (b) mixed prompts per batch, (c) contrast pairs per rollout, each against R, per
branching arm; filled markers and solid lines at equal rollouts, open markers and dashed lines at equal
turns (M rescaled so that the arm's turns per batch match its R = 1 turns).
"""

from __future__ import annotations

from .data import Results, seed_summary
from .style import arm_style, ci95, new_figure, panel_label, percent

EXPERIMENT = "expansion_rounds"
METRICS = ("effective_ratio", "mixed_prompts", "contrast_pairs_per_rollout")
PANELS = (
    ("effective_ratio", "a  effective ratio", "effective ratio"),
    ("mixed_prompts", "b  mixed prompts", "mixed prompts per batch"),
    ("contrast_pairs_per_rollout", "c  contrast pairs", "contrast pairs per rollout"),
)
VIEWS = (("equal_rollouts", "-", True), ("equal_turns", "--", False))


def draw(results: Results):
    """The figure, drawn from ``results`` alone, and its caption."""
    table = results.after_warmup(EXPERIMENT, metrics=METRICS, columns=("view", "rounds"))
    summary = seed_summary(table[table["metric"].isin(METRICS)], ["view", "arm", "rounds", "metric"])
    arms = list(dict.fromkeys(table["arm"]))
    figure, axes = new_figure(panels=3, height=2.6)
    for ax, (metric, title, label) in zip(axes, PANELS):
        for arm in arms:
            style = arm_style(arm)
            for view, linestyle, filled in VIEWS:
                at = (summary["arm"] == arm) & (summary["view"] == view) & (summary["metric"] == metric)
                rows = summary[at].sort_values("rounds")
                ax.errorbar(
                    rows["rounds"], rows["value"], yerr=ci95(rows["stderr"], rows["n"]), color=style.colour,
                    linestyle=linestyle, marker=style.marker, markerfacecolor=style.colour if filled else "white",
                    label=f"{style.label}, {view.replace('_', ' ')}",
                )
        ax.set_xticks(sorted(summary["rounds"].unique()))
        ax.set_xlabel("expansion rounds R")
        ax.set_ylabel(label)
        panel_label(ax, title)
    percent(axes[0])
    handles, labels = axes[0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="outside lower center", ncols=2)

    config = results.config(EXPERIMENT, "roots", "continuations", "seeds", "warmup", "batches")
    ratio = summary[(summary["view"] == "equal_rollouts") & (summary["metric"] == "effective_ratio")]
    measured = ", ".join(
        f"{arm_style(r.arm).label} R = {r.rounds}: {r.value:.1%}" for r in ratio.itertuples()
    )
    caption = (
        "Repeated expansion (beyond the paper): round r branches from the prefixes of the continuations "
        "round r - 1 added, with each prompt's m_i N continuations dealt evenly over the R rounds. "
        f"M = {config['roots']}, "
        f"N = {config['continuations']}, learned predictor; mean over {config['seeds']} seeds of batches "
        f"{config['warmup'] + 1}-{config['batches']}, 95% confidence intervals. Filled markers, solid lines: "
        "equal rollouts, M (1 + N) per batch; open markers, dashed lines: equal turns (M rescaled so that "
        f"the arm's turns per batch match its R = 1 turns). Effective ratio at equal rollouts: {measured}."
    )
    return figure, caption


if __name__ == "__main__":  # python -m figures.NAME [--results DIR] [--out DIR]
    import sys

    from .cli import main

    sys.exit(main([*sys.argv[1:], __spec__.name.rpartition(".")[2]]))
