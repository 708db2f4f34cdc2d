"""Branching that never waits: eager and pipelined TRACE against lazy TRACE, root-only and GRPO.

(a) Contrast pairs per 1,000 turns against the critical path (turns on the step's longest chain; for
pipelined TRACE, on its wave's, which holds one step's bare rollouts and the previous step's continuations), per arm,
for the learned predictor at the first spread of the run; (b) the value of waiting per predictor: the
share of lazy TRACE's contrast pairs per 1,000 turns that eager TRACE at reserve 0 gives up, per
episode-length spread; (c) learning in the tree MDP: success J against the cumulative critical path, each
arm at its best rate for that view.
"""

from __future__ import annotations

import numpy as np

from .data import Results, seed_summary
from .style import OKABE_ITO, ci95, new_figure, panel_label, percent, shades

MARKERS = "osD^v<>Xp*"

EXPERIMENT = "eager_expansion"
METRICS = ("contrast_pairs_per_1k_turns", "critical_path")


def draw(results: Results):
    """The figure, drawn from ``results`` alone, and its caption."""
    table = results.after_warmup(EXPERIMENT, metrics=METRICS, columns=("predictor", "spread"))
    summary = seed_summary(table, ["predictor", "spread", "arm", "metric"])
    config = results.config(EXPERIMENT, "roots", "continuations", "seeds", "warmup", "batches", "steps")
    data = results.summary(EXPERIMENT)
    predictors = list(dict.fromkeys(table["predictor"]))
    spreads = list(dict.fromkeys(table["spread"]))
    arms = list(dict.fromkeys(table["arm"]))
    predictor = "learned" if "learned" in predictors else predictors[0]
    spread = "mid" if "mid" in spreads else spreads[0]
    figure, axes = new_figure(panels=3, height=2.8)

    ax = axes[0]
    palette = list(OKABE_ITO.values())
    for i, arm in enumerate(arms):
        colour, marker = palette[i % len(palette)], MARKERS[i % len(MARKERS)]
        at = (summary["predictor"] == predictor) & (summary["spread"] == spread) & (summary["arm"] == arm)
        pairs = summary[at & (summary["metric"] == "contrast_pairs_per_1k_turns")]
        path = summary[at & (summary["metric"] == "critical_path")]
        if pairs.empty or path.empty:
            continue
        ax.errorbar(path["value"], pairs["value"], yerr=ci95(pairs["stderr"], pairs["n"]),
                    xerr=ci95(path["stderr"], path["n"]), color=colour, marker=marker, linestyle="none", label=arm)
    ax.set_xlabel("critical path (turns)")
    ax.set_ylabel("contrast pairs per 1k turns")
    panel_label(ax, f"a  {predictor}, {spread} spread")
    ax.legend(fontsize="x-small", loc="best")

    ax = axes[1]
    waiting = data["details"]["value_of_waiting"]
    x = np.arange(len(predictors))
    width = 0.8 / max(len(spreads), 1)
    for i, (sp, colour) in enumerate(zip(spreads, shades(len(spreads)))):
        values = [waiting.get(f"{p}/{sp}", np.nan) for p in predictors]
        ax.bar(x + i * width - 0.4 + width / 2, values, width, color=colour, label=f"{sp} spread")
    ax.axhline(0.0, color="black", linewidth=0.6)
    ax.set_xticks(x, [p.replace("running_mean", "mean") for p in predictors], rotation=20)
    ax.set_ylabel("contrast pairs lost without waiting")
    percent(ax)
    panel_label(ax, "b  value of waiting")
    ax.legend(fontsize="x-small")

    ax = axes[2]
    learning = results.table(EXPERIMENT, metrics=("success",), columns=("step", "lr"))
    learning = learning[learning["part"] == "learning"]
    best = data["details"]["learning"]["equal_critical_path"]["score"]
    report = learning["seed"] < config["report_seeds"]
    for i, (arm, entry) in enumerate(best.items()):
        colour = list(OKABE_ITO.values())[i % len(OKABE_ITO)]
        runs = learning[report & (learning["arm"] == arm) & (learning["lr"] == entry["lr"])]
        wide = runs.pivot_table(index=["seed", "step"], columns="metric", values="value").reset_index()
        curve = wide.groupby("step")[["critical_path", "success"]].mean()
        ax.plot(curve["critical_path"], curve["success"], color=colour, label=f"{arm} (lr {entry['lr']:g})")
    ax.set_xlabel("cumulative critical path (turns)")
    ax.set_ylabel("success J")
    panel_label(ax, "c  tree MDP, best rates")
    ax.legend(fontsize="x-small")

    regime = data["details"]["regime"]
    kept = regime.get(f"{predictor}/{spread}/eager_0.0", {})
    caption = (
        "Eager expansion commits continuations at turn boundaries by the expected utility "
        "1 - w v^k - (1 - w)(1 - v)^k instead of waiting for the factual outcome. "
        f"M = {config['roots']}, N = {config['continuations']}, TRACE priced in tokens; mean over "
        f"{config['seeds']} seeds of batches {config['warmup'] + 1}-{config['batches']}, 95% intervals. "
        f"With the {predictor} predictor ({spread} spread) eager TRACE at reserve 0 keeps "
        f"{kept.get('pairs_kept', float('nan')):.0%} of lazy TRACE's contrast pairs per 1k turns at a critical "
        f"path {kept.get('critical_path_over_grpo', float('nan')):+.2f} turns from GRPO's. "
        f"Panel c: {config['steps']} steps per run in the tree MDP."
    )
    return figure, caption


if __name__ == "__main__":  # python -m figures.NAME [--results DIR] [--out DIR]
    import sys

    from .cli import main

    sys.exit(main([*sys.argv[1:], __spec__.name.rpartition(".")[2]]))
