"""How each run's judge agreed with people on the canaries (``judge_agreement.<metric>.*``), and
how that moved between a baseline and a candidate: what ``diff`` shows and the gate's
``judge_agreement`` / ``judge_bias`` rules check.

A move of agreement on the same canaries is a move of the judge, not of the systems: the canaries'
answers and human scores are fixed, so only the judge grading them changed.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from ragexp.compare.data import RunData
from ragexp.config.models import CalibrationConfig, GatesConfig
from ragexp.metrics.canaries import AgreementChange, agreement_change

PREFIX = "judge_agreement."
EPSILON = 1e-9
DEFAULT_THRESHOLD = CalibrationConfig().threshold


def agreement_of(run: RunData) -> dict[str, dict[str, float]]:
    """Metric -> the run's logged canary agreement (``kappa``, ``bias``, ``mae``, ``n``)."""
    found: dict[str, dict[str, float]] = {}
    for key, value in run.record.metrics.items():
        if key.startswith(PREFIX):
            metric, _, stat = key[len(PREFIX) :].rpartition(".")
            found.setdefault(metric, {})[stat] = value
    return found


def paired_changes(
    baseline: RunData, candidate: RunData, *, confidence: float, resamples: int = 1000
) -> dict[str, AgreementChange]:
    """Metric -> the paired change of agreement, canary by canary, when both runs graded the same
    canary file (their ``canaries.json``); empty when they did not or either artifact is missing."""
    base, cand = baseline.canaries, candidate.canaries
    if base is None or cand is None or base.get("digest") != cand.get("digest") or base.get("ids") != cand.get("ids"):
        return {}
    threshold = _threshold(candidate)
    found: dict[str, AgreementChange] = {}
    for metric in sorted(set(base.get("judge", {})) & set(cand.get("judge", {}))):
        human = cand.get("human", {}).get(metric)
        if human is None:
            continue
        change = agreement_change(
            _column(base["judge"][metric]),
            _column(cand["judge"][metric]),
            _column(human),
            threshold=threshold,
            confidence=confidence,
            resamples=resamples,
        )
        if change is not None:
            found[metric] = change
    return found


def _column(values: list[float | None]) -> np.ndarray:
    return np.array([np.nan if v is None else v for v in values], dtype=np.float64)


def _threshold(run: RunData) -> float:
    """The pass mark κ is taken at (``calibration.threshold``, a hashed param of the run)."""
    try:
        return float(run.record.params.get("calibration.threshold", DEFAULT_THRESHOLD))
    except ValueError:
        return DEFAULT_THRESHOLD


def changes(baseline: RunData, candidate: RunData, *, confidence: float = 0.95) -> list[dict[str, Any]]:
    """Each judge metric both runs have canary agreement for: both sides, the moves, and
    (``paired``) the moves tested canary by canary when both runs graded the same canaries (the
    ``judge_agreement`` key of ``diff --json``)."""
    base, cand = agreement_of(baseline), agreement_of(candidate)
    paired = paired_changes(baseline, candidate, confidence=confidence)
    rows = []
    for metric in sorted(set(base) & set(cand)):
        b, c = base[metric], cand[metric]
        kappa_b, kappa_c = b.get("kappa"), c.get("kappa")
        tested = paired.get(metric)
        rows.append(
            {
                "name": metric,
                "same_canaries": baseline.record.tag("judge.canaries") == candidate.record.tag("judge.canaries"),
                "baseline": b,
                "candidate": c,
                "kappa_change": None if kappa_b is None or kappa_c is None else kappa_c - kappa_b,
                "bias_change": c.get("bias", 0.0) - b.get("bias", 0.0),
                "paired": None if tested is None else {**tested.to_json(), "confidence": confidence},
            }
        )
    return rows


def line(row: dict[str, Any]) -> str:
    b, c = row["baseline"], row["candidate"]

    def kappa(figures: dict[str, float]) -> str:
        return "undefined" if figures.get("kappa") is None else f"{figures['kappa']:.2f}"

    moved = "" if row["kappa_change"] is None else f" ({row['kappa_change']:+.2f})"
    return (
        f"judge agreement on the canaries, {row['name']}: κ {kappa(b)} -> {kappa(c)}{moved}, "
        f"bias {b.get('bias', 0.0):+.3f} -> {c.get('bias', 0.0):+.3f} ({row['bias_change']:+.3f})"
        + ("" if row["same_canaries"] else " (different canary files)")
        + _paired_words(row.get("paired"))
    )


def _paired_words(paired: dict[str, Any] | None) -> str:
    """The paired tests, in words: each change with its interval and p-value."""
    if paired is None:
        return ""
    level = f"{paired['confidence']:.0%}"
    parts = [
        f"bias {paired['change']:+.3f} [{paired['ci_low']:+.3f}, {paired['ci_high']:+.3f}] p={paired['p_value']:.3g}"
    ]
    if paired.get("mae_change") is not None:
        parts.append(
            f"MAE {paired['mae_change']:+.3f} [{paired['mae_ci_low']:+.3f}, {paired['mae_ci_high']:+.3f}] "
            f"p={paired['mae_p_value']:.3g}"
        )
    if paired.get("kappa_ci_low") is not None:
        parts.append(f"κ {paired['kappa_change']:+.2f} [{paired['kappa_ci_low']:+.2f}, {paired['kappa_ci_high']:+.2f}]")
    return f"; paired on {paired['n']} canaries ({level} intervals): " + ", ".join(parts)


@dataclass(frozen=True)
class Check:
    """One judge-agreement rule checked: the gate turns it into a rule result."""

    metric: str
    rule: str
    baseline: float | None
    candidate: float | None
    threshold: float
    message: str
    outcome: str
    cannot_tell: bool = False
    """A change beyond its bound the paired test cannot tell from noise (``gates.on_underpowered:
    fail`` makes it a failure)."""


def judge_rules(gates: GatesConfig) -> list[tuple[str, float]]:
    """The judge-agreement rules ``gates`` sets: (rule, threshold)."""
    agreement, bias = gates.judge_agreement, gates.judge_bias
    asked = [
        ("judge_agreement.min_kappa", agreement.min_kappa),
        ("judge_agreement.max_kappa_drop", agreement.max_kappa_drop),
        ("judge_bias.max_abs", bias.max_abs),
        ("judge_bias.max_change", bias.max_change),
    ]
    return [(rule, threshold) for rule, threshold in asked if threshold is not None]


def checks(gates: GatesConfig, baseline: RunData, candidate: RunData) -> list[Check]:
    """The gate's canary rules on every judge metric the candidate graded canaries for; a rule
    asked for where the candidate graded none is undecided (it fails the gate). A change rule is
    decided on the paired test of the same canaries when both runs have them: a move beyond its
    bound fails only when the test tells it from noise at ``gates.confidence``."""
    asked = judge_rules(gates)
    if not asked:
        return []
    base, cand = agreement_of(baseline), agreement_of(candidate)
    paired = paired_changes(baseline, candidate, confidence=gates.confidence)
    found: list[Check] = []
    for rule, threshold in asked:
        if not cand:
            found.append(
                Check("judge", rule, None, None, threshold, f"{rule}: the candidate graded no canaries", "undecided")
            )
            continue
        for metric in sorted(cand):
            check = _check(metric, rule, threshold, base.get(metric), cand[metric])
            tested = paired.get(metric)
            if tested is not None and check.outcome != "undecided" and rule.endswith(("max_change", "max_kappa_drop")):
                check = _paired_check(check, tested, 1.0 - gates.confidence)
            found.append(check)
    return found


def _paired_check(check: Check, tested: AgreementChange, alpha: float) -> Check:
    """A change rule decided on the canaries paired: beyond its bound and told from noise, it fails;
    beyond its bound but not told from noise, it passes saying it cannot tell."""
    level = f"{1.0 - alpha:.0%}"
    if check.rule == "judge_bias.max_change":
        moved, beyond = tested.change, abs(tested.change) > check.threshold + EPSILON
        told = tested.p_value < alpha
        shown = (
            f"moved {moved:+.3f} [{tested.ci_low:+.3f}, {tested.ci_high:+.3f}] paired on {tested.n} canaries, "
            f"p={tested.p_value:.3g}"
        )
    else:
        if tested.kappa_change is None or tested.kappa_ci_low is None or tested.kappa_ci_high is None:
            return check
        moved, beyond = tested.kappa_change, -tested.kappa_change > check.threshold + EPSILON
        told = tested.kappa_ci_high < 0.0
        shown = (
            f"κ moved {moved:+.2f} [{tested.kappa_ci_low:+.2f}, {tested.kappa_ci_high:+.2f}] "
            f"paired on {tested.n} canaries"
        )
    if beyond and told:
        verdict, outcome = "the judge changed", "failed"
    elif beyond:
        verdict, outcome = f"beyond the bound, but not told from noise at {level}: it cannot tell", "passed"
    else:
        verdict, outcome = "within bound", "passed"
    before, after = check.baseline or 0.0, check.candidate or 0.0
    if check.rule == "judge_bias.max_change":
        figures, allowed = f"bias on the canaries {before:+.3f} -> {after:+.3f}", f"allowed {check.threshold:g}"
    else:
        figures, allowed = f"κ on the canaries {before:.2f} -> {after:.2f}", f"allowed drop {check.threshold:g}"
    message = f"{check.metric}: {figures}, {shown} ({allowed}): {verdict}"
    return dataclasses.replace(check, message=message, outcome=outcome, cannot_tell=beyond and not told)


def _check(metric: str, rule: str, threshold: float, base: dict[str, float] | None, cand: dict[str, float]) -> Check:
    def result(b: float | None, c: float | None, message: str, failed: bool | None) -> Check:
        outcome = "undecided" if failed is None else "failed" if failed else "passed"
        return Check(metric, rule, b, c, threshold, f"{metric}: {message}", outcome)

    n = int(cand.get("n", 0))
    kappa, bias = cand.get("kappa"), cand.get("bias", 0.0)
    if rule == "judge_agreement.min_kappa":
        if kappa is None:
            return result(None, None, f"κ on the canaries undefined (one single call on all {n})", None)
        low = kappa < threshold - EPSILON
        return result(None, kappa, f"κ on {n} canaries {kappa:.2f} {'<' if low else '>='} {threshold:g}", low)
    if rule == "judge_bias.max_abs":
        far = abs(bias) > threshold + EPSILON
        return result(None, bias, f"|bias| on {n} canaries {abs(bias):.3f} {'>' if far else '<='} {threshold:g}", far)
    if base is None:
        return result(None, kappa if "kappa" in rule else bias, "the baseline graded no canaries", None)
    if rule == "judge_agreement.max_kappa_drop":
        before = base.get("kappa")
        if before is None or kappa is None:
            return result(before, kappa, "κ on the canaries undefined on one side", None)
        drop = before - kappa
        worse = drop > threshold + EPSILON
        shown = f"κ on the canaries {before:.2f} -> {kappa:.2f} (allowed drop {threshold:g})"
        return result(before, kappa, shown, worse)
    before_bias = base.get("bias", 0.0)
    moved = bias - before_bias
    worse = abs(moved) > threshold + EPSILON
    return result(
        before_bias,
        bias,
        f"bias on the canaries {before_bias:+.3f} -> {bias:+.3f}, moved {moved:+.3f} (allowed {threshold:g}): "
        + ("the judge changed" if worse else "within bound"),
        worse,
    )
