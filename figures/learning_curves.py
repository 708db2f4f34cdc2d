"""Learning curves in the enumerable tree MDP: the policy's exact success probability J, by policy.

(a, b) J against the rollouts spent (equal rollouts) and against the turns spent (equal tokens: a turn
is the simulator's unit of generated text; a continuation from a prefix costs fewer turns than a full
rollout). (c, d) The same as the gain over GRPO, paired by seed (every arm trains on the same tasks
within a seed), with confidence bands. (e) The paired gain at the end, for every arm and every
advantage estimator run on TRACE's trees.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from .data import Results, ResultsError, seed_summary
from .style import arm_style, ci95, new_mosaic, panel_label

EXPERIMENT = "learning_curves"
METRICS = ("success", "rollouts", "turns")
REFERENCE = "grpo"


def _on_grid(wide: pd.DataFrame, x: str, grid: np.ndarray) -> pd.DataFrame:
    """J per arm and seed interpolated at ``grid`` values of ``x`` (rollouts or turns spent), minus GRPO's."""
    rows = []
    for (arm, seed), curve in wide.groupby(level=["arm", "seed"], sort=False):
        values = np.interp(grid, curve[x].to_numpy(), curve["success"].to_numpy())
        rows += [{"arm": arm, "seed": seed, "x": g, "value": v} for g, v in zip(grid, values)]
    out = pd.DataFrame(rows)
    reference = out[out["arm"] == REFERENCE].set_index(["seed", "x"])["value"]
    out["gain"] = out["value"] - reference.reindex(pd.MultiIndex.from_frame(out[["seed", "x"]])).to_numpy()
    return out


def _curves(ax_abs, ax_gain, wide, arms, x: str, end: float) -> None:
    points = _on_grid(wide, x, np.linspace(0, end, 61))
    absolute = seed_summary(points, ["arm", "x"])
    gain = seed_summary(points.drop(columns="value").rename(columns={"gain": "value"}), ["arm", "x"])
    for arm in arms:
        style = arm_style(arm)
        line = {"color": style.colour, "linestyle": style.linestyle, "label": style.label}
        rows = absolute[absolute["arm"] == arm]
        ax_abs.plot(rows["x"], rows["value"], **line)
        rows = gain[gain["arm"] == arm]
        half = ci95(rows["stderr"], rows["n"])
        ax_gain.plot(rows["x"], rows["value"], **line)
        ax_gain.fill_between(
            rows["x"], rows["value"] - half, rows["value"] + half, color=style.colour, alpha=0.2, linewidth=0
        )


def _final_gains(ax, wide, arms, equal_turns: float) -> None:
    final = wide.groupby(level=["arm", "seed"]).tail(1)
    at_end = _on_grid(wide, "rollouts", np.array([final["rollouts"].min()]))
    at_turns = _on_grid(wide, "turns", np.array([equal_turns]))
    y = np.arange(len(arms))[::-1]
    for points, offset, filled in ((at_end, 0.17, True), (at_turns, -0.17, False)):
        summary = seed_summary(points.drop(columns="value").rename(columns={"gain": "value"}), ["arm"])
        summary = summary.set_index("arm").reindex(arms)
        for i, arm in enumerate(arms):
            style = arm_style(arm)
            ax.errorbar(
                summary["value"].iloc[i],
                y[i] + offset,
                xerr=ci95(summary["stderr"].iloc[i], summary["n"].iloc[i]),
                marker="o" if filled else "s",
                color=style.colour,
                linestyle="none",
                markersize=4.5,
                markerfacecolor=style.colour if filled else "white",
                markeredgecolor="black" if filled else style.colour,
            )
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_yticks(y, [arm_style(a).label for a in arms], fontsize=7)
    ax.yaxis.tick_right()
    ax.grid(axis="y", visible=False)
    ax.set_xlabel("J minus GRPO's J")
    ax.plot(
        [],
        [],
        "o",
        color="grey",
        markeredgecolor="black",
        label=f"after {final['rollouts'].min():.0f} rollouts",
    )
    ax.plot([], [], "s", color="grey", markerfacecolor="white", label=f"at {equal_turns:.0f} turns")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.12), ncols=1)


def shared_rate_runs(results: Results):
    """The default comparison: report seeds at the shared learning rate, step normalised by all leaves
    (older results without a sweep are read whole)."""
    table = results.table(EXPERIMENT, metrics=METRICS, columns=("step", "estimator"))
    if "normalisation" in table:
        lr = results.config(EXPERIMENT, "lr")["lr"]
        keep = (table["normalisation"] == "leaves") & np.isclose(table["lr"], lr) & (table["stage"] == "report")
        table = table[keep]
    return table


def draw(results: Results):
    """The figure, drawn from ``results`` alone, and its caption."""
    table = shared_rate_runs(results)
    if REFERENCE not in set(table["arm"]):
        raise ResultsError(
            results.path(EXPERIMENT, "results.csv"), f"no `{REFERENCE}` arm to compare against"
        )
    details = results.summary(EXPERIMENT)["details"]
    wide = table[table["metric"].isin(METRICS)].pivot_table(
        index=["arm", "seed", "step"], columns="metric", values="value"
    )
    final = wide.groupby(level=["arm", "seed"]).tail(1)
    equal_turns = float(details.get("equal_turns", final["turns"].groupby(level="arm").mean().min()))
    arms = list(dict.fromkeys(table["arm"]))
    flat = [a for a in arms if "+" not in a]  # every policy with the default advantage estimator

    figure, axes = new_mosaic([["a", "b", "e"], ["c", "d", "e"]], height=5.6, width_ratios=[1, 1, 0.9])
    ax_r, ax_t, ax_gr, ax_gt, ax_final = (axes[k] for k in "abcde")
    ax_t.sharey(ax_r)
    ax_gt.sharey(ax_gr)
    _curves(ax_r, ax_gr, wide, flat, "rollouts", float(final["rollouts"].min()))
    _curves(ax_t, ax_gt, wide, flat, "turns", float(final["turns"].min()))
    _final_gains(ax_final, wide, arms, equal_turns)
    ax_r.set_ylabel("success probability J (exact)")
    ax_gr.set_ylabel("J minus GRPO's J (paired)")
    for ax in (ax_gr, ax_gt):
        ax.axhline(0, color="black", linewidth=0.8)
    ax_gr.set_xlabel("rollouts spent")
    ax_gt.set_xlabel("turns spent (equal tokens)")
    titles = (
        "J, equal rollouts",
        "J, equal turns",
        "gain, equal rollouts",
        "gain, equal turns",
        "gain at the end",
    )
    for key, title in zip("abcde", titles):
        panel_label(axes[key], f"{key}  {title}")
    handles, labels = ax_r.get_legend_handles_labels()
    figure.legend(handles, labels, loc="outside lower center", ncols=5, fontsize=7.5)

    config = results.config(EXPERIMENT, "seeds", "steps", "roots", "continuations", "lr")
    paired = details.get("paired", {})
    diff = "; ".join(
        f"at {view.replace('_', ' ')} {d['trace_minus_grpo']:+.3f} ± {d['stderr']:.3f} (± 1 SE)"
        for view, d in paired.items()
    )
    caption = (
        f"Training a tabular softmax policy in an enumerable tree MDP on each allocator's rollouts "
        f"({config['steps']} steps of M (1 + N) = {config['roots'] * (1 + config['continuations'])} rollouts, "
        f"learning rate {config['lr']:g}; within a seed every arm trains on the same tasks). J is the policy's "
        f"exact success probability, averaged over {config['seeds']} seeds. (a, b) J against the rollouts and "
        "against the turns spent (continuations start mid-rollout and cost fewer turns). (c, d) J minus GRPO's J "
        "on the same tasks, with 95% confidence bands of the paired difference (the spread of J between seeds "
        "is mostly task difficulty, shared by every arm). (e) The paired gain after the last step (filled) and "
        "at the turns of the arm that spent fewest (open), for every arm and every advantage estimator run on "
        "TRACE's trees ('..., X advantages'). "
        + (f"TRACE minus GRPO: {diff}. " if diff else "")
        + "DAPO's lead comes from its step size: it averages its gradient over the mixed groups only, about a "
        "quarter of the rollouts, at the same learning rate."
    )
    return figure, caption


if __name__ == "__main__":  # python -m figures.NAME [--results DIR] [--out DIR]
    import sys

    from .cli import main

    sys.exit(main([*sys.argv[1:], __spec__.name.rpartition(".")[2]]))
