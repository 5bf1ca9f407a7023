"""Paired statistics over per-case differences, vectorized with numpy.

The p-value is a two-sided sign-flip randomization test of "no difference", and the interval
is that same test inverted: it holds every shift ``θ`` that the test, run on the differences
minus ``θ`` with the *same* random sign flips, does not reject. So the interval excludes 0
exactly when ``p < 1 - confidence``, by construction, which a percentile bootstrap beside a
randomization p-value does not promise (it printed a 95% interval excluding 0 beside p 0.13).

The inversion is exact and needs no search over ``θ``. For one draw of signs ``s``, with
``A = Σ s·d``, ``C = Σ s`` and ``D = Σ d``, the permuted statistic ``|A - θC|`` reaches the
observed ``|D - nθ|`` exactly when ``θ`` lies between ``(D - A)/(n - C)`` and ``(D + A)/(n + C)``;
every such segment contains the mean difference, so the count of segments covering ``θ`` rises
and then falls, and the set where the p-value stays at or above ``α`` is one interval whose ends
are order statistics of the segments' ends.

A sign-flip draw only needs how many pairs of each *value* flip, so the differences are grouped
by value first and a draw is one binomial per group. For metrics with few distinct values
(binary accuracy, recall at small K) this is exact. Continuous differences with more than
``MAX_GROUPS`` distinct values are grouped into equal-count quantile bins represented by their
means, which keeps every bin's mean and loses only the within-bin spread (a negligible share of
the variance at that size).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

MAX_GROUPS = 256
SLACK = 1e-9
"""Relative rounding slack on the segments' ends: a permuted statistic that ties the observed one
counts as a tie."""
DRAW_BLOCK = 1 << 18
"""Binomial draws per block (2 MB of int64): memory stays flat in the number of resamples."""


@dataclass(frozen=True)
class PairedStats:
    """Mean paired difference (candidate - baseline) with its uncertainty."""

    n: int
    delta: float
    ci_low: float
    ci_high: float
    p_value: float


def grouped(values: np.ndarray, max_groups: int = MAX_GROUPS) -> tuple[np.ndarray, np.ndarray]:
    """Distinct values and their counts, or quantile bins (mean, count) past ``max_groups``."""
    unique, counts = np.unique(values, return_counts=True)
    if unique.size <= max_groups:
        return unique.astype(np.float64), counts.astype(np.int64)
    ordered = np.sort(values)
    edges = np.linspace(0, ordered.size, max_groups + 1).round().astype(np.int64)
    edges = np.unique(edges)
    sums = np.add.reduceat(ordered, edges[:-1])
    sizes = np.diff(edges)
    return sums / sizes, sizes


def sign_flip_segments(diffs: np.ndarray, *, resamples: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """For each random sign draw, the segment of shifts ``θ`` where it is at least as extreme as
    the observed differences minus ``θ`` (ends may be infinite: all signs equal)."""
    n = diffs.size
    values, counts = grouped(diffs)
    total = float(values @ counts)
    a = np.empty(resamples)
    c = np.empty(resamples)
    # Draws in blocks of rows, so the (resamples, groups) matrix never exists whole. The generator
    # fills the blocks in the order of the whole matrix, and a block is a multiple of 8 rows because
    # BLAS's matrix-vector kernels sum rows in groups (of 4 in OpenBLAS): each row then rounds as it
    # did in one matrix, and a seed keeps giving the same figures to the last bit.
    rows = max(8, DRAW_BLOCK // max(1, counts.size) // 8 * 8)
    for start in range(0, resamples, rows):
        stop = min(start + rows, resamples)
        flips = 2 * rng.binomial(counts, 0.5, size=(stop - start, counts.size)) - counts
        a[start:stop] = flips @ values
        c[start:stop] = flips.sum(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        first = np.where(c < n, (total - a) / (n - c), -np.inf)
        second = np.where(c > -n, (total + a) / (n + c), np.inf)
    low, high = np.minimum(first, second), np.maximum(first, second)
    # All signs alike reproduce the observed statistic for every θ.
    whole = (c == n) | (c == -n)
    low[whole], high[whole] = -np.inf, np.inf
    slack = _slack(values)
    return low - slack, high + slack


def _slack(values: np.ndarray) -> float:
    return SLACK * max(1.0, float(np.abs(values).max(initial=0.0)))


def inverted_interval(
    low: np.ndarray, high: np.ndarray, *, confidence: float, resamples: int
) -> tuple[float, float, float]:
    """(p-value at 0, interval low, interval high) from the segments of :func:`sign_flip_segments`."""
    covering_zero = int(np.count_nonzero((low <= 0.0) & (high >= 0.0)))
    p_value = (1 + covering_zero) / (resamples + 1)
    # θ is kept while (1 + N(θ)) / (B + 1) >= α, i.e. N(θ) >= k segments cover it.
    alpha = 1.0 - confidence
    k = math.ceil(alpha * (resamples + 1) - 1 - 1e-12)
    if k <= 0:
        return p_value, -math.inf, math.inf
    k = min(k, resamples)
    ci_low = float(np.partition(low, k - 1)[k - 1])
    ci_high = float(-np.partition(-high, k - 1)[k - 1])
    return p_value, ci_low, ci_high


def paired_differences(
    diffs: np.ndarray, *, resamples: int, confidence: float, seed: int
) -> tuple[float, float, float] | None:
    """(p-value, ci_low, ci_high) of the mean of ``diffs``; None when there is no pair."""
    if diffs.size == 0:
        return None
    if not np.any(diffs != diffs[0]) and diffs[0] == 0:
        return 1.0, 0.0, 0.0  # every pair equal: no shift is distinguishable from none
    rng = np.random.default_rng(seed)
    low, high = sign_flip_segments(diffs, resamples=resamples, rng=rng)
    p_value, ci_low, ci_high = inverted_interval(low, high, confidence=confidence, resamples=resamples)
    # An end that is 0 but for the tie slack is 0: it was printed as +1.00e-09. Only an end on the
    # side that keeps 0 inside moves, so the interval still holds 0 exactly when p >= 1 - confidence.
    within = 2 * _slack(diffs)
    if 0.0 < ci_high <= within:
        ci_high = 0.0
    if -within <= ci_low < 0.0:
        ci_low = 0.0
    return p_value, ci_low, ci_high


def unit_means(values: np.ndarray, units: np.ndarray) -> np.ndarray:
    """The mean of ``values`` within each unit (a conversation's turns), in order of first appearance."""
    labels, first, inverse = np.unique(units, return_index=True, return_inverse=True)
    sums = np.bincount(inverse, weights=values, minlength=labels.size)
    counts = np.bincount(inverse, minlength=labels.size)
    means = sums / counts
    return means[np.argsort(first, kind="stable")]


def paired_by_unit(
    baseline: np.ndarray,
    candidate: np.ndarray,
    units: np.ndarray,
    *,
    resamples: int,
    confidence: float,
    seed: int,
) -> PairedStats | None:
    """:func:`paired` with a unit (a conversation) as what is paired and resampled: the test and
    interval run on each unit's mean difference over its turns both runs scored, so turns of one
    conversation, which are not independent, count once together. ``n`` is the number of units."""
    both = np.isfinite(baseline) & np.isfinite(candidate)
    if not both.any():
        return None
    means = unit_means(candidate[both] - baseline[both], units[both])
    found = paired_differences(means, resamples=resamples, confidence=confidence, seed=seed)
    if found is None:
        return None
    p_value, low, high = found
    return PairedStats(int(means.size), float(means.mean()), low, high, p_value)


def paired(
    baseline: np.ndarray, candidate: np.ndarray, *, resamples: int, confidence: float, seed: int
) -> PairedStats | None:
    """Statistics over the pairs where both runs have a score; None when there is no pair."""
    both = np.isfinite(baseline) & np.isfinite(candidate)
    diffs = candidate[both] - baseline[both]
    found = paired_differences(diffs, resamples=resamples, confidence=confidence, seed=seed)
    if found is None:
        return None
    p_value, low, high = found
    return PairedStats(int(diffs.size), float(diffs.mean()), low, high, p_value)
