"""How far TRACE's numbers rest on the simulator's knobs, with the paper located among them.

(a) TRACE's effective ratio against the feature noise of the learned predictor, one line per candidate
pool (multiples of the prompts GRPO's groups use), with GRPO and the paper's 26.8% and 60.6%.
(b) The same runs in mixed prompts per 1,000 rollouts, which filtering prompts out cannot inflate.
(c, d) Effective ratio and mixed prompts per 1,000 rollouts against turn informativeness for every arm
(default noise and pool).
"""

from __future__ import annotations

import numpy as np

from . import paper
from .data import Results, seed_summary
from .style import arm_style, ci95, new_figure, panel_label, percent, shades

EXPERIMENT = "sensitivity"
METRICS = ("effective_ratio", "mixed_prompts_per_1k_rollouts")
LABELS = {
    "effective_ratio": "effective ratio",
    "mixed_prompts_per_1k_rollouts": "mixed prompts / 1,000 rollouts",
}


def _band(ax, x, rows, **line) -> None:
    half = ci95(rows["stderr"].to_numpy(), rows["n"].to_numpy())
    ax.plot(x, rows["value"], marker="o", markersize=3, **line)
    ax.fill_between(
        x, rows["value"] - half, rows["value"] + half, alpha=0.15, linewidth=0, color=line["color"]
    )


def draw(results: Results):
    """The figure, drawn from ``results`` alone, and its caption."""
    table = results.after_warmup(
        EXPERIMENT, metrics=METRICS, columns=("noise", "pool_factor", "informativeness")
    )
    config = results.config(
        EXPERIMENT, "default_noise", "default_pool_factor", "pool_factors", "seeds", "model"
    )
    details = results.summary(EXPERIMENT)["details"]
    s0 = config["model"]["informativeness"]
    summary = seed_summary(
        table[table["metric"].isin(METRICS)], ["arm", "noise", "pool_factor", "informativeness", "metric"]
    )
    figure, axes = new_figure(panels=2, rows=2, height=5.6)
    grpo = summary[(summary["arm"] == "grpo") & np.isclose(summary["informativeness"], s0)]
    pools = config["pool_factors"]
    for ax, metric in zip(axes[:2], METRICS):
        trace = summary[
            (summary["arm"] == "trace")
            & np.isclose(summary["informativeness"], s0)
            & (summary["metric"] == metric)
        ]
        for colour, factor in zip(shades(len(pools)), pools):
            rows = trace[np.isclose(trace["pool_factor"], factor)].sort_values("noise")
            _band(ax, rows["noise"].to_numpy(), rows, color=colour, label=f"TRACE, pool {factor:g}x")
        g = grpo[grpo["metric"] == metric]["value"]
        if len(g):
            ax.axhline(float(g.iloc[0]), color=arm_style("grpo").colour, linestyle="--", label="GRPO")
        ax.set_xlabel("feature noise of the learned predictor (SD on logit V)")
        ax.set_ylabel(LABELS[metric])
    ax = axes[0]
    ax.axhline(
        paper.TRACE_RATIO, color="black", linewidth=0.9, linestyle=":", label="paper: TRACE 60.6%, GRPO 26.8%"
    )
    ax.axhline(paper.GRPO_RATIO, color="black", linewidth=0.9, linestyle=":")
    for noise in details.get("noise_at_paper_ratio_by_pool_factor", {}).values():
        if noise is not None:
            ax.plot(
                [noise], [paper.TRACE_RATIO], marker="D", color="black", markerfacecolor="white", markersize=5
            )
    percent(ax)
    panel_label(axes[0], "a  effective ratio vs noise")
    panel_label(axes[1], "b  contrast yield vs noise")

    turns = summary[
        np.isclose(summary["noise"], config["default_noise"])
        & np.isclose(summary["pool_factor"], config["default_pool_factor"])
    ]
    for ax, metric in zip(axes[2:], METRICS):
        for arm in dict.fromkeys(summary["arm"]):
            rows = turns[(turns["arm"] == arm) & (turns["metric"] == metric)].sort_values("informativeness")
            style = arm_style(arm)
            _band(
                ax,
                rows["informativeness"].to_numpy(),
                rows,
                color=style.colour,
                linestyle=style.linestyle,
                label=style.label,
            )
        ax.set_xlabel("turn informativeness s")
        ax.set_ylabel(LABELS[metric])
    axes[2].axhline(paper.TRACE_RATIO, color="black", linewidth=0.9, linestyle=":")
    percent(axes[2])
    panel_label(axes[2], "c  effective ratio vs informativeness")
    panel_label(axes[3], "d  contrast yield vs informativeness")
    handles, labels = axes[0].get_legend_handles_labels()
    h3, l3 = axes[2].get_legend_handles_labels()
    keep = [(handle, text) for handle, text in zip(h3, l3) if text not in labels]
    figure.legend(
        handles + [h for h, _ in keep],
        labels + [text for _, text in keep],
        loc="outside lower center",
        ncols=4,
        fontsize=7,
    )

    where = ", ".join(
        f"pool {p}x at noise {n:g}"
        for p, n in details.get("noise_at_paper_ratio_by_pool_factor", {}).items()
        if n is not None
    )
    lo, hi = details["trace_range"]["effective_ratio"]
    mlo, mhi = details["trace_range"]["mixed_prompts_per_1k_rollouts"]
    caption = (
        f"Sensitivity of TRACE's numbers to the simulator's knobs (learned predictor; pass rates calibrated so "
        f"that GRPO mixes {paper.GRPO_RATIO:.1%}; mean over {config['seeds']} seeds, bands: 95% confidence). "
        f"(a) Effective ratio against the feature noise on logit V that the predictor reads, one line per candidate "
        f"pool (x the prompts GRPO's groups use): {lo:.1%}-{hi:.1%}; dotted: the paper's 26.8% and 60.6%; diamonds: "
        f"where TRACE's ratio crosses 60.6% ({where or 'not crossed in the swept range'}). (b) Mixed prompts per "
        f"1,000 rollouts of the same runs ({mlo:.0f}-{mhi:.0f}; dashed: GRPO), which dropping prompts cannot raise. "
        f"(c, d) Both against turn informativeness (noise {config['default_noise']:g}, pool "
        f"{config['default_pool_factor']:g}x) for every arm."
    )
    return figure, caption


if __name__ == "__main__":  # python -m figures.NAME [--results DIR] [--out DIR]
    import sys

    from .cli import main

    sys.exit(main([*sys.argv[1:], __spec__.name.rpartition(".")[2]]))
