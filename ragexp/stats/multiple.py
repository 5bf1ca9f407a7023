"""Corrections for many comparisons at once: Holm's step-down adjustment of p-values (for the
tests) and the Bonferroni level of simultaneous intervals (for the bounds)."""

from __future__ import annotations

from collections.abc import Sequence


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm-adjusted p-values, in the order given: the family-wise error rate stays at most α
    when every adjusted p below α is called significant, whatever the tests' dependence."""
    m = len(p_values)
    order = sorted(range(m), key=lambda i: p_values[i])
    adjusted = [0.0] * m
    running = 0.0
    for rank, index in enumerate(order):
        running = max(running, min(1.0, (m - rank) * p_values[index]))
        adjusted[index] = running
    return adjusted


def simultaneous_level(confidence: float, comparisons: int) -> float:
    """The confidence of each of ``comparisons`` intervals so that all of them hold together at
    ``confidence`` (Bonferroni): 1 - (1 - confidence) / comparisons."""
    return 1.0 - (1.0 - confidence) / max(1, comparisons)
