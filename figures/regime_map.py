"""Where tree expansion pays (beyond the paper): TRACE minus root-only allocation, PCL and GRPO, each at its
own best learning rate, across worlds of the tree MDP.

(a-c) One axis at a time around the default world: turn informativeness (how much one action moves the
logit of success), horizon (turns per episode) and difficulty spread (GRPO's calibrated effective
ratio; lower is wider); filled markers at equal rollouts, open at equal tokens with a prefix cache.
(d) The default world at equal tokens as a continuation's relative cost grows (kappa: the share of its
prefix it pays again; 0 with a prefix cache, 1 when a continuation costs a fresh rollout).
"""

from __future__ import annotations

import numpy as np

from .data import Results
from .style import arm_style, ci95, new_figure, panel_label

EXPERIMENT = "regime_map"
COMPARED = ("root_only", "pcl", "grpo")
TITLES = {
    "informativeness": "action scale",
    "horizon": "turns per episode",
    "spread": "GRPO's effective ratio",
}


def _gap(entry: dict, view: str, arm: str):
    gap = entry.get(view, {}).get("gap", {}).get(arm)
    return (gap["mean"], gap["stderr"]) if gap else (np.nan, np.nan)


def _world(axis: str, value, default) -> str:
    return "default" if value == default else f"{axis}={value:g}"


def draw(results: Results):
    """The figure, drawn from ``results`` alone, and its caption."""
    summary = results.summary(EXPERIMENT)
    head, details = summary["headline"], summary["details"]
    config = results.config(EXPERIMENT, "seeds", "tuning_seeds", "steps", "lrs", "normalisation")
    axes_values, default = details["axes"], details["default"]
    n = config["seeds"]
    figure, axes = new_figure(panels=4, height=3.0)
    spread = 0.08
    for ax, (axis, d) in zip(axes[:3], zip(("informativeness", "horizon", "spread"), default)):
        values = axes_values[axis]
        x = np.arange(len(values))
        for k, arm in enumerate(COMPARED):
            style = arm_style(arm)
            for view, filled, shift in (
                ("equal_rollouts", True, -spread / 2),
                ("equal_tokens_kappa=0", False, spread / 2),
            ):
                pts = [_gap(head[_world(axis, v, d)], view, arm) for v in values]
                mean, se = map(np.array, zip(*pts))
                ax.errorbar(
                    x + (k - 1) * 2 * spread + shift,
                    mean,
                    yerr=ci95(se, n),
                    marker=style.marker,
                    color=style.colour,
                    markerfacecolor=style.colour if filled else "white",
                    linestyle="none",
                    markersize=4,
                    label=f"TRACE minus {style.label}" if filled else None,
                )
        ax.axhline(0, color="black", linewidth=0.8)
        ax.set_xticks(x, [f"{v:g}" for v in values])
        ax.set_xlabel(TITLES[axis], fontsize=7.5)
    axes[0].set_ylabel("J gap, best against best (paired)")
    ax = axes[3]
    kappas = axes_values["kappa"]
    for k, arm in enumerate(COMPARED):
        style = arm_style(arm)
        pts = [_gap(head["default"], f"equal_tokens_kappa={kappa:g}", arm) for kappa in kappas]
        mean, se = map(np.array, zip(*pts))
        ax.errorbar(
            np.array(kappas) + (k - 1) * 0.03,
            mean,
            yerr=ci95(se, n),
            marker=style.marker,
            color=style.colour,
            markerfacecolor="white",
            linestyle="-",
            markersize=4,
        )
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xlabel("kappa (prefix re-paid)", fontsize=7.5)
    for a, title in zip(
        axes, ("a  informativeness", "b  horizon", "c  difficulty spread", "d  continuation cost")
    ):
        panel_label(a, title)
    axes[0].plot([], [], "o", color="grey", label="equal rollouts (filled)")
    axes[0].plot(
        [], [], "o", color="grey", markerfacecolor="white", label="equal tokens, prefix cache (open)"
    )
    handles, labels = axes[0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="outside lower center", ncols=5, fontsize=7)

    pays = [
        w for w, p in details["pays"].items() if p.get("equal_rollouts") and p.get("equal_tokens_kappa=0")
    ]
    single = [f"{w} ({v.replace('_', ' ')})" for w, p in details["pays"].items() for v, ok in p.items() if ok]
    caption = (
        f"Where tree expansion pays, in the tree MDP: TRACE's final exact success J minus that of root-only "
        f"allocation, PCL and GRPO after {config['steps']} steps, each policy at its own best learning rate "
        f"(grid {', '.join(f'{x:g}' for x in config['lrs'])}, chosen on {config['tuning_seeds']} tuning seeds per world), "
        f"paired over {n} other seeds, 95% confidence intervals; step normalised by {config['normalisation'].replace('_', ' ')}. "
        "(a-c) One knob at a time around the default world (turn informativeness: the SD of one action's effect on "
        "the logit of success; horizon; difficulty spread: GRPO's calibrated effective ratio, lower is wider); filled: equal rollouts, open: equal tokens with a prefix "
        "cache (a continuation pays only its new turns). (d) The default world at equal tokens as a continuation "
        "pays kappa of its prefix again. TRACE beats both root-only and PCL at equal rollouts and equal tokens in: "
        f"{', '.join(pays) if pays else 'no world tried'}"
        + (f"; in one view alone: {', '.join(single)}." if single else ".")
    )
    return figure, caption


if __name__ == "__main__":  # python -m figures.NAME [--results DIR] [--out DIR]
    import sys

    from .cli import main

    sys.exit(main([*sys.argv[1:], __spec__.name.rpartition(".")[2]]))
