"""Effective ratio of every policy at equal rollouts, next to the paper's GRPO 26.8% and TRACE 60.6%.

(a) What the budget bought, which filtering prompts out cannot inflate: mixed prompts per 1,000 rollouts
and per 1,000 turns. (b) Share of prompts whose leaves mix a success and a failure, per arm, at M (1 + N)
rollouts per batch; the paper's two numbers as open diamonds.
"""

from __future__ import annotations

import numpy as np

from . import paper
from .data import Results, seed_summary
from .style import PAPER, arm_style, ci95, new_figure, panel_label, percent

EXPERIMENT = "effective_ratio"
YIELDS = ("mixed_prompts_per_1k_rollouts", "mixed_prompts_per_1k_turns")


def draw(results: Results):
    """The figure, drawn from ``results`` alone, and its caption."""
    shown = ("effective_ratio", *YIELDS)
    table = results.after_warmup(EXPERIMENT, metrics=shown, columns=("view",))
    summary = seed_summary(table[table["metric"].isin(shown)], ["view", "arm", "metric"])
    arms = list(dict.fromkeys(table["arm"]))
    y = np.arange(len(arms))[::-1]

    def column(view: str, metric: str):
        rows = (
            summary[(summary["view"] == view) & (summary["metric"] == metric)].set_index("arm").reindex(arms)
        )
        return rows["value"].to_numpy(), ci95(rows["stderr"].to_numpy(), rows["n"].to_numpy())

    figure, (ax_mixed, ax_ratio) = new_figure(panels=2, height=3.4, sharey=True)
    ratio, ratio_ci = column("equal_rollouts", "effective_ratio")
    for i, arm in enumerate(arms):
        ax_ratio.barh(y[i], ratio[i], xerr=ratio_ci[i], height=0.7, **arm_style(arm).bar())
    references = {"grpo": paper.GRPO_RATIO, "trace": paper.TRACE_RATIO}
    shown = [(y[arms.index(a)], v) for a, v in references.items() if a in arms]
    if shown:
        ys, xs = zip(*shown)
        ax_ratio.plot(xs, ys, linestyle="none", label="paper (math, Qwen3-8B)", zorder=5, **PAPER)
    ax_ratio.set_yticks(y, [arm_style(a).label for a in arms])
    ax_ratio.set_xlim(0, 1)
    ax_ratio.set_xlabel("effective ratio (% of prompts mixed)")
    percent(ax_ratio, "x")
    ax_ratio.grid(axis="y", visible=False)
    panel_label(ax_ratio, "b  effective ratio")

    for metric, offset, fill in ((YIELDS[0], 0.17, True), (YIELDS[1], -0.17, False)):
        value, half = column("equal_rollouts", metric)
        for i, arm in enumerate(arms):
            style = arm_style(arm)
            ax_mixed.errorbar(
                value[i],
                y[i] + offset,
                xerr=half[i],
                marker="o" if fill else "s",
                color=style.colour,
                markerfacecolor=style.colour if fill else "white",
                markeredgecolor="black" if fill else style.colour,
                linestyle="none",
                markersize=5,
            )
    ax_mixed.plot([], [], "o", color="grey", markeredgecolor="black", label="(a) per 1,000 rollouts")
    ax_mixed.plot([], [], "s", color="grey", markerfacecolor="white", label="(a) per 1,000 turns")
    figure.legend(loc="outside lower center", ncols=3)
    ax_mixed.set_xlabel("mixed prompts per 1,000 rollouts / turns")
    ax_mixed.set_yticks(y, [arm_style(a).label for a in arms])
    ax_mixed.set_xlim(left=0)
    ax_mixed.grid(axis="y", visible=False)
    panel_label(ax_mixed, "a  contrast yield")

    config = results.config(EXPERIMENT, "roots", "continuations", "seeds", "warmup", "batches")
    by_arm = dict(zip(arms, ratio))
    measured = ", ".join(f"{arm_style(a).label} {by_arm[a]:.1%}" for a in references if a in by_arm)
    caption = (
        f"Effective ratio at equal budget (M = {config['roots']} root rollouts, N = {config['continuations']} "
        f"continuations per root, M (1 + N) rollouts per batch; pass rates calibrated so that GRPO mixes "
        f"{paper.GRPO_RATIO:.1%} of its prompts). (a) Mixed prompts per 1,000 rollouts (filled) and per 1,000 "
        "turns (open): what the budget bought, which dropping prompts cannot raise. (b) Share of prompts whose leaves mix success and failure; "
        f"bars: mean over {config['seeds']} seeds of batches {config['warmup'] + 1}-{config['batches']}, "
        f"whiskers: 95% confidence intervals; open diamonds: the paper's GRPO {paper.GRPO_RATIO:.1%} and "
        f"TRACE {paper.TRACE_RATIO:.1%} (math, Qwen3-8B). Measured: {measured}. The ratio divides by the "
        "prompts that received rollouts, so a policy that filters more prompts out raises it without mixing more."
    )
    return figure, caption


if __name__ == "__main__":  # python -m figures.NAME [--results DIR] [--out DIR]
    import sys

    from .cli import main

    sys.exit(main([*sys.argv[1:], __spec__.name.rpartition(".")[2]]))
