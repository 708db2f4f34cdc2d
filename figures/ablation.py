"""The paper's ablation: uniform or active roots crossed with uniform or active prefixes.

(a) Effective ratio of the four combinations at one budget shape, with the paper's uniform + uniform
42.8% and active + active 52.3% (multi-hop QA, Qwen3-8B). (b) Mixed prompts per batch, what the root
allocator actually maximises.
"""

from __future__ import annotations

import numpy as np

from . import paper
from .data import Results, seed_summary
from .style import PAPER, arm_style, ci95, new_figure, panel_label, percent

EXPERIMENT = "ablation"
LABELS = {
    "uniform_tree": "uniform roots\n+ uniform prefixes",
    "active_root_uniform_prefix": "active roots\n+ uniform prefixes",
    "prefix_only": "uniform roots\n+ active prefixes",
    "trace": "active roots\n+ active prefixes\n(TRACE)",
}
METRICS = ("effective_ratio", "mixed_prompts")


def draw(results: Results):
    """The figure, drawn from ``results`` alone, and its caption."""
    table = results.after_warmup(EXPERIMENT, metrics=METRICS, columns=("study",))
    table = table[(table["study"] == "ablation") & table["metric"].isin(METRICS)]
    summary = seed_summary(table, ["arm", "metric"])
    arms = list(dict.fromkeys(table["arm"]))
    y = np.arange(len(arms))[::-1]
    figure, (ax_ratio, ax_mixed) = new_figure(panels=2, height=2.8, sharey=True)
    for ax, metric in ((ax_ratio, "effective_ratio"), (ax_mixed, "mixed_prompts")):
        rows = summary[summary["metric"] == metric].set_index("arm").reindex(arms)
        for i, arm in enumerate(arms):
            ax.barh(
                y[i],
                rows["value"].iloc[i],
                xerr=ci95(rows["stderr"].iloc[i], rows["n"].iloc[i]),
                height=0.65,
                **arm_style(arm).bar(),
            )
        ax.grid(axis="y", visible=False)
    shown = [(y[arms.index(a)], v) for a, v in paper.ABLATION_RATIO.items() if a in arms]
    if shown:
        ys, xs = zip(*shown)
        ax_ratio.plot(xs, ys, linestyle="none", label="paper (multi-hop QA, Qwen3-8B)", zorder=5, **PAPER)
        figure.legend(loc="outside lower center")
    ax_ratio.set_yticks(y, [LABELS.get(a, arm_style(a).label) for a in arms])
    ax_ratio.set_xlim(0, 1)
    percent(ax_ratio, "x")
    ax_ratio.set_xlabel("effective ratio (% of prompts mixed)")
    panel_label(ax_ratio, "a  effective ratio")
    ax_mixed.set_xlabel("mixed prompts per batch")
    panel_label(ax_mixed, "b  mixed prompts")

    config = results.config(EXPERIMENT, "ablation_shape", "seeds", "warmup", "batches", "pool")
    m, n = config["ablation_shape"]
    ratio = summary[summary["metric"] == "effective_ratio"].set_index("arm")["value"]
    measured = ", ".join(f"{LABELS[a].replace(chr(10), ' ')} {ratio[a]:.1%}" for a in arms if a in LABELS)
    caption = (
        f"Ablation at (M, N) = ({m}, {n}) from pools of {config['pool']} candidate prompts, learned predictor; "
        f"mean over {config['seeds']} seeds of batches {config['warmup'] + 1}-{config['batches']}, 95% "
        f"confidence intervals. (a) Effective ratio; open diamonds: the paper's {paper.ABLATION_RATIO['uniform_tree']:.1%} "
        f"(uniform + uniform) and {paper.ABLATION_RATIO['trace']:.1%} (active + active), measured on multi-hop QA "
        f"with Qwen3-8B. Measured: {measured}. (b) Mixed prompts per batch."
    )
    return figure, caption


if __name__ == "__main__":  # python -m figures.NAME [--results DIR] [--out DIR]
    import sys

    from .cli import main

    sys.exit(main([*sys.argv[1:], __spec__.name.rpartition(".")[2]]))
