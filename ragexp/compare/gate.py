"""``ragexp gate``: every rule checked, every failure reported, direction-aware."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ragexp.compare.data import RunData
from ragexp.compare.diff import DiffResult, MetricDiff, compute_diff
from ragexp.config.models import GateRule, GatesConfig
from ragexp.metrics.registry import METRICS

EPSILON = 1e-9
"""Float slack: .76 - .75 must not fail a bound of .01 through rounding."""


@dataclass
class Failure:
    metric: str
    rule: str
    baseline: float | None
    candidate: float | None
    threshold: float | None
    message: str

    def to_json(self) -> dict[str, Any]:
        return {
            "metric": self.metric,
            "rule": self.rule,
            "baseline": self.baseline,
            "candidate": self.candidate,
            "threshold": self.threshold,
            "message": self.message,
        }


@dataclass
class GateResult:
    gates: str
    baseline: str
    candidate: str
    failures: list[Failure]
    checked: int
    """How many rule checks were made."""

    @property
    def passed(self) -> bool:
        return not self.failures

    def to_json(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "baseline": self.baseline,
            "candidate": self.candidate,
            "gates": self.gates,
            "failures": [f.to_json() for f in self.failures],
        }


def evaluate_gate(gates: GatesConfig, diff: DiffResult) -> GateResult:
    """Check the candidate of ``diff`` against every rule of ``gates``."""
    metrics = {m.name: m for m in diff.metrics}
    errored = diff.candidate.errored
    failures, checked = check_rules(gates, metrics, int(errored.sum()), int(errored.size))
    return GateResult(gates.name, diff.baseline.run_id, diff.candidate.run_id, failures, checked)


def gate_runs(
    gates: GatesConfig, baseline: RunData, candidate: RunData, *, allow_incomparable: bool = False
) -> tuple[DiffResult, GateResult]:
    """Compare (statistics as the gates ask) and check every rule."""
    diff = compute_diff(
        baseline,
        candidate,
        resamples=gates.resamples,
        confidence=gates.confidence,
        seed=gates.seed,
        top=0,
        allow_incomparable=allow_incomparable,
    )
    return diff, evaluate_gate(gates, diff)


def check_rules(
    gates: GatesConfig, metrics: dict[str, MetricDiff], errored: int, total: int
) -> tuple[list[Failure], int]:
    """Every failure (not just the first) and the number of checks made."""
    failures: list[Failure] = []
    checked = 0
    if gates.max_error_rate is not None:
        checked += 1
        rate = errored / total if total else 0.0
        if rate > gates.max_error_rate + EPSILON:
            baseline = metrics["error_rate"].baseline if "error_rate" in metrics else None
            failures.append(
                Failure(
                    "error_rate",
                    "max_error_rate",
                    baseline,
                    rate,
                    gates.max_error_rate,
                    f"{errored} of {total} candidate cases errored ({rate:.2%} > {gates.max_error_rate:.2%}): "
                    "their scores are missing, not zero",
                )
            )
    for name, rule in gates.rules.items():
        for kind, threshold in _bounds(rule):
            checked += 1
            failure = _check(name, kind, threshold, rule, metrics.get(name))
            if failure is not None:
                failures.append(failure)
    return failures, checked


def _bounds(rule: GateRule) -> list[tuple[str, float]]:
    pairs = [
        ("max_drop", rule.max_drop),
        ("max_increase_ratio", rule.max_increase_ratio),
        ("min", rule.min),
        ("max", rule.max),
    ]
    return [(kind, value) for kind, value in pairs if value is not None]


def _check(name: str, kind: str, threshold: float, rule: GateRule, metric: MetricDiff | None) -> Failure | None:
    spec = METRICS.get(name)
    direction = spec.direction if spec else "higher"
    base = metric.baseline if metric else None
    cand = metric.candidate if metric else None

    def fail(message: str) -> Failure:
        return Failure(name, kind, base, cand, threshold, message)

    if metric is None or cand is None:
        return fail(f"{name}: the candidate has no score for it, so '{kind}' cannot pass")
    if kind == "min":
        return fail(f"{name}: {cand:.4g} is below the floor {threshold:g}") if cand < threshold - EPSILON else None
    if kind == "max":
        return fail(f"{name}: {cand:.4g} is above the ceiling {threshold:g}") if cand > threshold + EPSILON else None
    if base is None:
        return fail(f"{name}: the baseline has no score for it, so '{kind}' cannot be checked")
    worse_by = base - cand if direction == "higher" else cand - base
    if kind == "max_drop":
        if rule.statistical:
            return _statistical_drop(name, threshold, metric, direction, fail)
        if worse_by > threshold + EPSILON:
            return fail(f"{name}: {base:.4g} -> {cand:.4g}, worse by {worse_by:.4g} (allowed {threshold:g})")
        return None
    # max_increase_ratio: relative move in the bad direction.
    if base == 0:
        if worse_by > EPSILON:
            return fail(f"{name}: {base:.4g} -> {cand:.4g}, worse from zero (allowed ratio {threshold:g})")
        return None
    ratio = worse_by / abs(base)
    if ratio > threshold + EPSILON:
        return fail(f"{name}: {base:.4g} -> {cand:.4g}, {ratio:+.1%} worse (allowed {threshold:.0%})")
    return None


def _statistical_drop(
    name: str, threshold: float, metric: MetricDiff, direction: str, fail: Callable[[str], Failure]
) -> Failure | None:
    """Fail only when the whole confidence interval of the paired difference is beyond the bound."""
    if metric.ci_low is None or metric.ci_high is None:
        return fail(f"{name}: no paired cases to test the drop on")
    # The interval end closest to "no change", expressed as how much worse the candidate is.
    least_worse = -metric.ci_high if direction == "higher" else metric.ci_low
    if least_worse > threshold + EPSILON:
        return fail(
            f"{name}: paired difference interval [{metric.ci_low:+.4g}, {metric.ci_high:+.4g}] lies wholly "
            f"beyond the allowed drop {threshold:g}"
        )
    return None
