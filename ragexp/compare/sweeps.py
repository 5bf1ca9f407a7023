"""``ragexp sweep PARENT``: the points of a sweep against a baseline, corrected for looking at
many points, their Pareto front over quality, p95 latency and cost, and a recommendation.

Two families of comparisons, each corrected on its own (docs/sweeps.md):

- every point against the baseline on every quality metric (points x metrics): Holm's step-down
  adjustment decides which moves are significant; the intervals are simultaneous (Bonferroni),
  so all of them hold together at the confidence level;
- every pair of points on the quality axis (the front's confidence and the recommendation):
  Bonferroni over the n(n-1)/2 pairs.

Latency (``p95_seconds``) and ``cost`` are run-level figures with no per-case paired test: they
are compared as measured.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from ragexp.compare.data import RunData
from ragexp.compare.diff import MetricDiff, compute_diff
from ragexp.compare.figures import fmt, signed
from ragexp.compare.gate import GateResult
from ragexp.config.models import LATENCY_FLOOR_SECONDS
from ragexp.errors import ConfigError, IncomparableRunsError, TrackingError
from ragexp.metrics.offline import nearest_rank
from ragexp.metrics.registry import MetricSpec, case_values_metric, cost_metric
from ragexp.stats.multiple import holm, simultaneous_level

LATENCY, COST = case_values_metric("latency").name, cost_metric().name
"""The run-level objectives of the front beside the quality axis (each only when every point logged it)."""
TOLERANCE = 1e-12

Status = Literal["front", "dominated", "indistinguishable"]
"""``front``: no point is as good on every objective and better on one (as measured);
``dominated``: a point of the front is no slower and no dearer, and better on the quality axis
with the pairwise family's confidence; ``indistinguishable``: dominated as measured, but not
with confidence ("not distinguishable from the front")."""


def override_words(label: str) -> list[str]:
    """A point's overrides, as ``ragexp.sweep.point`` joins them with spaces, one by one: a space a
    value escapes (``a\\ b``) or quotes (``'a b'``) stays inside its override."""
    words: list[str] = []
    word, quote, escaped = "", "", False
    for ch in label:
        if escaped:
            word, escaped = word + ch, False
            continue
        if ch == "\\":
            escaped = True
        elif quote and ch == quote:
            quote = ""
        elif not quote and ch in "'\"":
            quote = ch
        elif not quote and ch.isspace():
            words += [word] if word else []
            word = ""
            continue
        word += ch
    return [*words, word] if word else words


def varying_overrides(labels: Sequence[str]) -> tuple[list[str], list[str]]:
    """(each point's overrides without those every point shares, the shared ones in order): a sweep's
    fixed overrides are said once, not on every point."""
    items = [override_words(label) for label in labels]
    shared = set.intersection(*(set(i) for i in items)) if len(items) > 1 else set()
    common = [word for word in items[0] if word in shared] if items else []
    return [" ".join(word for word in i if word not in shared) for i in items], common


_ESCAPED = re.compile(r"\\(.)|('[^']*'|\"[^\"]*\")")


def shown_override(override: str) -> str:
    """An override as a person reads it: Hydra's backslash escapes (``run_name=a\\,b``: ``a,b``)
    undone outside quotes. For reading only: what a command takes is the override as it was."""
    return _ESCAPED.sub(lambda m: m.group(1) if m.group(1) is not None else m.group(2), override)


@dataclass
class Delta:
    """A point's paired difference from the baseline on one quality metric."""

    delta: float | None
    """point - baseline of the logged means."""
    ci_low: float | None
    ci_high: float | None
    """Simultaneous interval of the mean paired difference (Bonferroni over points x metrics)."""
    p_value: float | None
    """The sign-flip test's p-value, unadjusted."""
    p_holm: float | None = None
    """Holm-adjusted over points x metrics."""
    significant: bool = False
    """Holm-adjusted p below 1 - confidence."""
    pairs: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "delta": self.delta,
            "ci_low": self.ci_low,
            "ci_high": self.ci_high,
            "p_value": self.p_value,
            "p_holm": self.p_holm,
            "significant": self.significant,
            "pairs": self.pairs,
        }


@dataclass
class Point:
    run: RunData
    number: int
    """``ragexp.sweep.num`` (-1 for a baseline outside the sweep)."""
    overrides: str
    metrics: dict[str, float | None]
    """The point's logged values: every quality metric, ``p95_seconds``, ``cost``, ``error_rate``."""
    deltas: dict[str, Delta] = field(default_factory=dict)
    status: Status = "front"
    dominated_by: str | None = None
    """A front point that dominates this one (with confidence for ``dominated``)."""

    @property
    def run_id(self) -> str:
        return self.run.run_id

    @property
    def shown(self) -> str:
        """Its overrides as a person reads them (:func:`shown_override`)."""
        return " ".join(shown_override(word) for word in override_words(self.overrides))

    @property
    def label(self) -> str:
        return f"point {self.number} [{self.shown}]" if self.number >= 0 else f"run {self.run_id}"

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "number": self.number,
            "overrides": self.overrides,
            "metrics": self.metrics,
            "deltas": {name: delta.to_json() for name, delta in self.deltas.items()},
            "pareto": self.status == "front",
            "dominated": self.status == "dominated",
            "status": self.status,
            "dominated_by": self.dominated_by,
            "errors": int(self.run.errored.sum()),
            "cases": len(self.run.case_ids),
        }


@dataclass
class Lead:
    """The winner against another point on the quality axis (pairwise family)."""

    other: Point
    delta: float
    """winner - other, in the metric's better direction (positive: the winner is better)."""
    ci_low: float
    ci_high: float

    @property
    def significant(self) -> bool:
        return self.ci_low > 0

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.other.run_id,
            "overrides": self.other.overrides,
            "delta": self.delta,
            "ci_low": self.ci_low,
            "ci_high": self.ci_high,
        }


@dataclass
class Recommendation:
    winner: Point
    metric: str
    lead: Lead | None
    """Against the runner-up (the best other point on the metric); None with one point."""
    tied: list[Point]
    """Points whose difference from the winner the pairwise family cannot tell from none."""
    alternative: Point | None
    """The cheapest, then fastest, of the winner and the tied points, when it is not the winner."""

    @property
    def significant(self) -> bool:
        return self.lead is not None and self.lead.significant

    def text(self) -> str:
        winner = self.winner
        value = fmt(winner.metrics.get(self.metric))
        head = f"{winner.label} (run {winner.run_id}) is best on {self.metric} ({value})"
        if self.lead is None:
            return head
        lead = self.lead
        shown = f"{signed(lead.delta)} [{signed(lead.ci_low)}, {signed(lead.ci_high)}]"
        if lead.significant:
            return f"{head}, ahead of {lead.other.label} by {shown}: the lead is significant"
        text = (
            f"{head}, but its lead over {lead.other.label} ({shown}) is not significant: "
            f"the sweep cannot tell {len(self.tied) + 1} points apart on {self.metric}"
        )
        if self.alternative is not None:
            text += f"; of them, {self.alternative.label} is {_cheaper(self.alternative, winner)}"
        return text

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.winner.run_id,
            "overrides": self.winner.overrides,
            "metric": self.metric,
            "value": self.winner.metrics.get(self.metric),
            "significant": self.significant,
            "runner_up": self.lead.to_json() if self.lead is not None else None,
            "tied": [point.run_id for point in self.tied],
            "alternative": self.alternative.run_id if self.alternative is not None else None,
            "text": self.text(),
        }


def _noise(latency: float | None) -> bool:
    """A latency below the noise floor: no point is faster than another by it."""
    return latency is not None and latency < LATENCY_FLOOR_SECONDS


def _cheaper(point: Point, winner: Point) -> str:
    said = []
    for name, word in ((COST, "cheaper"), (LATENCY, "faster")):
        a, b = point.metrics.get(name), winner.metrics.get(name)
        if name == LATENCY and a is not None and b is not None and _noise(a) and _noise(b):
            continue
        if a is not None and b is not None and a < b - TOLERANCE:
            said.append(f"{word} ({name} {a:.3g} vs {b:.3g})")
    return " and ".join(said)


@dataclass
class Confirmation:
    """``--confirm``: the winner chosen on part of the cases, run again on the others and gated."""

    fraction: float
    chosen_on: int
    """Cases the points were compared on."""
    held_out: list[str]
    """The cases held out, in the baseline's order."""
    run_id: str | None = None
    """The confirm run (None: nothing was confirmed, see ``skipped``)."""
    gate: GateResult | None = None
    """The confirm run gated against the baseline on the held-out cases."""
    skipped: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "fraction": self.fraction,
            "chosen_on": self.chosen_on,
            "held_out": len(self.held_out),
            "run_id": self.run_id,
            "passed": self.gate.passed if self.gate is not None else None,
            "gate": self.gate.to_json() if self.gate is not None else None,
            "skipped": self.skipped,
        }


@dataclass
class SweepAnalysis:
    parent: str
    baseline: Point
    points: list[Point]
    metric: str
    """The quality axis of the front."""
    quality: list[str]
    """Every quality metric the points share, compared with the baseline."""
    objectives: list[str]
    """The front's objectives: the quality axis, then ``p95_seconds`` and ``cost`` when every point logged them."""
    left_out: dict[str, str]
    """Objective -> why it is not in the front."""
    confidence: float
    tests: int
    """Points x metrics compared with the baseline."""
    level: float
    """Confidence of each interval against the baseline (simultaneous)."""
    pair_level: float
    """Confidence of each pairwise interval on the quality axis."""
    recommendation: Recommendation
    skipped: dict[str, str] = field(default_factory=dict)
    """Run id -> why a point of the sweep is not compared (not finished)."""
    confirm: Confirmation | None = None

    @property
    def front(self) -> list[Point]:
        return [point for point in self.points if point.status == "front"]

    def to_json(self) -> dict[str, Any]:
        return {
            "parent": self.parent,
            "baseline": self.baseline.run_id,
            "metric": self.metric,
            "objectives": self.objectives,
            "left_out": self.left_out,
            "confidence": self.confidence,
            "family": {
                "tests": self.tests,
                "adjustment": "holm",
                "intervals": "bonferroni",
                "level": self.level,
                "pairwise_level": self.pair_level,
            },
            "points": [point.to_json() for point in self.points],
            "front": [point.run_id for point in self.front],
            "recommendation": self.recommendation.to_json(),
            "skipped": self.skipped,
            "confirm": self.confirm.to_json() if self.confirm is not None else None,
        }


def delta_cells(analysis: SweepAnalysis, point: Point, on_baseline: str = "-") -> list[str]:
    """The point's difference from the baseline on each quality metric, as a table cell:
    ``+0.0500* [+0.0100, +0.0900]`` (``*``: significant after Holm's adjustment, then the
    simultaneous interval); ``-`` where none was measured; ``on_baseline`` on the baseline's own row."""
    cells = []
    for name in analysis.quality:
        delta = point.deltas.get(name)
        if point.run_id == analysis.baseline.run_id:
            cells.append(on_baseline)
        elif delta is None or delta.delta is None:
            cells.append("-")
        else:
            mark = "*" if delta.significant else ""
            cells.append(f"{signed(delta.delta)}{mark} [{signed(delta.ci_low)}, {signed(delta.ci_high)}]")
    return cells


def hold_out(case_ids: Sequence[str], fraction: float, seed: int) -> tuple[list[str], list[str]]:
    """(the cases a winner is chosen on, the held-out cases it is confirmed on): a seeded random
    ``fraction`` of ``case_ids`` held out, each part in the given order."""
    if not 0 < fraction < 1:
        raise ConfigError(f"--confirm: expected a share of the cases between 0 and 1, got {fraction:g}")
    held_count = round(len(case_ids) * fraction)
    if not 2 <= held_count <= len(case_ids) - 2:
        raise ConfigError(
            f"--confirm {fraction:g}: holds out {held_count} of {len(case_ids)} cases; both parts need at least 2"
        )
    order = np.random.default_rng(seed).permutation(sorted(case_ids))
    held = set(order[:held_count].tolist())
    return [c for c in case_ids if c not in held], [c for c in case_ids if c in held]


def subset_metrics(run: RunData, names: Sequence[str], whole: dict[str, float | None]) -> dict[str, float | None]:
    """A run's figures over the cases of ``run`` (a :meth:`RunData.select` of it): each per-case
    metric's mean over its population, the error rate, p95 over the answered cases' latency;
    ``cost`` (a run total) is taken from ``whole``, the run's logged figures."""
    answerable = ~run.unanswerable if (~run.unanswerable).any() else np.ones_like(run.unanswerable)
    found: dict[str, float | None] = {}
    for name in names:
        spec = run.spec(name)
        values = run.per_case(name)
        if spec is not None and spec.case_values == "latency":
            found[name] = nearest_rank(run.latency, 95) if name in whole and whole[name] is not None else None
        elif spec is not None and spec.case_values == "errored":
            found[name] = float(run.errored.mean()) if run.errored.size else None
        elif values is not None and spec is not None and spec.mean_of_cases:
            chosen = values[answerable] if spec.population == "answerable" else values
            finite = chosen[np.isfinite(chosen)]
            found[name] = float(finite.mean()) if finite.size else None
        else:
            found[name] = whole.get(name)
    return found


def quality_metrics(runs: Sequence[RunData]) -> list[str]:
    """The per-case quality metrics every run has, in the first run's order (latency, error rate
    and cost are not quality)."""
    first = runs[0]
    names = []
    for name in first.metrics:
        spec = first.spec(name)
        if spec is None or not (spec.mean_of_cases and spec.case_values == "score"):
            continue
        if all(name in run.metrics for run in runs):
            names.append(name)
    return names


def check_same_cases(baseline: RunData, runs: Sequence[RunData]) -> None:
    """A sweep's points are compared case by case: they must have scored the same cases."""
    want = baseline.record.tag("cases_hash") or baseline.record.tag("dataset_hash")
    for run in runs:
        have = run.record.tag("cases_hash") or run.record.tag("dataset_hash")
        if have != want or set(run.case_ids) != set(baseline.case_ids):
            raise IncomparableRunsError(
                f"run {run.run_id} did not score the cases of the baseline {baseline.run_id} (its dataset or case "
                "ids differ), so it cannot be compared case by case"
            )


def analyse(
    parent: str,
    points: Sequence[Point],
    baseline: Point,
    *,
    metric: str | None,
    confidence: float,
    resamples: int,
    seed: int,
    skipped: dict[str, str] | None = None,
) -> SweepAnalysis:
    """Everything ``ragexp sweep`` shows. ``points``: the sweep's finished points (the baseline
    among them when it is one); ``metric``: the quality axis (default: the first headline quality
    metric, else the first)."""
    if len(points) < 2:
        raise TrackingError(f"sweep {parent}: {len(points)} finished point(s); a sweep needs two to compare")
    check_same_cases(baseline.run, [point.run for point in points])
    quality = quality_metrics([baseline.run, *(point.run for point in points)])
    if not quality:
        raise TrackingError(f"sweep {parent}: its points share no per-case quality metric to compare")
    axis = _axis(metric, quality, baseline.run)
    others = [point for point in points if point.run_id != baseline.run_id]
    tests = len(others) * len(quality)
    level = simultaneous_level(confidence, tests)

    def diff(base: RunData, cand: RunData, at: float) -> dict[str, MetricDiff]:
        result = compute_diff(base, cand, resamples=resamples, confidence=at, seed=seed, top=0, allow_incomparable=True)
        return {m.name: m for m in result.metrics}

    for point in others:
        moved = diff(baseline.run, point.run, level)
        for name in quality:
            m = moved.get(name)
            here, there = point.metrics.get(name), baseline.metrics.get(name)
            point.deltas[name] = Delta(
                here - there if here is not None and there is not None else None,
                m.ci_low if m else None,
                m.ci_high if m else None,
                m.p_value if m else None,
                pairs=m.paired_cases if m else 0,
            )
    family = [delta for point in others for delta in point.deltas.values() if delta.p_value is not None]
    for delta, adjusted in zip(family, holm([d.p_value for d in family if d.p_value is not None]), strict=True):
        delta.p_holm = adjusted
        delta.significant = adjusted < 1 - confidence
    objectives, left_out = _objectives(axis, points)
    spec = baseline.run.spec(axis)
    sign = -1.0 if spec is not None and spec.direction == "lower" else 1.0
    pair_level = simultaneous_level(confidence, len(points) * (len(points) - 1) // 2)
    cache: dict[tuple[str, str], tuple[float, float, float] | None] = {}

    def better_by(a: Point, b: Point) -> tuple[float, float, float] | None:
        """How much better ``a`` is than ``b`` on the axis: (mean, low, high) of the pairwise interval."""
        key = (a.run_id, b.run_id)
        if key not in cache:
            m = diff(b.run, a.run, pair_level).get(axis)
            here, there = a.metrics.get(axis), b.metrics.get(axis)
            if m is None or here is None or there is None or m.ci_low is None or m.ci_high is None:
                cache[key] = None
            else:
                low, high = sorted((sign * m.ci_low, sign * m.ci_high))
                cache[key] = (sign * (here - there), low, high)
        return cache[key]

    _mark_front(points, objectives, sign, better_by)
    recommendation = _recommend(points, axis, objectives, sign, better_by)
    return SweepAnalysis(
        parent,
        baseline,
        list(points),
        axis,
        quality,
        objectives,
        left_out,
        confidence,
        tests,
        level,
        pair_level,
        recommendation,
        skipped or {},
    )


def _axis(metric: str | None, quality: list[str], run: RunData) -> str:
    if metric is not None:
        if metric not in quality:
            raise TrackingError(
                f"--metric {metric}: not a per-case quality metric every point has (they share: {', '.join(quality)})"
            )
        return metric
    headline = [name for name in quality if _headline(run.spec(name))]
    return headline[0] if headline else quality[0]


def _headline(spec: MetricSpec | None) -> bool:
    return spec is not None and spec.headline


def _objectives(axis: str, points: Sequence[Point]) -> tuple[list[str], dict[str, str]]:
    objectives, left_out = [axis], {}
    for name in (LATENCY, COST):
        missing = [point for point in points if point.metrics.get(name) is None]
        if missing:
            why = "no cost.prices" if name == COST else "not in its metrics"
            left_out[name] = f"{missing[0].label} did not log it ({why})"
        elif name == LATENCY and all(_noise(point.metrics[name]) for point in points):
            left_out[name] = (
                f"every point's {name} is below the latency noise floor {LATENCY_FLOOR_SECONDS:g} s (timer noise)"
            )
        else:
            objectives.append(name)
    return objectives, left_out


def _goodness(point: Point, objectives: Sequence[str], sign: float) -> list[float]:
    """The point's objectives, each turned so that larger is better."""
    values = []
    for name in objectives:
        value = point.metrics.get(name)
        if value is None:  # _objectives keeps only the objectives every point logged
            raise ValueError(f"{point.label} has no {name}")
        values.append(sign * value if name not in (LATENCY, COST) else -value)
    return values


def _dominates(a: list[float], b: list[float]) -> bool:
    return all(x >= y - TOLERANCE for x, y in zip(a, b, strict=True)) and any(
        x > y + TOLERANCE for x, y in zip(a, b, strict=True)
    )


def _mark_front(
    points: Sequence[Point],
    objectives: Sequence[str],
    sign: float,
    better_by: Callable[[Point, Point], tuple[float, float, float] | None],
) -> None:
    good = {point.run_id: _goodness(point, objectives, sign) for point in points}
    front = [p for p in points if not any(_dominates(good[q.run_id], good[p.run_id]) for q in points)]
    rest = objectives[1:]
    for point in points:
        if point in front:
            point.status, point.dominated_by = "front", None
            continue
        dominators = [f for f in front if _dominates(good[f.run_id], good[point.run_id])]
        point.status, point.dominated_by = "indistinguishable", dominators[0].run_id if dominators else None
        for f in front:
            # no slower and no dearer as measured, and better on the axis with confidence
            cheaper = all(good[f.run_id][i + 1] >= good[point.run_id][i + 1] - TOLERANCE for i in range(len(rest)))
            found = better_by(f, point) if cheaper else None
            if found is not None and found[1] > 0:
                point.status, point.dominated_by = "dominated", f.run_id
                break


def _recommend(
    points: Sequence[Point],
    axis: str,
    objectives: Sequence[str],
    sign: float,
    better_by: Callable[[Point, Point], tuple[float, float, float] | None],
) -> Recommendation:
    def order(point: Point) -> tuple[float, ...]:
        # best on the axis first; ties to the cheaper, then the faster
        axis_value = point.metrics.get(axis)
        first = -sign * axis_value if axis_value is not None else float("inf")
        return (first, *(point.metrics.get(name) or 0.0 for name in (COST, LATENCY) if name in objectives))

    ranked = sorted(points, key=order)
    winner = ranked[0]
    lead = None
    tied: list[Point] = []
    for other in ranked[1:]:
        found = better_by(winner, other)
        if found is None:
            continue
        if lead is None:
            lead = Lead(other, *found)
        if found[1] <= 0:
            tied.append(other)
    alternative = None
    if tied:
        cheapest = min([winner, *tied], key=lambda p: tuple(p.metrics.get(n) or 0.0 for n in (COST, LATENCY)))
        alternative = cheapest if cheapest is not winner and _cheaper(cheapest, winner) else None
    return Recommendation(winner, axis, lead, tied, alternative)
