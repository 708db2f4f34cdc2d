"""TRACE's budget shape: M root rollouts against N continuations per root rollout, under three candidate pools.

One row per definition of the candidate pool: a fixed batch of prompts whatever M (the paper's set-up,
as we read it), a pool that grows with M, and one large fixed pool. (left) Mixed prompts per 1,000
rollouts, which filtering cannot inflate; (right) the effective ratio against N, one line per M, with the
paper's (512, 2) 42.4%, (512, 6) 47.8% and (1024, 2) 52.3%.
"""

from __future__ import annotations

from . import paper
from .data import Results, seed_summary
from .style import PAPER, ci95, new_figure, panel_label, percent, shades

EXPERIMENT = "ablation"
METRICS = ("mixed_prompts_per_1k_rollouts", "effective_ratio")
LABELS = {
    "effective_ratio": "effective ratio",
    "mixed_prompts_per_1k_rollouts": "mixed prompts / 1,000 rollouts",
}
MODES = {
    "prompt_set": "fixed prompt batch (paper)",
    "scaled": "pool grows with M",
    "fixed": "one large fixed pool",
}


def draw(results: Results):
    """The figure, drawn from ``results`` alone, and its caption."""
    table = results.after_warmup(EXPERIMENT, metrics=METRICS, columns=("study", "roots", "continuations"))
    table = table[(table["study"] == "shape") & table["metric"].isin(METRICS)]
    if "pool_mode" not in table:
        table = table.assign(pool_mode="fixed")
    summary = seed_summary(table, ["pool_mode", "roots", "continuations", "metric"])
    modes = [m for m in MODES if m in set(summary["pool_mode"])]
    roots = sorted(summary["roots"].unique())
    colours = dict(zip(roots, shades(len(roots))))
    figure, axes = new_figure(panels=2, rows=len(modes), height=2.2 * len(modes) + 0.6, sharex=True)
    config = results.config(EXPERIMENT, "pool", "seeds", "warmup", "batches")
    details = results.summary(EXPERIMENT)["details"]
    pools = details.get("pools", {})
    for row, mode in enumerate(modes):
        for col, metric in enumerate(METRICS):
            ax = axes[2 * row + col]
            for m in roots:
                rows = summary[
                    (summary["pool_mode"] == mode) & (summary["roots"] == m) & (summary["metric"] == metric)
                ].sort_values("continuations")
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
            ax.set_ylabel(LABELS[metric], fontsize=7.5)
            if metric == "effective_ratio":
                for (m, n), value in paper.SHAPE_RATIO.items():
                    if m in colours:
                        ax.plot(n, value, zorder=5, **PAPER)
                ax.set_ylim(0, 1)
                percent(ax)
            pool_text = "/".join(str(v) for v in pools.get(mode, {}).values())
            panel_label(
                ax,
                f"{'abcdefgh'[2 * row + col]}  {MODES[mode]}"
                + (f", pool {pool_text}" if pool_text and col else ""),
            )
            if row == len(modes) - 1:
                ax.set_xlabel("N: continuations per root rollout")
                ax.set_xticks(sorted(summary["continuations"].unique()))
    if any(m in colours for m, _ in paper.SHAPE_RATIO):
        axes[1].plot([], [], linestyle="none", label="paper (M, N), multi-hop QA", **PAPER)
    axes[1].legend(loc="lower right", fontsize=7)

    paper_mode = details.get("budget_shapes_pool_mode", modes[0])
    shapes = details.get("budget_shapes_by_pool", {}).get(paper_mode, details.get("budget_shapes", {}))
    ours = "; ".join(
        f"({m}, {n}) {shapes[f'M={m},N={n}']['effective_ratio']:.1%}, "
        f"{shapes[f'M={m},N={n}']['mixed_prompts_per_1k_rollouts']:.0f} per 1,000 rollouts"
        for m, n in paper.SHAPE_RATIO
        if f"M={m},N={n}" in shapes and "mixed_prompts_per_1k_rollouts" in shapes[f"M={m},N={n}"]
    )
    caption = (
        "Budget shape of TRACE (learned predictor): M root rollouts and N continuations per root rollout, "
        "M (1 + N) rollouts per batch, under three candidate pools (rows; candidate prompts per batch for each M in the right titles): "
        "a fixed batch of prompts whatever M (the usual RL set-up and our reading of the paper's, where M sets the "
        "rollouts per prompt), a pool that grows in proportion to M, and one large fixed pool "
        f"({config['pool']} prompts; a smaller M is then more selective, which shrinks the effective ratio's "
        f"denominator). Mean over {config['seeds']} seeds of batches {config['warmup'] + 1}-{config['batches']}; "
        "bands: 95% confidence intervals. Left: mixed prompts per 1,000 rollouts; right: effective ratio, open "
        "diamonds the paper's (512, 2) 42.4%, (512, 6) 47.8%, (1024, 2) 52.3% (multi-hop QA, Qwen3-8B). "
        + (
            f"Measured at the paper's shapes with a fixed prompt batch: {ours}."
            if ours
            else "The paper's shapes are not in this grid."
        )
    )
    return figure, caption


if __name__ == "__main__":  # python -m figures.NAME [--results DIR] [--out DIR]
    import sys

    from .cli import main

    sys.exit(main([*sys.argv[1:], __spec__.name.rpartition(".")[2]]))
