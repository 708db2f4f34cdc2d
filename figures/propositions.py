"""The paper's propositions, measured: prefix conditioning helps prediction; active allocation beats uniform.

(a) How much better a prefix's V_t predicts the success rate of a group of m continuations than the
root's V_0 does (reduction of the squared error), by depth, against the closed form
(1 - (1 - s)^t) E[V_0 (1 - V_0)]. (b) The Brier score of predicting whether that group is mixed, from
the root and from the prefix. (c) Expected mixed groups of active (``root_only``) and uniform (GRPO) root
allocation; (d) expected flipped anchors of active (TRACE) against uniform and random prefix allocation,
on the same pools, at several budgets; oracle predictions, so only the allocation rules differ.
"""

from __future__ import annotations

from .data import Results, seed_summary
from .style import arm_style, ci95, log_axis, new_figure, panel_label, shades

EXPERIMENT = "propositions"
P1 = ("rate_improvement", "rate_improvement_theory", "brier_mixed_root", "brier_mixed_prefix")


def _prefix_conditioning(table, ax_gain, ax_brier) -> None:
    rows = table[(table["proposition"] == 1) & table["metric"].isin(P1)]
    wide = rows.pivot_table(index=["informativeness", "depth"], columns="metric", values="value")
    gain = rows[rows["metric"] == "rate_improvement"].set_index(["informativeness", "depth"])
    levels = sorted(wide.index.get_level_values("informativeness").unique())
    for s, colour, marker in zip(levels, shades(len(levels)), "osD^v"):
        w, g = wide.loc[s], gain.loc[s]
        ax_gain.plot(w.index, w["rate_improvement_theory"], color=colour, linewidth=1.2, label=f"s = {s:g}")
        ax_gain.errorbar(
            g.index,
            g["value"],
            yerr=1.96 * g["stderr"],
            color=colour,
            marker=marker,
            markeredgecolor="black",
            markeredgewidth=0.5,
            markersize=4.5,
            linestyle="none",
        )
        ax_brier.plot(
            w.index,
            w["brier_mixed_root"],
            color=colour,
            linestyle="--",
            marker=marker,
            markersize=3.5,
            markerfacecolor="white",
        )
        ax_brier.plot(w.index, w["brier_mixed_prefix"], color=colour, marker=marker, markersize=3.5)
    ax_gain.set_xlabel("prefix depth t (turns)")
    ax_gain.set_ylabel("squared-error reduction")
    ax_gain.legend(title="lines: closed form", loc="upper left")
    ax_brier.plot(
        [], [], color="grey", linestyle="--", marker="o", markerfacecolor="white", label="from the root V_0"
    )
    ax_brier.plot([], [], color="grey", marker="o", label="from the prefix V_t")
    ax_brier.set_xlabel("prefix depth t (turns)")
    ax_brier.set_ylabel("Brier score, 'group is mixed'")
    ax_brier.legend(loc="upper left")


def _allocation(table, stage: str, metric: str, ax) -> None:
    rows = table[(table["proposition"] == 3) & (table["stage"] == stage)]
    summary = seed_summary(rows, ["arm", "budget"], over="pool")
    for arm, group in summary.groupby("arm", sort=False):
        style = arm_style(arm)
        ax.errorbar(
            group["budget"],
            group["value"],
            yerr=ci95(group["stderr"], group["n"]),
            markersize=4,
            **style.line(),
        )
    log_axis(ax, "x", base=2, ticks=sorted(summary["budget"].unique()))
    log_axis(ax, "y")
    ax.set_xlabel("budget (rollouts per pool)")
    ax.set_ylabel(metric)
    ax.legend(loc="upper left")


def draw(results: Results):
    """The figure, drawn from ``results`` alone, and its caption."""
    table = results.table(
        EXPERIMENT,
        metrics=P1 + ("expected_mixed_groups", "expected_flipped_anchors"),
        columns=("proposition", "informativeness", "depth", "stage", "pool"),
    )
    config = results.config(EXPERIMENT, "group_size", "pools", "pool")
    figure, axes = new_figure(panels=2, rows=2, height=5.2)
    _prefix_conditioning(table, axes[0], axes[1])
    _allocation(table, "roots", "expected mixed groups", axes[2])
    _allocation(table, "prefixes", "expected flipped anchors", axes[3])
    titles = (
        "prefix conditioning: success rate",
        "prefix conditioning: mixed or not",
        "roots: active vs uniform",
        "prefixes: active vs uniform",
    )
    for ax, letter, title in zip(axes, "abcd", titles):
        panel_label(ax, f"{letter}  {title}")
    caption = (
        f"The propositions in the simulator. (a) Reduction of the squared error of predicting the success "
        f"rate of a group of {config['group_size']} continuations from a prefix at depth t, using the prefix's "
        "V_t instead of the root's V_0 (markers: measured, 95% confidence intervals; lines: the closed form "
        "(1 - (1 - s)^t) E[V_0 (1 - V_0)] for turn informativeness s). (b) Brier score of predicting whether "
        "that group is mixed, from the root (open, dashed) and from the prefix (filled): conditioning on "
        f"the prefix helps more with depth and with s. (c, d) On {config['pools']} pools of {config['pool']} "
        "prompts with oracle predictions, expected mixed groups of active and uniform root allocation (c) and "
        "expected flipped anchors of active, uniform and random prefix allocation with N = 2 continuations "
        "per bare rollout (d), against the rollout budget; 95% confidence intervals over pools."
    )
    return figure, caption


if __name__ == "__main__":  # python -m figures.NAME [--results DIR] [--out DIR]
    import sys

    from .cli import main

    sys.exit(main([*sys.argv[1:], __spec__.name.rpartition(".")[2]]))
