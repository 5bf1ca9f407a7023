"""Benchmark: `ragexp run --until-decided` in simulation, 500 pairs, against the fixed-n run.

    .venv/bin/python tests/benchmarks/bench_sequential.py [--pairs 500] [--trials 500] [--batch 0.1]

Each trial draws ``--pairs`` paired differences candidate - baseline of a [0, 1] metric and looks
at the anytime-valid betting sequence of ``ragexp.stats.sequential`` after every batch (10% of
the pairs by default), as a sequential run does with one ``max_drop`` rule, stopping at the first
batch where the rule is decided. The fixed-n run evaluates every pair. Two kinds of metric:
graded (a score on a scale: differences of sd 0.15) and pass/fail (30% of the pairs change their
verdict, -1 or +1). Per scenario it prints the false-fail rate, the share of trials decided
passed / failed / inconclusive, the median share of the cases evaluated, and the judge calls
saved against the fixed-n run: a judge metric costs one call per case evaluated (a sequential run
asks the judge once per case, however many times it decides), so the calls saved are the share
of cases not evaluated. Targets (issue 37), at 500 pairs: with no drop, a false-fail rate at most
α + 0.02; with a true drop twice the margin, a median of at most 40% of the cases evaluated.
Last, the seconds the gate takes to recompute the sequence of a 100,000-case run.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ragexp.stats.sequential import difference_sequence, drop_decision

ALPHA = 0.05
JUDGE_METRICS = 2
"""Judge metrics per case in the cost figure (faithfulness and answer relevancy, say)."""


def graded(rng: np.random.Generator, n: int, mean: float) -> np.ndarray:
    return np.clip(mean + 0.15 * rng.standard_normal(n), -1.0, 1.0)


def pass_fail(rng: np.random.Generator, n: int, mean: float) -> np.ndarray:
    u = rng.random(n)
    return np.where(u < 0.15 + mean / 2, 1.0, np.where(u < 0.3, -1.0, 0.0))


def trial(diffs: np.ndarray, margin: float, batch: int) -> tuple[str, int]:
    looks = np.unique(np.append(np.arange(batch, diffs.size, batch), diffs.size))
    sequence = difference_sequence(diffs, 1.0, ALPHA, looks)
    for j, look in enumerate(looks):
        decided = drop_decision(float(sequence.low[j]), float(sequence.high[j]), margin, "higher")
        if decided != "open":
            return decided, int(look)
    return "inconclusive", int(diffs.size)


def scenario(name: str, draw: object, mean: float, margin: float, args: argparse.Namespace, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    batch = max(1, round(args.batch * args.pairs))
    results = [trial(draw(rng, args.pairs, mean), margin, batch) for _ in range(args.trials)]  # type: ignore[operator]
    decisions = [d for d, _ in results]
    used = np.array([n for _, n in results])
    share = {d: decisions.count(d) / args.trials for d in ("passed", "failed", "inconclusive")}
    median = float(np.median(used)) / args.pairs
    saved = 1.0 - float(used.mean()) / args.pairs
    fixed_calls = args.pairs * JUDGE_METRICS
    print(
        f"{name:46} {share['failed']:>6.3f} {share['passed']:>6.3f} {share['inconclusive']:>6.3f} "
        f"{median:>8.0%} {fixed_calls:>7,} {used.mean() * JUDGE_METRICS:>9,.0f} {saved:>7.0%}"
    )
    return {"failed": share["failed"], "median": median, "saved": saved}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=500)
    parser.add_argument("--trials", type=int, default=500)
    parser.add_argument("--batch", type=float, default=0.1)
    args = parser.parse_args()
    started = time.perf_counter()
    print(f"{args.pairs} pairs, {args.trials} trials, batches of {args.batch:.0%}, α {ALPHA}")
    print(
        f"{'scenario (kind, true change, allowed drop)':46} {'fail':>6} {'pass':>6} {'open':>6} "
        f"{'median n':>8} {'fixed':>7} {'sequent.':>9} {'saved':>7}"
    )
    found = {
        "none_0": scenario("graded, no drop, max_drop 0", graded, 0.0, 0.0, args, 1),
        "none_05": scenario("graded, no drop, max_drop 0.05", graded, 0.0, 0.05, args, 2),
        "at_margin": scenario("graded, drop 0.05 = the margin, max_drop 0.05", graded, -0.05, 0.05, args, 3),
        "twice": scenario("graded, drop 0.10 = twice the margin", graded, -0.10, 0.05, args, 4),
        "pf_none": scenario("pass/fail, no drop, max_drop 0", pass_fail, 0.0, 0.0, args, 5),
        "pf_twice": scenario("pass/fail, drop 0.20 = twice the margin 0.10", pass_fail, -0.20, 0.10, args, 6),
    }
    print(f"(judge calls: {JUDGE_METRICS} judge metrics, one call per metric and case evaluated; means per trial)")
    print()
    false_fail = max(found["none_0"]["failed"], found["pf_none"]["failed"])
    print(f"target: no drop fails at most α + 0.02 = {ALPHA + 0.02:.2f}: {false_fail:.3f}", end=" ")
    print("ok" if false_fail <= ALPHA + 0.02 else "MISSED")
    print(f"target: drop twice the margin, median evaluated <= 40%: {found['twice']['median']:.0%}", end=" ")
    print("ok" if found["twice"]["median"] <= 0.4 else "MISSED")
    big = graded(np.random.default_rng(7), 100_000, -0.01)
    timer = time.perf_counter()
    difference_sequence(big, 1.0, ALPHA, np.arange(10_000, 100_001, 10_000))
    print(f"the gate's sequence of a 100,000-case run in 10 batches: {time.perf_counter() - timer:.2f} s")
    print(f"({time.perf_counter() - started:.0f} s in all)")


if __name__ == "__main__":
    main()
