"""Benchmark: per-hop scoring of two-hop cases against the single-hop path, in one process.

100,000 generated two-hop cases (ids as gold, one per hop; each case's system output holds two
retrieval calls of K=5 ids, the second missing its hop's gold in a quarter of the cases, and the
merged ranking of both as the case's own). The single-hop path is what a run scores for every
case whatever its hops (:func:`ragexp.metrics.offline.build_inputs`, the retrieval and answer
kernels, their rationales); the per-hop path is what a multi-hop set adds
(:func:`ragexp.metrics.hops.count_hops`, the per-hop kernels, ``first_failing_hop``, their
rationales). The two alternate; the ratio is the median over the repetitions of the per-hop
path's CPU time over the single-hop path's, measured in the same run.

    .venv/bin/python tests/benchmarks/bench_hops.py [--cases 100000] [--repeat 3]

Target (issue 49): per-hop scoring costs at most 1.3x the single-hop path.
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import time

from ragexp.metrics.hops import count_hops, fill_hop_rationales, hop_columns, hop_scores
from ragexp.metrics.offline import build_inputs
from ragexp.metrics.reasons import fill_rationales
from ragexp.metrics.registry import hop_metrics, parse_metric_names
from ragexp.metrics.summary import score_cases
from ragexp.records import Case, CaseResult, Hop, HopRetrieval, SystemOutput

TARGET = 1.30
K = 5
REFUSALS = ["没有足够证据"]


def generate(count: int, seed: int = 0) -> tuple[list[Case], list[CaseResult]]:
    rng = random.Random(seed)
    cases: list[Case] = []
    results: list[CaseResult] = []
    for i in range(count):
        product, maker = f"p{rng.randrange(10**6)}", f"m{rng.randrange(10**6)}"
        first = [product, *(f"x{rng.randrange(10**6)}" for _ in range(K - 1))]
        second = [f"y{rng.randrange(10**6)}" for _ in range(K - 1)]
        second.insert(rng.randrange(K), maker if rng.random() > 0.25 else f"z{i}")
        rng.shuffle(first)
        case = Case(f"c{i}", f"问题 {i}：{product} 的厂家在哪？", [product, maker], ["杭州"], None, False, i + 1)
        case.hops = [Hop([product], [], maker), Hop([maker])]
        output = SystemOutput([*second, *first], [], "在杭州。[1]", [1], 0.1)
        output.retrievals = [HopRetrieval(case.question, first), HopRetrieval(maker, second)]
        cases.append(case)
        results.append(CaseResult(case.id, output))
    return cases, results


def single_hop(cases: list[Case], results: list[CaseResult]) -> float:
    specs = parse_metric_names(["recall_at_k", "mrr", "ndcg_at_k", "citation_precision", "answer_accuracy"])
    started = time.process_time()
    inputs = build_inputs(cases, results, K, REFUSALS)
    scores = score_cases(specs, inputs)
    fill_rationales(specs, cases, results, scores, inputs, refusal_phrases=REFUSALS, language="en")
    return time.process_time() - started


def per_hop(cases: list[Case], results: list[CaseResult]) -> float:
    specs = hop_metrics(2)
    started = time.process_time()
    counts = count_hops(cases, results, K)
    scores = {**hop_scores(counts), **hop_columns(counts)}
    fill_hop_rationales(specs, cases, results, counts, "en")
    assert len(scores) >= 8
    return time.process_time() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    cases, results = generate(args.cases)
    ratios, singles, hops = [], [], []
    for _ in range(args.repeat):
        for result in results:
            result.rationale.clear()
        gc.collect()
        one = single_hop(cases, results)
        gc.collect()
        many = per_hop(cases, results)
        singles.append(one)
        hops.append(many)
        ratios.append(many / one)
    ratio = statistics.median(ratios)
    print(f"{args.cases:,} two-hop cases, K={K}, {args.repeat} repetitions (CPU seconds, median)")
    print(f"single-hop path  {statistics.median(singles):8.3f} s")
    print(f"per-hop path     {statistics.median(hops):8.3f} s")
    print(f"ratio per-hop / single-hop: {ratio:.3f} (each repetition: {', '.join(f'{r:.3f}' for r in ratios)})")
    print(f"target <= {TARGET:.2f}: {'met' if ratio <= TARGET else 'NOT met'}")
    raise SystemExit(0 if ratio <= TARGET else 1)


if __name__ == "__main__":
    main()
