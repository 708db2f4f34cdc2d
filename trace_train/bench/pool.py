"""Pool experiments of ``trace_train.bench.policies`` from their per-seed rows and print the pooled comparison.

    python -m trace_train.bench.pool benchmarks/where_trace_pays/a.json benchmarks/where_trace_pays/b.json

Each file is an evidence (or ``summary.json``) file with ``protocol`` and ``per_seed``. The experiments must
share their protocol in every field but the seeds and the experiment's name (``protocol.POOLABLE``): same
task, arms, comparisons, alpha, grid, steps, budget and evaluation; and no seed may appear in two files (a
report seed of one must not be a report or tuning seed of another), so the pooled pairs are independent.
The pooled rows are compared as one experiment (``protocol.compare``): the primary unadjusted, the
secondaries Holm-adjusted.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from . import protocol as proto


def pool(experiments: list[dict], names=None) -> dict:
    """The pooled experiment of ``experiments`` (each with ``protocol`` and ``per_seed``): its protocol (the
    seeds of all), its rows, comparisons and verdict. ``ProtocolError`` (one line naming the files and the
    field, or the seed) when they cannot be pooled."""
    names = list(names or (f"experiment {i}" for i in range(len(experiments))))
    for name, e in zip(names, experiments):
        if "protocol" not in e or "per_seed" not in e:
            raise proto.ProtocolError(f"{name} has no protocol and per_seed rows (written before the protocol)")
    first = experiments[0]["protocol"]
    for name, e in zip(names[1:], experiments[1:]):
        key = proto.first_difference(first, e["protocol"], skip=proto.POOLABLE)
        if key is not None:
            raise proto.ProtocolError(f"{names[0]} and {name} differ in {key}: {proto.brief(first.get(key))} "
                                      f"against {proto.brief(e['protocol'].get(key))}; only experiments of "
                                      f"one protocol pool")
    owner: dict[int, str] = {}
    for name, e in zip(names, experiments):
        report = {r["seed"] for r in e["per_seed"] if r["stage"] != "tuning"} | set(e["protocol"]["seeds"])
        for seed in sorted(report | set(e["protocol"]["tuning_seeds"])):
            if seed in owner and (seed in report or owner[seed][1]):
                raise proto.ProtocolError(f"seed {seed} is in both {owner[seed][0]} and {name}: pooled "
                                          f"experiments need disjoint seeds")
            owner.setdefault(seed, (name, seed in report))
    rows = [r for e in experiments for r in e["per_seed"]]
    protocol = {**first, "experiment": [e["protocol"]["experiment"] for e in experiments],
                "seeds": sorted(s for e in experiments for s in e["protocol"]["seeds"]),
                "seed_source": [e["protocol"]["seed_source"] for e in experiments],
                "tuning_seeds": sorted({s for e in experiments for s in e["protocol"]["tuning_seeds"]})}
    return {"pooled": names, **proto.evidence_part(rows, protocol)}


def cli(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path, help="evidence files with protocol and per_seed")
    parser.add_argument("--json", type=Path, default=None, help="also write the pooled evidence here")
    args = parser.parse_args(argv)
    if len(args.files) < 2:
        parser.error("pooling needs at least two files")
    try:
        experiments = [json.loads(path.read_text()) for path in args.files]
        pooled = pool(experiments, [str(path) for path in args.files])
    except (OSError, ValueError) as err:
        parser.error(str(err))
    alpha = pooled["protocol"]["alpha"]
    print(f"pooled {len(args.files)} experiments, {len(pooled['protocol']['seeds'])} report seeds:")
    print("\n".join(proto.conclusions(pooled["comparisons"], alpha)))
    print(pooled["verdict"])
    if args.json:
        from . import origin
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({**origin("trace_train.bench.pool", argv), **pooled}, indent=2) + "\n")
        print(f"pooled evidence written to {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(cli())
