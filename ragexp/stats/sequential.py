"""Anytime-valid confidence sequences for the mean of a bounded per-case value.

A confidence sequence is a sequence of intervals, one after each case, that all hold the true
mean at once with probability at least ``1 - α``. It may be looked at after every case and the
evaluation stopped whenever it says enough: the interval at the stop is as valid as a fixed-n
interval of a sample size chosen in advance, which peeking at a fixed-n interval is not.

The sequence is the betting one of Waudby-Smith and Ramdas ("Estimating means of bounded random
variables by betting", JRSS B 2024), with the hedged capital process and the predictable plug-in
bets of their section 4. For each candidate mean ``m`` on a grid over [0, 1], two gamblers bet that
the mean is above / below ``m``; their capital is

    K⁺ₜ(m) = Π (1 + λ⁺ᵢ(m)(xᵢ - m)),   K⁻ₜ(m) = Π (1 - λ⁻ᵢ(m)(xᵢ - m)),

with the bet ``λᵢ`` chosen from the cases before ``i`` only. Under the true mean each capital is a
non-negative martingale, so by Ville's inequality the hedged capital ``(K⁺ + K⁻)/2`` reaches
``1/α`` with probability at most α, ever. The sequence at ``t`` is every ``m`` whose capital is
still below ``1/α``, intersected with the sequence before it. Of the published sequences for
bounded means it is the tightest in practice: it adapts to the observed variance like an
empirical-Bernstein sequence, and unlike one it needs no union bound over time nor any tuning
of an intrinsic time. It holds for any distribution on [0, 1], so it is valid for scores on a
scale, pass/fail scores and their differences alike.

A paired difference ``d = candidate - baseline`` of a metric bounded in ``[low, high]`` lies in
``[-w, w]`` with ``w = high - low``; ``(d + w) / 2w`` maps it onto [0, 1] and the sequence of its
mean maps back. The cases are taken in a seeded random order, so they are exchangeable draws of
the cases' population and the sequence bounds that population's mean paired difference, the
same quantity the fixed-n sign-flip interval bounds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

BISECTIONS = 30
"""Halvings of each end's search: the ends are exact to 1e-9 of the metric's range."""
MAX_BET = 0.75
"""Largest share of its capital a gambler stakes (the paper's ``c``): bets stay predictable and the
capital cannot be wiped out by one case."""
EPSILON = 1e-9

METHOD = "betting confidence sequence (Waudby-Smith & Ramdas, hedged capital)"


@dataclass(frozen=True)
class ConfidenceSequence:
    """The confidence sequence of a mean at each look: ``[low[j], high[j]]`` after the first
    ``looks[j]`` cases."""

    looks: np.ndarray
    low: np.ndarray
    high: np.ndarray

    def last(self) -> tuple[float, float]:
        """The interval at the last look."""
        return float(self.low[-1]), float(self.high[-1])


def bets(x: np.ndarray, alpha: float, horizon: int | None = None) -> np.ndarray:
    """The predictable plug-in bet of each case (section 4 of the paper): from the mean and the
    variance of the cases before it, never of the case itself."""
    n = x.size
    t = np.arange(1, n + 1, dtype=np.float64)
    means = (0.5 + np.cumsum(x)) / (t + 1)
    previous_means = np.concatenate(([0.5], means[:-1]))
    variances = (0.25 + np.cumsum((x - previous_means) ** 2)) / (t + 1)
    previous_variances = np.concatenate(([0.25], variances[:-1]))
    spread = t * np.log1p(t) if horizon is None else np.full(n, float(horizon))
    raw = np.sqrt(2 * math.log(2 / alpha) / (previous_variances * spread))
    return np.asarray(raw)


def log_capital(x: np.ndarray, lam: np.ndarray, m: np.ndarray) -> np.ndarray:
    """log of the hedged capital ``(K⁺ + K⁻)/2`` after the cases ``x`` (with their bets ``lam``),
    at each mean of ``m``."""
    with np.errstate(divide="ignore"):
        cap_up = np.where(m > 0, MAX_BET / np.maximum(m, 1e-300), np.inf)
        cap_down = np.where(m < 1, MAX_BET / np.maximum(1 - m, 1e-300), np.inf)
    diff = x[:, None] - m[None, :]
    # Each factor stays positive at every m: λ⁺ ≤ c/m, λ⁻ ≤ c/(1 - m).
    up = np.log1p(np.minimum(lam[:, None], cap_up[None, :]) * diff).sum(axis=0)
    down = np.log1p(-np.minimum(lam[:, None], cap_down[None, :]) * diff).sum(axis=0)
    return np.asarray(np.logaddexp(up, down) - math.log(2))


def confidence_sequence(
    x: np.ndarray, alpha: float, looks: np.ndarray | None = None, horizon: int | None = None
) -> ConfidenceSequence:
    """The betting sequence of the mean of ``x`` (each value in [0, 1]) at each of ``looks`` (case
    counts, rising; default: after every case), each interval intersected with those before it.

    Each end is found by bisection from the running mean outwards: the hedged capital falls
    towards the running mean and rises away from it, so the set it keeps is one interval."""
    values = np.clip(np.asarray(x, dtype=np.float64), 0.0, 1.0)
    n = values.size
    at = np.arange(1, n + 1) if looks is None else np.asarray(looks, dtype=np.int64)
    if at.size == 0 or n == 0:
        return ConfidenceSequence(np.empty(0, dtype=np.int64), np.empty(0), np.empty(0))
    lam = bets(values, alpha, horizon)
    threshold = math.log(1 / alpha)
    low, high = np.empty(at.size), np.empty(at.size)
    for j, look in enumerate(at):
        seen, bet = values[:look], lam[:look]
        centre = float(seen.mean())
        if log_capital(seen, bet, np.array([centre]))[0] >= threshold:
            # The running mean rejected too (probability at most α): the look says nothing.
            low[j], high[j] = 0.0, 1.0
            continue
        outer = np.array([0.0, 1.0])
        kept_outer = log_capital(seen, bet, outer) < threshold  # the range's end itself is kept
        near, far = np.full(2, centre), outer.copy()
        for _ in range(BISECTIONS):
            middle = (near + far) / 2
            kept = log_capital(seen, bet, middle) < threshold
            near, far = np.where(kept, middle, near), np.where(kept, far, middle)
        # The rejected side of the last step: conservative by at most 2^-BISECTIONS.
        ends = np.where(kept_outer, outer, far)
        low[j], high[j] = ends
    low, high = np.maximum.accumulate(low), np.minimum.accumulate(high)
    crossed = low > high  # the intersection emptied (probability at most α): its middle
    if crossed.any():
        middle = (low + high) / 2
        low, high = np.where(crossed, middle, low), np.where(crossed, middle, high)
    return ConfidenceSequence(at, low, high)


def difference_sequence(
    diffs: np.ndarray, width: float, alpha: float, looks: np.ndarray | None = None
) -> ConfidenceSequence:
    """The sequence of the mean paired difference of a metric spanning ``width`` (``high - low``):
    each difference mapped from ``[-width, width]`` onto [0, 1] and the bounds mapped back."""
    mapped = (np.asarray(diffs, dtype=np.float64) + width) / (2 * width)
    found = confidence_sequence(mapped, alpha, looks)
    return ConfidenceSequence(found.looks, found.low * 2 * width - width, found.high * 2 * width - width)


def mean_sequence(
    values: np.ndarray, low: float, width: float, alpha: float, looks: np.ndarray | None = None
) -> ConfidenceSequence:
    """The sequence of the mean of values in ``[low, low + width]``."""
    found = confidence_sequence((np.asarray(values, dtype=np.float64) - low) / width, alpha, looks)
    return ConfidenceSequence(found.looks, found.low * width + low, found.high * width + low)


Decision = Literal["passed", "failed", "open"]


def drop_decision(low: float, high: float, allowed: float, direction: str) -> Decision:
    """A ``max_drop`` rule on the interval [low, high] of the mean difference candidate - baseline:
    failed when even its least-worse end is worse than allowed, passed when its worst end is
    not, open while it reaches both sides of the bound."""
    worst, least = (-low, -high) if direction == "higher" else (high, low)
    if least > allowed + EPSILON:
        return "failed"
    if worst <= allowed + EPSILON:
        return "passed"
    return "open"


def bound_decision(low: float, high: float, kind: str, threshold: float) -> Decision:
    """A ``min`` / ``max`` rule on the interval [low, high] of the candidate's mean."""
    if kind == "min":
        return "failed" if high < threshold - EPSILON else "passed" if low >= threshold - EPSILON else "open"
    return "failed" if low > threshold + EPSILON else "passed" if high <= threshold + EPSILON else "open"
