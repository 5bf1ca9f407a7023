"""How each run's judge agreed with people on the canaries (``judge_agreement.<metric>.*``), and
how that moved between a baseline and a candidate: what ``diff`` shows and the gate's
``judge_agreement`` / ``judge_bias`` rules check.

A move of agreement on the same canaries is a move of the judge, not of the systems: the canaries'
answers and human scores are fixed, so only the judge grading them changed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ragexp.compare.data import RunData
from ragexp.config.models import GatesConfig

PREFIX = "judge_agreement."
EPSILON = 1e-9


def agreement_of(run: RunData) -> dict[str, dict[str, float]]:
    """Metric -> the run's logged canary agreement (``kappa``, ``bias``, ``mae``, ``n``)."""
    found: dict[str, dict[str, float]] = {}
    for key, value in run.record.metrics.items():
        if key.startswith(PREFIX):
            metric, _, stat = key[len(PREFIX) :].rpartition(".")
            found.setdefault(metric, {})[stat] = value
    return found


def changes(baseline: RunData, candidate: RunData) -> list[dict[str, Any]]:
    """Each judge metric both runs have canary agreement for: both sides and the moves (the
    ``judge_agreement`` key of ``diff --json``)."""
    base, cand = agreement_of(baseline), agreement_of(candidate)
    rows = []
    for metric in sorted(set(base) & set(cand)):
        b, c = base[metric], cand[metric]
        kappa_b, kappa_c = b.get("kappa"), c.get("kappa")
        rows.append(
            {
                "name": metric,
                "same_canaries": baseline.record.tag("judge.canaries") == candidate.record.tag("judge.canaries"),
                "baseline": b,
                "candidate": c,
                "kappa_change": None if kappa_b is None or kappa_c is None else kappa_c - kappa_b,
                "bias_change": c.get("bias", 0.0) - b.get("bias", 0.0),
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
    )


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


def checks(gates: GatesConfig, baseline: RunData, candidate: RunData) -> list[Check]:
    """The gate's canary rules on every judge metric the candidate graded canaries for; a rule
    asked for where the candidate graded none is undecided (it fails the gate)."""
    base, cand = agreement_of(baseline), agreement_of(candidate)
    rules = gates.judge_agreement, gates.judge_bias
    asked = [
        ("judge_agreement.min_kappa", rules[0].min_kappa),
        ("judge_agreement.max_kappa_drop", rules[0].max_kappa_drop),
        ("judge_bias.max_abs", rules[1].max_abs),
        ("judge_bias.max_change", rules[1].max_change),
    ]
    found: list[Check] = []
    for rule, threshold in asked:
        if threshold is None:
            continue
        if not cand:
            found.append(
                Check("judge", rule, None, None, threshold, f"{rule}: the candidate graded no canaries", "undecided")
            )
            continue
        for metric in sorted(cand):
            found.append(_check(metric, rule, threshold, base.get(metric), cand[metric]))
    return found


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
