"""TRACE's budget shape: M root rollouts against N continuations per root rollout, from the same pools.

(a) Effective ratio against N, one line per M, with the paper's (512, 2) 42.4%, (512, 6) 47.8% and
(1024, 2) 52.3%. (b) Mixed prompts per batch: the ratio rewards depth, the count of prompts that carry
a learning signal rewards coverage.
"""

from __future__ import annotations

from . import paper
from .data import Results, seed_summary
from .style import PAPER, ci95, new_figure, panel_label, percent, shades

EXPERIMENT = "ablation"
METRICS = ("effective_ratio", "mixed_prompts")


def draw(results: Results):
    """The figure, drawn from ``results`` alone, and its caption."""
    table = results.after_warmup(EXPERIMENT, metrics=METRICS, columns=("study", "roots", "continuations"))
    table = table[(table["study"] == "shape") & table["metric"].isin(METRICS)]
    summary = seed_summary(table, ["roots", "continuations", "metric"])
    roots = sorted(summary["roots"].unique())
    figure, (ax_ratio, ax_mixed) = new_figure(panels=2, height=2.9, sharex=True)
    colours = dict(zip(roots, shades(len(roots))))
    for ax, metric in ((ax_ratio, "effective_ratio"), (ax_mixed, "mixed_prompts")):
        for m in roots:
            rows = summary[(summary["roots"] == m) & (summary["metric"] == metric)].sort_values(
                "continuations"
            )
            half = ci95(rows["stderr"], rows["n"])
            ax.plot(
                rows["continuations"],
                rows["value"],
                marker="o",
                markersize=4,
                color=colours[m],
                label=f"M = {m}",
            )
            ax.fill_between(
                rows["continuations"],
                rows["value"] - half,
                rows["value"] + half,
                color=colours[m],
                alpha=0.25,
                linewidth=0,
            )
        ax.set_xlabel("N: continuations per root rollout")
        ax.set_xticks(sorted(summary["continuations"].unique()))
    for (m, n), value in paper.SHAPE_RATIO.items():
        if m in colours:
            ax_ratio.plot(n, value, zorder=5, **PAPER)
            ax_ratio.annotate(
                f"({m}, {n})", (n, value), textcoords="offset points", xytext=(6, -3), fontsize=7.5
            )
    if any(m in colours for m, _ in paper.SHAPE_RATIO):
        ax_ratio.plot([], [], linestyle="none", label="paper (M, N), multi-hop QA", **PAPER)
    ax_ratio.set_ylim(0, 1)
    percent(ax_ratio)
    ax_ratio.set_ylabel("effective ratio (% of prompts mixed)")
    ax_ratio.legend(loc="lower right")
    panel_label(ax_ratio, "a  effective ratio")
    ax_mixed.set_ylim(bottom=0)
    ax_mixed.set_ylabel("mixed prompts per batch")
    panel_label(ax_mixed, "b  mixed prompts")

    config = results.config(EXPERIMENT, "pool", "seeds", "warmup", "batches")
    ratio = summary[summary["metric"] == "effective_ratio"].set_index(["roots", "continuations"])["value"]
    mixed = summary[summary["metric"] == "mixed_prompts"].set_index(["roots", "continuations"])["value"]
    ours = "; ".join(
        f"({m}, {n}) {ratio[(m, n)]:.1%}, {mixed[(m, n)]:.0f} mixed prompts"
        for m, n in paper.SHAPE_RATIO
        if (m, n) in ratio
    )
    caption = (
        f"Budget shape of TRACE (learned predictor): M root rollouts and N continuations per root rollout, "
        f"M (1 + N) rollouts per batch, every shape drawing from pools of {config['pool']} candidate prompts, "
        f"so a larger M covers more of the same pool. Mean over {config['seeds']} seeds of batches "
        f"{config['warmup'] + 1}-{config['batches']}; bands: 95% confidence intervals. (a) Effective ratio; open "
        "diamonds: the paper's shapes (512, 2) 42.4%, (512, 6) 47.8%, (1024, 2) 52.3% (multi-hop QA, "
        "Qwen3-8B), where the paper found that root coverage beats depth. (b) Mixed prompts per batch. "
        + (f"Measured at the paper's shapes: {ours}." if ours else "The paper's shapes are not in this grid.")
    )
    return figure, caption


if __name__ == "__main__":  # python -m figures.NAME [--results DIR] [--out DIR]
    import sys

    from .cli import main

    sys.exit(main([*sys.argv[1:], __spec__.name.rpartition(".")[2]]))
