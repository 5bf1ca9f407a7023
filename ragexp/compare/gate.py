"""``ragexp gate``: every rule checked, every failure reported, direction-aware."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from ragexp.compare.data import RunData
from ragexp.compare.diff import DiffResult, MetricDiff, compute_diff
from ragexp.config.models import GateRule, GatesConfig
from ragexp.metrics.registry import METRICS

EPSILON = 1e-9
"""Float slack: .76 - .75 must not fail a bound of .01 through rounding."""


Status = Literal["passed", "failed", "undecided"]


@dataclass
class RuleResult:
    """One rule checked on one metric.

    ``failed``: the candidate is measured beyond the bound. ``undecided``: the rule could not be
    checked (no score, no paired cases, a judge without calibration); the gate does not pass
    over it, so it counts as a failure of the gate, but reports (JUnit) can show it as an error.
    """

    metric: str
    rule: str
    baseline: float | None
    candidate: float | None
    threshold: float | None
    message: str
    status: Status = "failed"
    method: str | None = None
    """How a statistical rule was decided (``sign-flip`` or ``prediction-powered``)."""

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    def to_json(self) -> dict[str, Any]:
        """The contract's failure entry."""
        return {
            "metric": self.metric,
            "rule": self.rule,
            "baseline": self.baseline,
            "candidate": self.candidate,
            "threshold": self.threshold,
            "message": self.message,
        }

    def to_rule_json(self) -> dict[str, Any]:
        """Every rule's entry (``rules`` in ``gate --json``), passed ones included."""
        return {**self.to_json(), "status": self.status, "method": self.method}


Failure = RuleResult
"""A rule result that did not pass (failed or undecided)."""


@dataclass
class GateResult:
    gates: str
    baseline: str
    candidate: str
    failures: list[Failure]
    checked: int
    """How many rule checks were made."""
    results: list[RuleResult] = field(default_factory=list)
    """Every rule check, passed ones included."""

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
            "rules": [r.to_rule_json() for r in self.results],
        }


def evaluate_gate(gates: GatesConfig, diff: DiffResult) -> GateResult:
    """Check the candidate of ``diff`` against every rule of ``gates``."""
    metrics = {m.name: m for m in diff.metrics}
    errored = diff.candidate.errored
    calibration = {name: diff.candidate.calibration(name) for name in gates.rules}
    results = rule_results(gates, metrics, int(errored.sum()), int(errored.size), calibration)
    failures = [r for r in results if not r.passed]
    return GateResult(gates.name, diff.baseline.run_id, diff.candidate.run_id, failures, len(results), results)


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
    gates: GatesConfig,
    metrics: dict[str, MetricDiff],
    errored: int,
    total: int,
    calibration: dict[str, dict[str, float]] | None = None,
) -> tuple[list[Failure], int]:
    """Every failure (not just the first) and the number of checks made."""
    results = rule_results(gates, metrics, errored, total, calibration)
    return [r for r in results if not r.passed], len(results)


def rule_results(
    gates: GatesConfig,
    metrics: dict[str, MetricDiff],
    errored: int,
    total: int,
    calibration: dict[str, dict[str, float]] | None = None,
) -> list[RuleResult]:
    """Every rule checked; ``calibration`` is the candidate's logged figures by metric."""
    results: list[RuleResult] = []
    if gates.max_error_rate is not None:
        rate = errored / total if total else 0.0
        baseline = metrics["error_rate"].baseline if "error_rate" in metrics else None
        if rate <= gates.max_error_rate + EPSILON:
            results.append(
                RuleResult(
                    "error_rate",
                    "max_error_rate",
                    baseline,
                    rate,
                    gates.max_error_rate,
                    f"{errored} of {total} candidate cases errored",
                    "passed",
                )
            )
        else:
            results.append(
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
            metric = metrics.get(name)
            if kind in CALIBRATION_RULES:
                result = _check_calibration(name, kind, threshold, (calibration or {}).get(name, {}), metric)
            else:
                result = _check(name, kind, threshold, rule, metric) or _passed(name, kind, threshold, rule, metric)
            results.append(result)
    return results


CALIBRATION_RULES = ("min_kappa", "max_abs_bias")


def _passed(name: str, kind: str, threshold: float, rule: GateRule, metric: MetricDiff | None) -> RuleResult:
    base = metric.baseline if metric else None
    cand = metric.candidate if metric else None
    method = _method(metric) if rule.statistical and kind == "max_drop" else None
    note = f" ({method} interval)" if method else ""
    return RuleResult(
        name, kind, base, cand, threshold, f"{name}: within '{kind}' {threshold:g}{note}", "passed", method
    )


def _method(metric: MetricDiff | None) -> str:
    return "prediction-powered" if metric is not None and metric.ppi is not None else "sign-flip"


def _check_calibration(
    name: str, kind: str, threshold: float, figures: dict[str, float], metric: MetricDiff | None
) -> RuleResult:
    """The candidate's judge must be calibrated against human scores, and well enough."""
    base = metric.baseline if metric else None
    cand = metric.candidate if metric else None

    def result(status: Status, message: str) -> RuleResult:
        return RuleResult(name, kind, base, cand, threshold, message, status, "calibration")

    spec = METRICS.get(name)
    if spec is None or not spec.human_labels:
        return result("undecided", f"{name}: takes no human scores, so '{kind}' cannot be checked")
    n = int(figures.get("n", 0))
    if not n:
        return result(
            "undecided",
            f"{name}: judge not calibrated (no calibration: the candidate's dataset has fewer than the "
            "minimum of labelled, scored cases in its 'human' field)",
        )
    if kind == "min_kappa":
        kappa = figures.get("kappa")
        if kappa is None:
            return result(
                "undecided",
                f"{name}: judge not calibrated (κ undefined: one single pass/fail call on all {n} labelled cases)",
            )
        if kappa < threshold - EPSILON:
            return result(
                "failed", f"{name}: judge not calibrated (κ {kappa:.2f} < {threshold:.2f} on {n} labelled cases)"
            )
        return result("passed", f"{name}: judge calibrated (κ {kappa:.2f} >= {threshold:.2f} on {n} labelled cases)")
    bias = figures.get("bias", 0.0)
    if abs(bias) > threshold + EPSILON:
        return result(
            "failed", f"{name}: judge not calibrated (|bias| {abs(bias):.3f} > {threshold:.3f} on {n} labelled cases)"
        )
    return result(
        "passed", f"{name}: judge calibrated (|bias| {abs(bias):.3f} <= {threshold:.3f} on {n} labelled cases)"
    )


def _bounds(rule: GateRule) -> list[tuple[str, float]]:
    pairs = [
        ("max_drop", rule.max_drop),
        ("max_increase_ratio", rule.max_increase_ratio),
        ("min", rule.min),
        ("max", rule.max),
        ("min_kappa", rule.min_kappa),
        ("max_abs_bias", rule.max_abs_bias),
    ]
    return [(kind, value) for kind, value in pairs if value is not None]


def _check(name: str, kind: str, threshold: float, rule: GateRule, metric: MetricDiff | None) -> Failure | None:
    spec = METRICS.get(name)
    direction = spec.direction if spec else "higher"
    base = metric.baseline if metric else None
    cand = metric.candidate if metric else None

    def fail(message: str, status: Status = "failed") -> Failure:
        return Failure(name, kind, base, cand, threshold, message, status)

    if metric is None or cand is None:
        return fail(f"{name}: the candidate has no score for it, so '{kind}' cannot pass", "undecided")
    if kind == "min":
        return fail(f"{name}: {cand:.4g} is below the floor {threshold:g}") if cand < threshold - EPSILON else None
    if kind == "max":
        return fail(f"{name}: {cand:.4g} is above the ceiling {threshold:g}") if cand > threshold + EPSILON else None
    if base is None:
        return fail(f"{name}: the baseline has no score for it, so '{kind}' cannot be checked", "undecided")
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
    name: str, threshold: float, metric: MetricDiff, direction: str, fail: Callable[..., Failure]
) -> Failure | None:
    """Fail only when the whole confidence interval of the paired difference is beyond the bound.

    With human scores on shared cases, the prediction-powered interval (the judge's difference
    corrected by people's) replaces the judge-only one, and the message says so."""
    if metric.ppi is not None:
        low, high = metric.ppi.ci_low, metric.ppi.ci_high
        how = f"prediction-powered interval ({metric.ppi.n_labelled} human-labelled pairs)"
    elif metric.ci_low is not None and metric.ci_high is not None:
        low, high, how = metric.ci_low, metric.ci_high, "paired difference interval"
    else:
        return fail(f"{name}: no paired cases to test the drop on", "undecided")
    # The interval end closest to "no change", expressed as how much worse the candidate is.
    least_worse = -high if direction == "higher" else low
    if least_worse > threshold + EPSILON:
        failure = fail(f"{name}: {how} [{low:+.4g}, {high:+.4g}] lies wholly beyond the allowed drop {threshold:g}")
        failure.method = _method(metric)
        return failure
    return None
