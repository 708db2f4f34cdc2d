"""Where the budget goes: rollouts by the depth of the anchor they start from and by that anchor's true V.

GRPO spends every rollout at depth 0 (the prompt), spread over whatever prompts it drew; TRACE moves
rollouts to prompts and prefixes whose V is neither 0 nor 1 and to intermediate turns.
"""

from __future__ import annotations

import numpy as np

from .data import Results, seed_summary
from .style import arm_style, ci95, new_figure, panel_label, percent

EXPERIMENT = "effective_ratio"
ARMS = ("grpo", "trace", "trace[oracle]")
DEPTH = "rollout_share_depth_"
V_BIN = "rollout_share_v_"


def _shares(table, prefix: str):
    """Mean share per (arm, metric) over seeds; a depth a batch never reached counts as a share of 0."""
    rows = table[table["metric"].str.startswith(prefix)]
    wide = rows.pivot_table(index=["arm", "seed", "batch"], columns="metric", values="value", fill_value=0.0)
    long = wide.stack().rename("value").reset_index()
    return seed_summary(long, ["arm", "metric"])


def _bars(ax, summary, arms, positions, keys, *, span: float = 1.0) -> None:
    """Grouped bars, one group per metric at ``positions`` (``span`` apart), one bar per arm."""
    width = 0.8 * span / len(arms)
    for i, arm in enumerate(arms):
        rows = summary[summary["arm"] == arm].set_index("metric").reindex(keys)
        style = arm_style(arm)
        ax.bar(
            positions + (i - (len(arms) - 1) / 2) * width,
            rows["value"],
            width,
            yerr=ci95(rows["stderr"], rows["n"]),
            label=style.label,
            **style.bar(),
        )
    percent(ax)


def draw(results: Results):
    """The figure, drawn from ``results`` alone, and its caption."""
    table = results.after_warmup(EXPERIMENT, metrics=(f"{DEPTH}0", f"{V_BIN}0.0_0.1"), columns=("view",))
    table = table[table["view"] == "equal_rollouts"]
    arms = [a for a in ARMS if a in set(table["arm"])]
    table = table[table["arm"].isin(arms)]
    figure, (ax_depth, ax_v) = new_figure(panels=2, height=2.9)

    depth = _shares(table, DEPTH)
    keys = sorted(set(depth["metric"]), key=lambda m: int(m.removeprefix(DEPTH)))
    _bars(ax_depth, depth, arms, np.arange(len(keys)), keys)
    ax_depth.set_xticks(np.arange(len(keys)), [m.removeprefix(DEPTH) for m in keys])
    ax_depth.set_xlabel("anchor depth (turns; 0 = the prompt)")
    ax_depth.set_ylabel("share of the batch's rollouts")
    ax_depth.legend(loc="upper right")
    panel_label(ax_depth, "a  by anchor depth")

    by_v = _shares(table, V_BIN)
    keys = sorted(set(by_v["metric"]))
    edges = np.array([[float(x) for x in m.removeprefix(V_BIN).split("_")] for m in keys])
    _bars(ax_v, by_v, arms, edges.mean(axis=1), keys, span=float(np.diff(edges[0])[0]))
    ax_v.set_xlim(0, 1)
    ax_v.set_xlabel("anchor's true success probability V (bins of 0.1)")
    panel_label(ax_v, "b  by the anchor's V")

    config = results.config(EXPERIMENT, "roots", "continuations", "seeds", "warmup", "batches")
    continued = depth[(depth["metric"] != f"{DEPTH}0")].groupby("arm")["value"].sum()
    moved = ", ".join(f"{arm_style(a).label} {continued.get(a, 0.0):.0%}" for a in arms)
    caption = (
        f"Where the budget of M (1 + N) = {config['roots'] * (1 + config['continuations'])} rollouts per batch "
        f"goes (equal-rollout runs of the effective-ratio experiment; mean over {config['seeds']} seeds of "
        f"batches {config['warmup'] + 1}-{config['batches']}, 95% confidence intervals). (a) Share of "
        "rollouts by the depth of the anchor they were sampled from: depth 0 is a bare rollout from the "
        f"prompt, deeper anchors are prefixes that continuations branch from (share started from a prefix: "
        f"{moved}). (b) Share of rollouts by the true success probability V of their anchor (the prompt for "
        "a bare rollout, the prefix for a continuation). The simulator records the anchor's true V, not the "
        "predictor's estimate: for TRACE (oracle V) the two coincide."
    )
    return figure, caption


if __name__ == "__main__":  # python -m figures.NAME [--results DIR] [--out DIR]
    import sys

    from .cli import main

    sys.exit(main([*sys.argv[1:], __spec__.name.rpartition(".")[2]]))
