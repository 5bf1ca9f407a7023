"""``ragexp gate``: every rule checked, every failure reported, direction-aware."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from ragexp.compare.agreement import Check, checks, judge_rules
from ragexp.compare.data import RunData
from ragexp.compare.diff import DiffResult, MetricDiff, below_noise_floor, compute_diff
from ragexp.compare.figures import fmt, rounds_to_zero, signed
from ragexp.compare.pairing import paired_mask
from ragexp.compare.power import Power, cannot_tell_line
from ragexp.config.models import GateRule, GatesConfig
from ragexp.datasets.ledger import Ledger
from ragexp.errors import ConfigError
from ragexp.metrics.population import covered
from ragexp.metrics.registry import METRICS, MetricSpec, case_values_metric, rule_metric
from ragexp.stats.sequential import (
    bound_decision,
    difference_sequence,
    drop_decision,
    mean_sequence,
)

EPSILON = 1e-9
"""Float slack: .76 - .75 must not fail a bound of .01 through rounding."""


SEQUENTIAL_METHOD = "anytime-valid"
"""``RuleResult.method`` of a rule decided on a confidence sequence (:mod:`ragexp.stats.sequential`)."""

Decision = Literal["passed", "failed", "inconclusive"]
"""What a sequential rule came to at its stop: ``inconclusive`` when the cases ran out first."""


@dataclass(frozen=True)
class SequentialBound:
    """The anytime-valid interval of a rule of a sequential run, at its last look."""

    low: float
    high: float
    """The interval of the mean paired difference (candidate - baseline), or of the candidate's
    mean for a ``min``/``max`` rule."""
    pairs: int
    """The cases it is over (evaluated, scored by both runs, in the metric's population)."""
    decision: Decision

    @property
    def width(self) -> float:
        """How far apart its ends are: a true value at least this far beyond the rule's threshold
        would have put the whole interval on one side (the change it can still tell)."""
        return self.high - self.low

    def to_json(self) -> dict[str, Any]:
        return {"low": self.low, "high": self.high, "pairs": self.pairs, "decision": self.decision}


Outcome = Literal["passed", "failed", "undecided"]
"""What a rule check came to. ``undecided``: the rule could not be checked (a missing score, an
uncalibrated judge); the gate does not pass over it, and JUnit reports it as an error."""


@dataclass
class RuleResult:
    """One rule checked against one metric."""

    metric: str
    rule: str
    baseline: float | None
    candidate: float | None
    threshold: float | None
    message: str
    outcome: Outcome = "failed"
    method: str | None = None
    """How a rule was decided where that varies: ``sign-flip`` or ``prediction-powered`` for a
    statistical rule, ``calibration`` for a judge-calibration rule."""
    detectable_effect: float | None = None
    """Minimum detectable effect of the metric's paired comparison (None: not a per-case mean)."""
    underpowered: bool = False
    """The change this rule allows is below what the comparison can detect: its verdict says
    little either way (it never changes the verdict)."""
    power: Power | None = None
    allowed: float | None = None
    """The change in the metric's own unit that a change rule allows (None for other rules)."""
    population: str | None = None
    """The cases the metric was compared on, in words (``30 of 35 (answerable)``); None for a
    run-level figure or a rule on no comparison."""
    sequential: SequentialBound | None = None
    """The anytime-valid bound a sequential run's rule was decided on (None: a fixed-n rule)."""

    @property
    def passed(self) -> bool:
        return self.outcome == "passed"

    def cannot_tell(self, language: str = "en") -> str | None:
        """The sentence saying what an underpowered rule cannot tell; None when it is not."""
        if self.inconclusive:
            return self.message
        if not self.underpowered or self.power is None or self.allowed is None:
            return None
        return cannot_tell_line(self.allowed, self.power, language, increase=self.rule.startswith("max_increase"))

    @property
    def inconclusive(self) -> bool:
        """A sequential rule whose bound still reached both sides of its threshold at the stop."""
        return self.sequential is not None and self.sequential.decision == "inconclusive"

    def to_json(self) -> dict[str, Any]:
        """The contract's failure object (``ragexp gate --json``'s ``failures``)."""
        return {
            "metric": self.metric,
            "rule": self.rule,
            "baseline": self.baseline,
            "candidate": self.candidate,
            "threshold": self.threshold,
            "message": self.message,
        }

    def rule_json(self) -> dict[str, Any]:
        """One entry of ``rules``: the failure object, the outcome and what the rule could detect."""
        return {
            **self.to_json(),
            "outcome": self.outcome,
            "method": self.method,
            "detectable_effect": self.detectable_effect,
            "underpowered": self.underpowered,
            **({"sequential": self.sequential.to_json()} if self.sequential is not None else {}),
            "population": self.population,
        }


Failure = RuleResult
"""A rule result that did not pass (failed or undecided)."""


@dataclass
class GateResult:
    gates: str
    baseline: str
    candidate: str
    rules: list[RuleResult]
    """Every rule checked, in config order, passed or not."""

    @property
    def failures(self) -> list[RuleResult]:
        """Rules that failed or could not be decided: either one fails the gate."""
        return [r for r in self.rules if not r.passed]

    @property
    def undecided(self) -> list[RuleResult]:
        return [r for r in self.rules if r.outcome == "undecided"]

    @property
    def checked(self) -> int:
        """How many rule checks were made."""
        return len(self.rules)

    @property
    def passed(self) -> bool:
        return not self.failures

    @classmethod
    def from_json(cls, payload: dict[str, Any]) -> GateResult:
        """A gate as ``ragexp gate`` recorded it (its ``gate.json``): every rule with its outcome."""
        rules = [
            RuleResult(
                str(r["metric"]),
                str(r["rule"]),
                r.get("baseline"),
                r.get("candidate"),
                r.get("threshold"),
                str(r.get("message", "")),
                r.get("outcome", "failed"),
                r.get("method"),
                r.get("detectable_effect"),
                bool(r.get("underpowered", False)),
                population=r.get("population"),
            )
            for r in payload.get("rules", [])
        ]
        return cls(str(payload["gates"]), str(payload["baseline"]), str(payload["candidate"]), rules)

    def to_json(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "baseline": self.baseline,
            "candidate": self.candidate,
            "gates": self.gates,
            "failures": [f.to_json() for f in self.failures],
            "rules": [r.rule_json() for r in self.rules],
        }


def check_gate(gates: GatesConfig) -> None:
    """Refuse a gate that bounds no metric and sets no judge rule (``judge_agreement``,
    ``judge_bias``): it would pass any candidate, however much worse.

    ``max_error_rate`` alone is not enough: it says nothing about the scores of the cases that
    did answer. Checked before any work, and again by :func:`evaluate_gate`, so no verdict can
    come from a gate without rules."""
    if not any(_bounds(rule) for rule in gates.rules.values()) and not judge_rules(gates):
        what = "has no rules" if not gates.rules else "has rules that set no bound"
        raise ConfigError(
            f"gates {gates.name}: {what}, so it would pass any candidate; "
            "give at least one metric a bound (gates.rules.METRIC.max_drop=..., see docs/gates.md)"
        )


def evaluate_gate(gates: GatesConfig, diff: DiffResult) -> GateResult:
    """Check the candidate of ``diff`` against every rule of ``gates``."""
    check_gate(gates)
    metrics = {m.name: m for m in diff.metrics}
    errored = diff.candidate.errored
    calibration = {name: diff.candidate.calibration(name) for name in gates.rules}
    results = rule_results(gates, metrics, int(errored.sum()), int(errored.size), calibration)
    results += [_canary_rule(check) for check in checks(gates, diff.baseline, diff.candidate)]
    if is_sequential(diff.candidate):
        results = with_sequential(gates, results, sequential_values(diff.baseline, diff.candidate))
    return GateResult(gates.name, diff.baseline.run_id, diff.candidate.run_id, apply_underpowered(gates, results))


def gate_runs(
    gates: GatesConfig,
    baseline: RunData,
    candidate: RunData,
    *,
    allow_incomparable: bool = False,
    top: int = 0,
    ledger: Ledger | None = None,
) -> tuple[DiffResult, GateResult]:
    """Compare (statistics as the gates ask) and check every rule; ``top``: most regressed cases to
    keep; ``ledger``: see :func:`compute_diff`."""
    diff = compute_diff(
        baseline,
        candidate,
        resamples=gates.resamples,
        confidence=gates.confidence,
        seed=gates.seed,
        top=top,
        allow_incomparable=allow_incomparable,
        ledger=ledger,
        latency_floor=gates.latency_floor_seconds,
    )
    return diff, evaluate_gate(gates, diff)


def _canary_rule(check: Check) -> RuleResult:
    outcome: Outcome = "failed" if check.outcome == "failed" else "passed" if check.outcome == "passed" else "undecided"
    return RuleResult(
        check.metric,
        check.rule,
        check.baseline,
        check.candidate,
        check.threshold,
        check.message,
        outcome,
        "canaries",
        underpowered=check.cannot_tell,
    )


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
    """Every rule of ``gates`` checked, passed or not; ``calibration``: the candidate's logged
    judge-calibration figures by metric."""
    results: list[RuleResult] = []
    if gates.max_error_rate is not None:
        rate = errored / total if total else 0.0
        error_rate = case_values_metric("errored").name
        baseline = metrics[error_rate].baseline if error_rate in metrics else None
        failed = rate > gates.max_error_rate + EPSILON
        verb = ">" if failed else "<="
        message = f"{errored} of {total} candidate cases errored ({rate:.2%} {verb} {gates.max_error_rate:.2%})"
        if failed:
            message += ": their scores are missing, not zero"
        results.append(
            RuleResult(
                error_rate,
                "max_error_rate",
                baseline,
                rate,
                gates.max_error_rate,
                message,
                "failed" if failed else "passed",
            )
        )
    for name, rule in gates.rules.items():
        for kind, threshold in _bounds(rule):
            metric = metrics.get(rule_metric(name))  # recall_at_k@hop2: the metric recall_at_k.hop2
            if kind in CALIBRATION_RULES:
                results.append(_check_calibration(name, kind, threshold, (calibration or {}).get(name, {}), metric))
            elif kind in CHANGE_RULES and metric is not None and below_noise_floor(metric, gates.latency_floor_seconds):
                results.append(_noise(name, kind, threshold, metric, gates.latency_floor_seconds))
            else:
                results.append(_check(name, kind, threshold, rule, metric))
    for result in results:
        compared = metrics.get(rule_metric(result.metric))
        _add_power(result, compared)
        if (
            compared is not None
            and compared.compared() is not None
            and result.rule not in ("max_error_rate", *CALIBRATION_RULES, *BOUND_RULES)
        ):
            result.population = compared.compared()
    return results


CHANGE_RULES = ("max_drop", "max_increase", "max_increase_ratio")
"""Rules that bound a change between the runs, which a comparison may be too small to see."""


def _add_power(result: RuleResult, metric: MetricDiff | None) -> None:
    """Say what the comparison behind ``result`` can detect; a change rule allowing less than
    that is flagged. Only the note changes: the outcome stays what the rule decided."""
    power = metric.power if metric is not None else None
    if power is None:
        return
    result.power, result.detectable_effect = power, power.detectable
    if result.rule not in CHANGE_RULES or result.threshold is None:
        return
    if result.rule in ("max_drop", "max_increase"):
        allowed: float = result.threshold
    elif result.baseline is not None:
        allowed = result.threshold * abs(result.baseline)
    else:
        return
    result.allowed = allowed
    result.underpowered = power.cannot_tell(allowed)


CALIBRATION_RULES = ("min_kappa", "max_abs_bias")


def _method(metric: MetricDiff | None) -> str:
    return "prediction-powered" if metric is not None and metric.ppi is not None else "sign-flip"


def _check_calibration(
    name: str, kind: str, threshold: float, figures: dict[str, float], metric: MetricDiff | None
) -> RuleResult:
    """The candidate's judge must be calibrated against human scores, and well enough."""
    base = metric.baseline if metric else None
    cand = metric.candidate if metric else None

    def result(outcome: Outcome, message: str) -> RuleResult:
        return RuleResult(name, kind, base, cand, threshold, message, outcome, "calibration")

    spec = metric.spec if metric is not None and metric.spec is not None else METRICS.get(name)
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
        shown = f"κ {fmt(kappa, 2)} %s {fmt(threshold, 2)} on {n} labelled cases"
        if kappa < threshold - EPSILON:
            return result("failed", f"{name}: judge not calibrated ({shown % '<'})")
        return result("passed", f"{name}: judge calibrated ({shown % '>='})")
    bias = figures.get("bias", 0.0)
    shown = f"|bias| {fmt(abs(bias), 3)} %s {fmt(threshold, 3)} on {n} labelled cases"
    if abs(bias) > threshold + EPSILON:
        return result("failed", f"{name}: judge not calibrated ({shown % '>'})")
    return result("passed", f"{name}: judge calibrated ({shown % '<='})")


def _noise(name: str, kind: str, threshold: float, metric: MetricDiff, floor: float) -> RuleResult:
    return RuleResult(
        name,
        kind,
        metric.baseline,
        metric.candidate,
        threshold,
        f"{name}: {fmt(metric.baseline)} -> {fmt(metric.candidate)}: both below the latency noise floor "
        f"{floor:g} s (gates.latency_floor_seconds): timer noise, not a change",
        "passed",
    )


def _bounds(rule: GateRule) -> list[tuple[str, float]]:
    pairs = [
        ("max_drop", rule.max_drop),
        ("max_increase", rule.max_increase),
        ("max_increase_ratio", rule.max_increase_ratio),
        ("min", rule.min),
        ("max", rule.max),
        ("min_kappa", rule.min_kappa),
        ("max_abs_bias", rule.max_abs_bias),
    ]
    return [(kind, value) for kind, value in pairs if value is not None]


def _check(name: str, kind: str, threshold: float, rule: GateRule, metric: MetricDiff | None) -> RuleResult:
    spec = metric.spec if metric is not None and metric.spec is not None else METRICS.get(name)
    direction = spec.direction if spec else "higher"
    base = metric.baseline if metric else None
    cand = metric.candidate if metric else None

    def result(outcome: Outcome, message: str) -> RuleResult:
        return RuleResult(name, kind, base, cand, threshold, message, outcome)

    if kind in BOUND_RULES:
        return _check_bound(name, kind, threshold, metric)
    if metric is None or cand is None:
        return result("undecided", f"{name}: the candidate has no score for it, so '{kind}' cannot pass")
    on = _on(metric)
    if metric.not_comparable is not None and kind in CHANGE_RULES:
        return result("undecided", f"{name}: {metric.not_comparable}, so '{kind}' cannot be checked")
    if base is None:
        return result("undecided", f"{name}: the baseline has no score for it, so '{kind}' cannot be checked")
    worse_by = base - cand if direction == "higher" else cand - base
    move = f"{name}: {fmt(base)} -> {fmt(cand)}{on}"
    if kind == "max_drop":
        if rule.statistical:
            return _statistical_drop(name, threshold, metric, direction, result)
        if worse_by > threshold + EPSILON:
            return result("failed", f"{move}, worse by {fmt(worse_by)} (allowed drop {threshold:g})")
        return result("passed", f"{move}, {_moved(worse_by)} (allowed drop {threshold:g})")
    if kind == "max_increase":
        if direction != "lower":
            return result("undecided", f"{name}: higher is better, so a rise is no regression; bound it with max_drop")
        if worse_by > threshold + EPSILON:
            return result("failed", f"{move}, up by {fmt(worse_by)} (allowed increase {threshold:g})")
        return result("passed", f"{move}, {_moved(worse_by)} (allowed increase {threshold:g})")
    return _ratio(move, base, cand, worse_by, threshold, result)


BOUND_RULES = ("min", "max")
"""Rules on the candidate alone: they read its own value over its own population, not the pairs."""


def _check_bound(name: str, kind: str, threshold: float, metric: MetricDiff | None) -> RuleResult:
    """``min``/``max``: the candidate's own logged value against the bound, and the message says so."""
    base = metric.baseline_own if metric else None
    cand = metric.candidate_own if metric else None
    if metric is None or cand is None:
        missing = f"{name}: the candidate has no score for it, so '{kind}' cannot pass"
        return RuleResult(name, kind, base, cand, threshold, missing, "undecided")
    own = metric.candidate_population
    what = f"the candidate's own {'mean' if own is not None else 'value'} {fmt(cand)}"
    if own is not None:
        what += f" on {own.words()}"
    if kind == "min":
        failed = cand < threshold - EPSILON
        where = f"{'below' if failed else 'at or above'} the floor {threshold:g}"
    else:
        failed = cand > threshold + EPSILON
        where = f"{'above' if failed else 'at or below'} the ceiling {threshold:g}"
    outcome: Outcome = "failed" if failed else "passed"
    checked = RuleResult(name, kind, base, cand, threshold, f"{name}: {what} is {where}", outcome)
    checked.population = own.words() if own is not None else None
    return checked


def _ratio(
    move: str,
    base: float,
    cand: float,
    worse_by: float,
    threshold: float,
    result: Callable[[Outcome, str], RuleResult],
) -> RuleResult:
    """``max_increase_ratio``: the move in the bad direction relative to the baseline."""
    allowed = f"allowed {threshold:+.0%}"
    if rounds_to_zero(base):
        # A ratio against (nearly) nothing is a huge number that means nothing: say so plainly.
        # Both below the printed precision (microseconds of timer noise) is no change at all.
        what = "a zero baseline" if base == 0 else "a baseline that is practically zero"
        if worse_by > EPSILON and not rounds_to_zero(cand) and (base == 0 or worse_by / abs(base) > threshold):
            return result(
                "failed",
                f"{move}: a relative limit ({allowed}) on {what} allows practically no rise; "
                f"it rose by {fmt(worse_by)}",
            )
        return result("passed", f"{move}: {what}, and the candidate did not rise beyond the relative limit ({allowed})")
    ratio = worse_by / abs(base)
    relative = f"{ratio + 1:,.1f}x the baseline" if ratio >= 10 else f"{ratio:+.1%}"
    if ratio > threshold + EPSILON:
        return result("failed", f"{move}, {relative} worse ({allowed})")
    return result("passed", f"{move}, {relative if ratio > EPSILON else 'no rise'} ({allowed})")


def _on(metric: MetricDiff) -> str:
    """`` on 30 of 35 (answerable)`` after a quoted change, with the cases left out of the pairs
    and why; nothing for a run-level figure."""
    compared = metric.compared()
    return f" on {compared}" if compared is not None else ""


def _moved(worse_by: float) -> str:
    if worse_by > EPSILON:
        return f"worse by {fmt(worse_by)}"
    if worse_by < -EPSILON:
        return f"better by {fmt(-worse_by)}"
    return "unchanged"


def _statistical_drop(
    name: str, threshold: float, metric: MetricDiff, direction: str, result: Callable[[Outcome, str], RuleResult]
) -> RuleResult:
    """Fail only when the whole confidence interval of the paired difference is beyond the bound.

    With human scores on shared cases, the prediction-powered interval (the judge's difference
    corrected by people's) replaces the judge-only one, and the message says so."""
    if metric.ppi is not None:
        low, high = metric.ppi.ci_low, metric.ppi.ci_high
        how = f"prediction-powered interval ({metric.ppi.n_labelled} human-labelled pairs)"
    elif metric.ci_low is not None and metric.ci_high is not None:
        low, high, how = metric.ci_low, metric.ci_high, "paired difference interval"
    else:
        return result("undecided", f"{name}: no paired cases to test the drop on")
    interval = f"[{signed(low)}, {signed(high)}]"
    # The interval end closest to "no change", expressed as how much worse the candidate is.
    least_worse = -high if direction == "higher" else low
    failed = least_worse > threshold + EPSILON
    where = "lies wholly beyond" if failed else "reaches within"
    checked = result(
        "failed" if failed else "passed",
        f"{name}: {how} {interval}{_on(metric)} {where} the allowed drop {threshold:g}",
    )
    checked.method = _method(metric)
    return checked


SEQUENTIAL_TAGS = ("sequential.total", "sequential.batch")
"""The tags of a run of ``run --until-decided``: the dataset's cases, the cases per batch."""


def is_sequential(run: RunData) -> bool:
    """A run of ``run --until-decided``: its cases are those it evaluated, in the order it did."""
    return bool(run.record.tag("sequential.total"))


@dataclass
class SequentialValues:
    """The per-case values a sequential rule is decided on, over the evaluated cases in the order
    they were evaluated."""

    baseline: dict[str, np.ndarray]
    candidate: dict[str, np.ndarray]
    specs: dict[str, MetricSpec | None]
    unanswerable: np.ndarray
    looks: np.ndarray
    """The evaluated-case counts after which the run decided (its batches' ends)."""
    total: int
    """Cases of the dataset."""


def looks_of(evaluated: int, batch: int, units: Sequence[object] | np.ndarray | None = None) -> np.ndarray:
    """The batches' ends: every ``batch`` cases, and the last case evaluated. With ``units`` (the
    unit of each case in evaluation order: a conversation's turns share one), a batch ends with
    the unit its ``batch``-th case belongs to, so a look never falls inside a conversation."""
    if units is None:
        ends = [*range(batch, evaluated, batch), evaluated]
        return np.array([end for end in ends if end > 0], dtype=np.int64)
    found, count = [], 0
    for position in range(evaluated):
        count += 1
        last = position + 1 == evaluated or units[position + 1] != units[position]
        if last and (count >= batch or position + 1 == evaluated):
            found.append(position + 1)
            count = 0
    return np.array(found, dtype=np.int64)


def sequential_values(baseline: RunData, candidate: RunData) -> SequentialValues:
    """The values of a logged sequential run and of its baseline, paired on the candidate's cases."""
    base = baseline.select([case_id for case_id in candidate.case_ids if case_id in set(baseline.case_ids)])
    cand = candidate.select(base.case_ids)
    names = set(candidate.metrics) | set(baseline.metrics) | {case_values_metric("errored").name}
    b_values, c_values, specs = {}, {}, {}
    for name in names:
        b, c = base.per_case(name), cand.per_case(name)
        if b is not None and c is not None:
            b_values[name], c_values[name] = b, c
            specs[name] = candidate.spec(name) or baseline.spec(name)
    batch = int(candidate.record.tag("sequential.batch") or len(cand.case_ids) or 1)
    total = int(candidate.record.tag("sequential.total"))
    looks = looks_of(len(cand.case_ids), batch, cand.units())
    return SequentialValues(b_values, c_values, specs, base.unanswerable, looks, total)


def sequential_bounded(spec: MetricSpec | None) -> bool:
    """A metric a confidence sequence can bound: a mean of per-case values with a known range."""
    return spec is not None and spec.mean_of_cases and spec.high is not None and spec.high > spec.low


def with_sequential(gates: GatesConfig, results: list[RuleResult], values: SequentialValues) -> list[RuleResult]:
    """Each rule a confidence sequence can decide, decided on it (the others as :func:`rule_results`
    checked them, on the evaluated cases)."""
    confidence = gates.confidence
    return [_sequential_rule(r, values, confidence) or r for r in results]


def sequential_rules(gates: GatesConfig, values: SequentialValues) -> list[RuleResult]:
    """The rules of ``gates`` a confidence sequence decides, each decided (what a sequential run
    stops on)."""
    found = []
    for name, rule in gates.rules.items():
        for kind, threshold in _bounds(rule):
            blank = RuleResult(name, kind, None, None, threshold, "", "undecided")
            checked = _sequential_rule(blank, values, gates.confidence)
            if checked is not None:
                found.append(checked)
    return found


def _sequential_rule(result: RuleResult, values: SequentialValues, confidence: float) -> RuleResult | None:
    name, kind, threshold = result.metric, result.rule, result.threshold
    spec = values.specs.get(name)
    if kind not in ("max_drop", "min", "max") or threshold is None or not sequential_bounded(spec) or spec is None:
        return None
    base, cand = values.baseline.get(name), values.candidate.get(name)
    if base is None or cand is None:
        return None
    width = float(spec.high) - spec.low  # type: ignore[arg-type]  # bounded: high is set
    alpha = 1.0 - confidence
    if kind == "max_drop":
        mask = paired_mask(spec, base, cand, values.unanswerable)
    else:  # a floor or a ceiling: the candidate's own cases
        mask = np.isfinite(cand) & covered(spec, values.unanswerable)
    counted = np.cumsum(mask)
    looks = np.unique(counted[values.looks - 1]) if values.looks.size else np.empty(0, dtype=np.int64)
    looks = looks[looks > 0]
    evaluated = int(values.looks[-1]) if values.looks.size else 0
    shown = f"after {evaluated} of {values.total} cases"
    if not looks.size:
        return RuleResult(
            name, kind, None, None, threshold, f"{name}: no scored case {shown}, so '{kind}' cannot pass", "undecided"
        )
    b_mean = float(base[mask].mean()) if kind == "max_drop" else result.baseline
    c_mean = float(cand[mask].mean())
    if kind == "max_drop":
        sequence = difference_sequence(cand[mask] - base[mask], width, alpha, looks)
        low, high = sequence.last()
        step = drop_decision(low, high, threshold, spec.direction)
        what = f"anytime-valid interval of the paired difference [{signed(low)}, {signed(high)}] {shown}"
        bound = f"the allowed drop {threshold:g}"
    else:
        sequence = mean_sequence(cand[mask], spec.low, width, alpha, looks)
        low, high = sequence.last()
        step = bound_decision(low, high, kind, threshold)
        what = f"anytime-valid interval of the candidate's mean [{fmt(low)}, {fmt(high)}] {shown}"
        bound = f"the {'floor' if kind == 'min' else 'ceiling'} {threshold:g}"
    decision: Decision = "inconclusive" if step == "open" else step
    pairs = int(looks[-1])
    found = SequentialBound(low, high, pairs, decision)
    if decision == "failed":
        message = f"{name}: {what} lies wholly beyond {bound}"
    elif decision == "passed":
        message = f"{name}: {what} lies wholly within {bound}"
    else:
        message = (
            f"{name}: inconclusive {shown}: the {what.removeprefix('anytime-valid ')} reaches both sides of "
            f"{bound} (it tells apart only values {fmt(found.width)} or more beyond it)"
        )
    checked = RuleResult(
        name,
        kind,
        b_mean,
        c_mean,
        threshold,
        message,
        "failed" if decision == "failed" else "passed",
        SEQUENTIAL_METHOD,
        found.width,
        decision == "inconclusive",
    )
    checked.sequential = found
    checked.population = f"{pairs} of {evaluated} evaluated ({values.total} in the dataset)"
    unscored = int(np.count_nonzero(covered(spec, values.unanswerable)[:evaluated])) - pairs
    if unscored > 0:  # evaluated, in the population, without a score (in either run, for a drop)
        checked.population += (
            f"; {unscored} left out: not scored by {'both runs' if kind == 'max_drop' else 'the candidate'}"
        )
    return checked


def apply_underpowered(gates: GatesConfig, results: list[RuleResult]) -> list[RuleResult]:
    """``gates.on_underpowered: fail``: a passed rule that cannot tell (underpowered, or left
    inconclusive by a sequential run) fails the gate; ``warn`` leaves every verdict as it is."""
    if gates.on_underpowered != "fail":
        return results
    for result in results:
        if result.passed and result.underpowered:
            result.outcome = "failed"
            result.message += "; it cannot tell, which gates.on_underpowered=fail makes a failure"
    return results
