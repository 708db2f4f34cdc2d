"""What fitting the success predictor costs a step: GRPO with and without the fit, on the CPU demo.

    python -m trace_train.bench_fit                    # grpo, 8 steps each way, about 2 min on 2 cores
    python -m trace_train.bench_fit --policy trace     # TRACE always fits (it allocates by V~)

Each run is the ``cpu_demo`` preset without evaluation; ``log_predictor=true`` makes a policy that does
not read V~ fit it anyway (what every policy did before the fit became conditional). Reported: the mean
``rollout_seconds`` and ``train_seconds`` (advantages, predictor fit, policy update, weight sync) per
step, leaving out the first step (warm-up). Timings depend on the machine's load: note ``uptime``.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

import numpy as np

from .config import load_config
from .metrics_log import read_metrics
from .train import TrainConfig, main as train


def measure(policy: str, steps: int, fit: bool, root: Path) -> dict:
    run_dir = root / f"{policy}-fit{int(fit)}"
    cfg = load_config(TrainConfig, "cpu_demo", [f"run_dir={run_dir}", f"steps={steps}", "eval.every=0",
                                                "tensorboard=false", f"rollout.policy={policy}",
                                                f"log_predictor={str(fit).lower()}", f"checkpoint_every={steps}"])
    train(cfg)
    rows = read_metrics(run_dir / "metrics.jsonl")[1:]
    return {"policy": policy, "fits_predictor": cfg.fits_predictor,
            "rollout_seconds": float(np.mean([r["rollout_seconds"] for r in rows])),
            "train_seconds": float(np.mean([r["train_seconds"] for r in rows]))}


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", default="grpo")
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for fit in (True, False):
            results.append(measure(args.policy, args.steps, fit, Path(tmp)))
            print(json.dumps(results[-1]), flush=True)
    print(f"load average: {os.getloadavg()}")
    return results


if __name__ == "__main__":
    main()
