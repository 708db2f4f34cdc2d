"""Bias of the recursive value targets at prefixes, by the prefix's true V, under each branching rule.

One panel per value target of ``trace_theory.VALUE_METHODS`` (the paper's leaf-weighted mean and the
alternatives): the weighted bias, sum w (target - V) / sum w with the method's own weights, which is
what a predictor fitted by weighted least squares inherits. TRACE branches where the factual outcome
looks surprising, so the leaf-weighted target is pulled towards 1/2; outcome-independent branching
(uniform, random) is the control.
"""

from __future__ import annotations

import numpy as np

from .data import Results, seed_summary
from .style import arm_style, ci95, new_figure, panel_label

EXPERIMENT = "target_bias"
METHOD_NAMES = {
    "leaf_weighted": "leaf-weighted (paper)",
    "child_mean": "child mean",
    "factual": "factual reward",
    "own_branches": "own branches",
}


def draw(results: Results):
    """The figure, drawn from ``results`` alone, and its caption."""
    table = results.table(
        EXPERIMENT,
        metrics=("weighted_bias",),
        columns=("quantity", "method", "nodes", "scope", "v_low", "v_high"),
    )
    rows = table[
        (table["quantity"] == "target")
        & (table["nodes"] == "prefix")
        & (table["scope"] == "v_bin")
        & (table["metric"] == "weighted_bias")
    ]
    summary = seed_summary(rows, ["method", "arm", "v_low", "v_high"])
    methods = [m for m in METHOD_NAMES if m in set(summary["method"])] + sorted(
        set(summary["method"]) - set(METHOD_NAMES)
    )
    arms = list(dict.fromkeys(summary["arm"]))
    figure, axes = new_figure(panels=2, rows=-(-len(methods) // 2), height=4.6, sharey=True, sharex=True)
    for spare in axes[len(methods) :]:
        figure.delaxes(spare)
    width = float((summary["v_high"] - summary["v_low"]).iloc[0])
    for ax, method, letter in zip(axes, methods, "abcdefgh"):
        for i, arm in enumerate(arms):
            group = summary[(summary["method"] == method) & (summary["arm"] == arm)]
            x = (group["v_low"] + group["v_high"]) / 2 + (i - (len(arms) - 1) / 2) * width * 0.15
            style = arm_style(arm)
            ax.errorbar(
                x,
                group["value"],
                yerr=ci95(group["stderr"], group["n"]),
                color=style.colour,
                linestyle=style.linestyle,
                marker=style.marker,
                markersize=3.5,
                linewidth=1.0,
                label=style.label,
            )
        ax.axhline(0, color="black", linewidth=0.8)
        ax.set_xlim(0, 1)
        ax.set_xticks(np.linspace(0, 1, 6))
        panel_label(ax, f"{letter}  {METHOD_NAMES.get(method, method)}")
    for ax in axes[: len(methods)]:
        if ax.get_subplotspec().is_last_row() or ax is axes[len(methods) - 1]:
            ax.set_xlabel("prefix's true V")
        if ax.get_subplotspec().is_first_col():
            ax.set_ylabel("weighted bias (target - V)")
    handles, labels = axes[0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="outside lower center", ncols=len(arms))

    config = results.config(EXPERIMENT, "seeds", "roots", "continuations", "bins")
    caption = (
        f"Bias of the recursive value targets at every prefix of the sampled trees (M = {config['roots']}, "
        f"N = {config['continuations']}), per bin of the prefix's true V ({config['bins']} bins): the weighted "
        "mean of target - V with each method's own weights, the estimating equation a predictor fitted with "
        f"those weights solves; mean over {config['seeds']} seeds, 95% confidence intervals. With TRACE's "
        "outcome-dependent branching the paper's leaf-weighted target is pulled towards 1/2 (too high at low V, "
        "too low at high V); under outcome-independent branching (uniform, random) it is unbiased, and the "
        "factual and own-branches targets are unbiased under every rule."
    )
    return figure, caption


if __name__ == "__main__":  # python -m figures.NAME [--results DIR] [--out DIR]
    import sys

    from .cli import main

    sys.exit(main([*sys.argv[1:], __spec__.name.rpartition(".")[2]]))
