"""Benchmark: a judge drift, seen on the canaries and bridged by them (tests/judge_drift_sim.py).

A judge made 0.08 more lenient on borderline answers judges the candidate run; the old judge
judged the baseline. 500 cases, 60 canaries, 1,000 simulations by default.

    .venv/bin/python tests/benchmarks/bench_judge_drift.py [--simulations 1000] [--cases 500] [--canaries 60]

Targets (issue 48): the drift detected with power >= 0.95 at alpha = 0.05; the bridged delta's 95%
interval covers the true system delta in >= 93% of the simulations, where the raw delta's covers
it in almost none.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.judge_drift_sim import simulate


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--simulations", type=int, default=1000)
    parser.add_argument("--cases", type=int, default=500)
    parser.add_argument("--canaries", type=int, default=60)
    parser.add_argument("--drift", type=float, default=0.08)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    started = time.perf_counter()
    figures = simulate(args.simulations, cases=args.cases, canaries=args.canaries, drift=args.drift, seed=args.seed)
    seconds = time.perf_counter() - started
    met = figures.detected >= 0.95 and figures.bridged_coverage >= 0.93 and figures.raw_coverage <= 0.05
    print(json.dumps({**asdict(figures), "seconds": round(seconds, 1), "targets_met": met}, indent=2))
    print(
        f"drift detected in {figures.detected:.1%} of {figures.simulations} (target >= 95%); the true delta "
        f"{figures.true_delta:.4f} covered by the bridged 95% interval in {figures.bridged_coverage:.1%} "
        f"(target >= 93%), by the raw one in {figures.raw_coverage:.1%}",
        file=sys.stderr,
    )
    sys.exit(0 if met else 1)


if __name__ == "__main__":
    main()
