"""``ragexp diff``: per-metric and per-case comparison of two runs, and the likely stage."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from ragexp.compare.agreement import changes as agreement_changes
from ragexp.compare.data import RunData
from ragexp.compare.figures import fmt, signed
from ragexp.compare.hops import HopMoves, hop_moves
from ragexp.compare.missing import metric_why
from ragexp.compare.pairing import Pairing, SharedCases, pair_metric, shared_cases
from ragexp.compare.power import Power, paired_power
from ragexp.compare.select import identity_differences
from ragexp.config.models import LATENCY_FLOOR_SECONDS
from ragexp.datasets.ledger import Ledger
from ragexp.errors import IncomparableRunsError
from ragexp.metrics.calibration import PpiEstimate, ppi_mean
from ragexp.metrics.custom_spec import definition_change
from ragexp.metrics.population import Population, population
from ragexp.metrics.registry import METRICS, MetricSpec, Stage
from ragexp.metrics.wording import rendered
from ragexp.phrases import t
from ragexp.stats.paired import paired, paired_by_unit, unit_means
from ragexp.stats.strata import MetricStrata

TOLERANCE = 1e-9
"""Per-case changes smaller than this are rounding, not change."""

Move = Literal["better", "worse", "flat", "none", "not_comparable"]
"""Which way a metric went for its direction (``none``: one run has no value; ``not_comparable``:
the runs define the metric differently)."""
Verdict = Literal["better", "worse", "better_ns", "worse_ns", "flat", "mixed", "none", "not_comparable", "noise"]
"""A move as the tables word it: ``*_ns`` a move the paired test does not confirm (not
significant), ``mixed`` cases moved both ways with no change of the mean, ``noise`` a latency
below the noise floor in both runs."""


@dataclass
class MetricDiff:
    name: str
    direction: str
    baseline: float | None
    candidate: float | None
    """Each run's mean over the paired cases (:attr:`pairing`); a run-level figure's logged value."""
    delta: float | None
    """candidate - baseline over the paired cases (of the logged values for a run-level figure)."""
    ci_low: float | None
    ci_high: float | None
    """Confidence interval of the mean paired difference (None for run-level figures)."""
    p_value: float | None
    improved: int
    regressed: int
    unchanged: int
    paired_cases: int
    ppi: PpiEstimate | None = None
    """Prediction-powered estimate of the mean paired difference, when both runs carry human
    scores of this metric on enough shared cases (the judge's difference corrected by people's)."""
    power: Power | None = None
    """What the paired comparison can detect (None for run-level figures and without pairs)."""
    not_comparable: str | None = None
    """Why the two runs' values of this metric cannot be compared (a metric of the user's
    defined differently in each); None when they can."""
    spec: MetricSpec | None = field(default=None, repr=False, compare=False)
    """What the metric is in the candidate (None: neither run knows it)."""
    noise_floor: float | None = None
    """The latency noise floor both runs' values are below (``gates.latency_floor_seconds``):
    timer noise, worded ``below noise floor`` and never judged; None otherwise."""
    population: Population | None = None
    """The cases compared: the pairs with both scores, of the cases the metric's mean covers
    (None for a run-level figure)."""
    n: int = 0
    """Paired units the test ran on: conversations (a single question counting as one) when the
    runs have conversations, else cases."""
    unit: str = "case"
    """``conversation`` or ``case``: what the paired test and its interval resample."""
    pairing: Pairing | None = None
    """The cases paired and those left out, by reason (None for a run-level figure)."""
    baseline_own: float | None = None
    candidate_own: float | None = None
    """Each run's own logged value, over its own population (a ``min``/``max`` rule reads the
    candidate's); equal to :attr:`baseline`/:attr:`candidate` when no case is left out."""
    candidate_population: Population | None = None
    """The candidate's own population of :attr:`candidate_own` (None for a run-level figure)."""

    def __post_init__(self) -> None:
        # A comparison built without its runs' own values (no case left out): they are the pairs'.
        if self.baseline_own is None:
            self.baseline_own = self.baseline
        if self.candidate_own is None:
            self.candidate_own = self.candidate
        if self.candidate_population is None and self.pairing is None:
            self.candidate_population = self.population

    def compared(self) -> str | None:
        """The cases compared, in words, with those left out and why; None for a run-level figure."""
        if self.pairing is not None:
            return self.pairing.words()
        return self.population.words() if self.population is not None else None

    @property
    def detectable_effect(self) -> float | None:
        """Minimum detectable effect of the paired comparison (two-sided, 80% power)."""
        return self.power.detectable if self.power is not None else None

    def moved(self) -> Move:
        """Which way the candidate's value went, for this metric's direction: ``better``, ``worse``
        or ``flat`` by the sign of the delta (beyond rounding), ``none`` without a delta. Significance
        is :attr:`significant`, apart: a drop that is not significant is still a drop."""
        if self.not_comparable is not None:
            return "not_comparable"
        if self.delta is None:
            return "none"
        if abs(self.delta) <= TOLERANCE:
            return "flat"
        up = self.delta > 0
        return "better" if up == (self.direction == "higher") else "worse"

    @property
    def significant(self) -> bool | None:
        """The paired interval excludes 0 on the side the delta went (None: no interval, a
        run-level figure such as a percentile, or no pairs)."""
        if self.ci_low is None or self.ci_high is None or self.delta is None:
            return None
        return (self.ci_low > 0 and self.delta > 0) or (self.ci_high < 0 and self.delta < 0)

    def verdict(self) -> Verdict:
        """The word the tables print: the move, qualified when the test could not confirm it."""
        if self.noise_floor is not None:
            return "noise"
        moved = self.moved()
        if moved == "flat" and (self.improved or self.regressed):
            return "mixed"
        if moved in ("better", "worse") and self.significant is False:
            return "better_ns" if moved == "better" else "worse_ns"
        return moved

    def evidence(self, language: str = "en") -> str:
        """The figures behind this metric's move, for a sentence: delta, p-value, significance."""
        if self.moved() == "flat":
            return f"{self.name} {t('unchanged', language)}"
        if self.p_value is None:
            return f"{self.name} {fmt(self.baseline)} -> {fmt(self.candidate)} ({signed(self.delta)})"
        text = f"{self.name} {signed(self.delta)}, p {fmt(self.p_value)}"
        return text if self.significant else f"{text}, {t('not_significant', language)}"

    def to_json(self) -> dict[str, Any]:
        extra: dict[str, Any] = {"ppi": self.ppi.to_json()} if self.ppi is not None else {}
        if self.not_comparable is not None:
            extra["not_comparable"] = self.not_comparable
        return {
            "name": self.name,
            "direction": self.direction,
            "baseline": self.baseline,
            "candidate": self.candidate,
            "delta": self.delta,
            "ci_low": self.ci_low,
            "ci_high": self.ci_high,
            "p_value": self.p_value,
            "improved": self.improved,
            "regressed": self.regressed,
            "unchanged": self.unchanged,
            "detectable_effect": self.detectable_effect,
            "population": self.population.to_json() if self.population is not None else None,
            "n": self.n,
            "unit": self.unit,
            "pairing": self.pairing.to_json() if self.pairing is not None else None,
            "baseline_own": self.baseline_own,
            "candidate_own": self.candidate_own,
            "verdict": self.verdict(),
            "noise_floor": self.noise_floor,
            **extra,
        }


@dataclass
class DiffResult:
    baseline: RunData
    candidate: RunData
    metrics: list[MetricDiff]
    cases: list[dict[str, Any]]
    diagnosis: list[Hint]
    """The rows of the article's decision table the moves match (:func:`diagnose`)."""
    differences: list[str] = field(default_factory=list)
    """What makes the runs incomparable (empty when comparable)."""
    confidence: float = 0.95
    """Confidence level of the intervals."""
    hops: HopMoves | None = None
    """How each case's first failing hop moved (runs of a multi-hop set); None otherwise."""
    attribution: dict[str, Any] | None = None
    """``--attribute``: each metric's delta split into retrieval, generation and interaction, and
    the cases by cause (:class:`ragexp.workflows.attribution.Attribution`'s JSON); None without it."""
    ledger: Ledger | None = None
    """``--common-cases``: how the two runs' dataset versions differ; the comparison is over the
    cases both hold unchanged (None: runs of one version)."""
    bridge: dict[str, Any] | None = None
    """``--bridge-judge``: what bridged the runs' judges (:class:`ragexp.compare.bridge.Bridge`'s
    JSON); None without it."""
    strata: list[MetricStrata] | None = None
    """A shadow pair (``ragexp shadow``'s production and candidate): each metric by stratum, with
    the delta corrected by people's labels beside the judged one; None for any other pair."""

    def metric(self, name: str) -> MetricDiff | None:
        return next((m for m in self.metrics if m.name == name), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "baseline": self.baseline.run_id,
            "candidate": self.candidate.run_id,
            "comparable": not self.differences,
            "differences": self.differences,
            "metrics": [{**m.to_json(), "why_missing": metric_why(self, m)} for m in self.metrics],
            "cases": self.cases,
            "diagnosis": [hint.text() for hint in self.diagnosis],
            **({"hops": self.hops.to_json()} if self.hops is not None else {}),
            **({"attribution": self.attribution} if self.attribution is not None else {}),
            **({"ledger": self.ledger.summary_json()} if self.ledger is not None else {}),
            **({"bridge": self.bridge} if self.bridge is not None else {}),
            **({"strata": [m.to_json() for m in self.strata]} if self.strata is not None else {}),
            **(
                {"judge_agreement": moved}
                if (moved := agreement_changes(self.baseline, self.candidate, confidence=self.confidence))
                else {}
            ),
        }


def differences(baseline: RunData, candidate: RunData, *, same_cases: bool = False) -> list[str]:
    """Everything that makes two runs' scores incomparable, worded for the user (``same_cases``:
    see :func:`identity_differences`)."""
    found = identity_differences(baseline.record, candidate.record, same_cases=same_cases)
    # A run of `run --until-decided` holds the cases it evaluated before it stopped: a subset of
    # the dataset's, compared on those (the cases it did not evaluate are not errors).
    stopped_early = bool(candidate.record.tag("sequential.total")) and set(candidate.case_ids) <= set(baseline.case_ids)
    if set(baseline.case_ids) != set(candidate.case_ids) and not stopped_early:
        only_a = len(set(baseline.case_ids) - set(candidate.case_ids))
        only_b = len(set(candidate.case_ids) - set(baseline.case_ids))
        found.append(f"case ids differ ({only_a} only in the baseline, {only_b} only in the candidate)")
    return found


BRIDGE_HINT = "--bridge-judge rejudge|canaries to compare them on one judge, "


def check_comparable(baseline: RunData, candidate: RunData, *, allow: bool, same_cases: bool = False) -> list[str]:
    found = differences(baseline, candidate, same_cases=same_cases)
    if found and not allow:
        raise IncomparableRunsError(
            f"runs {baseline.run_id} and {candidate.run_id} are not comparable: {'; '.join(found)} "
            f"({BRIDGE_HINT if any(d.startswith('judge ') for d in found) else ''}"
            "--allow-incomparable to compare anyway)"
        )
    return found


def compute_diff(
    baseline: RunData,
    candidate: RunData,
    *,
    resamples: int,
    confidence: float,
    seed: int,
    top: int = 10,
    allow_incomparable: bool = False,
    ledger: Ledger | None = None,
    latency_floor: float = LATENCY_FLOOR_SECONDS,
) -> DiffResult:
    """``ledger``: the runs are of two dataset versions, restricted to the cases both hold
    unchanged (``--common-cases``), and this is how the versions differ."""
    found = check_comparable(baseline, candidate, allow=allow_incomparable, same_cases=ledger is not None)
    runs = shared_cases(baseline, candidate)
    base, cand = runs.baseline, runs.candidate
    names = [name for name in baseline.metrics if name in candidate.metrics or found]
    for name in candidate.metrics:
        if name not in names:
            names.append(name)
    metrics = [_metric_diff(name, runs, baseline, candidate, resamples, confidence, seed) for name in names]
    for metric in metrics:
        if below_noise_floor(metric, latency_floor):
            metric.noise_floor = latency_floor
    apart = {m.name for m in metrics if m.not_comparable is not None}
    worst = _worst_cases(base, cand, top, apart)
    hops = hop_moves(base, cand)
    return DiffResult(
        baseline, candidate, metrics, worst, diagnose(metrics), found, confidence, hops=hops, ledger=ledger
    )


def below_noise_floor(metric: MetricDiff, floor: float) -> bool:
    """A latency figure below ``floor`` in both runs: timer noise, not a change to judge."""
    if metric.baseline is None or metric.candidate is None or floor <= 0:
        return False
    spec = metric.spec if metric.spec is not None else METRICS.get(metric.name)
    return spec is not None and spec.stage == "latency" and max(metric.baseline, metric.candidate) < floor


def _metric_diff(
    name: str,
    runs: SharedCases,
    baseline: RunData,
    candidate: RunData,
    resamples: int,
    confidence: float,
    seed: int,
) -> MetricDiff:
    """One metric compared: every figure over its pairing (:func:`ragexp.compare.pairing.pair_metric`),
    each run's own logged value beside."""
    base, cand = runs.baseline, runs.candidate
    spec = candidate.spec(name) or baseline.spec(name)
    direction = spec.direction if spec else "higher"
    b_own, c_own = baseline.summary(name), candidate.summary(name)
    changed = definition_change(baseline.spec(name), candidate.spec(name))
    if changed is not None:
        why = f"defined differently in the two runs: {changed}"
        return MetricDiff(
            name, direction, b_own, c_own, None, None, None, None, 0, 0, 0, 0, not_comparable=why, spec=spec
        )
    b_value, c_value = b_own, c_own
    delta = c_value - b_value if b_value is not None and c_value is not None else None
    b_cases, c_cases = base.per_case(name), cand.per_case(name)
    improved = regressed = unchanged = pairs = n = 0
    compared: Population | None = None
    pairing: Pairing | None = None
    units = base.units()
    ci_low = ci_high = p_value = None
    power = None
    mask = np.zeros(len(base.case_ids), dtype=bool)
    if b_cases is not None and c_cases is not None:
        pairing = pair_metric(name, spec, runs)
        assert pairing is not None  # both runs have per-case values
        mask = pairing.mask
        change = c_cases[mask] - b_cases[mask]
        if direction == "lower":
            change = -change
        improved = int((change > TOLERANCE).sum())
        regressed = int((change < -TOLERANCE).sum())
        unchanged = int(change.size - improved - regressed)
        pairs = int(change.size)
        if spec is not None and spec.per_case:
            compared = pairing.population
        n = pairs if units is None else int(np.unique(units[mask]).size)
        if spec is None or not spec.mean_of_cases:
            pairing = None  # a run-level figure (a percentile of latency): the logged values compare
        else:
            # The means and delta of the very cases the test and the gate's rules run on.
            b_value, c_value, delta = pairing.baseline, pairing.candidate, pairing.delta
            if units is None:
                stats = paired(b_cases[mask], c_cases[mask], resamples=resamples, confidence=confidence, seed=seed)
                power = paired_power(change, confidence=confidence)
            else:
                stats = paired_by_unit(
                    b_cases[mask], c_cases[mask], units[mask], resamples=resamples, confidence=confidence, seed=seed
                )
                power = (
                    paired_power(unit_means(change, units[mask]), confidence=confidence, unit="conversation")
                    if pairs
                    else None
                )
            if stats is not None:
                ci_low, ci_high, p_value = stats.ci_low, stats.ci_high, stats.p_value
    ppi = _paired_ppi(name, base, cand, mask, confidence) if b_cases is not None and c_cases is not None else None
    own = candidate.per_case(name) if spec is not None and spec.per_case else None
    return MetricDiff(
        name,
        direction,
        b_value,
        c_value,
        delta,
        ci_low,
        ci_high,
        p_value,
        improved,
        regressed,
        unchanged,
        pairs,
        ppi,
        power,
        spec=spec,
        population=compared,
        n=n,
        unit=base.unit,
        pairing=pairing,
        baseline_own=b_own,
        candidate_own=c_own,
        candidate_population=population(spec, own, candidate.unanswerable) if own is not None else None,
    )


def _paired_ppi(name: str, base: RunData, cand: RunData, mask: np.ndarray, confidence: float) -> PpiEstimate | None:
    """PPI on the paired differences: judge candidate - baseline over every pair, corrected by
    the human candidate - baseline on the pairs both runs' datasets label."""
    if name not in base.human or name not in cand.human or name not in base.scores or name not in cand.scores:
        return None
    judged = cand.scores[name][mask] - base.scores[name][mask]
    human = cand.human[name][mask] - base.human[name][mask]
    spec = cand.spec(name)
    # A difference of two values in [low, high] lies in [low - high, high - low].
    bounds = (spec.low - spec.high, spec.high - spec.low) if spec is not None and spec.high is not None else None
    return ppi_mean(judged, human, confidence=confidence, bounds=bounds)


def _worst_cases(base: RunData, cand: RunData, top: int, apart: set[str]) -> list[dict[str, Any]]:
    """Cases ranked by how much worse the candidate did, summed over the bounded per-case metrics
    (those in ``apart``, defined differently in the two runs, left out)."""
    if top <= 0 or not base.case_ids:
        return []
    total = np.zeros(len(base.case_ids))
    for name, values in base.scores.items():
        spec = cand.spec(name)
        if name not in cand.scores or name in apart or spec is None:
            continue
        change = np.nan_to_num(cand.scores[name] - values, nan=0.0)
        total += change if spec.direction == "higher" else -change
    newly_failed = cand.errored & ~base.errored
    total[newly_failed] -= len(base.scores) or 1  # a case that broke is the worst regression of all
    order = np.argsort(total, kind="stable")
    worst = []
    for i in order[:top]:
        if total[i] >= -TOLERANCE:
            break
        b_row, c_row = base.row(int(i)), cand.row(int(i))
        worst.append(
            {
                "id": base.case_ids[i],
                "regression": round(float(-total[i]), 6),
                "metrics": {
                    name: {"baseline": b_row["metrics"].get(name), "candidate": c_row["metrics"].get(name)}
                    for name in base.scores
                    if name in cand.scores and name not in apart
                },
                "baseline": _what_it_did(b_row),
                "candidate": _what_it_did(c_row),
            }
        )
    return worst


def _what_it_did(row: dict[str, Any]) -> dict[str, Any]:
    """What a run did for a case, its rationales in diff's language (English) where the run kept
    their codes; ``rationale_recorded``: the metrics whose rationale is the text as recorded."""
    output = row.get("output") or {}
    texts, recorded = rendered(row, "en")
    return {
        "retrieved_ids": output.get("ranked_ids", []),
        "answer": output.get("answer"),
        "error": row.get("error"),
        "rationale": texts,
        "rationale_recorded": recorded,
    }


@dataclass(frozen=True)
class Hint:
    """One row of the article's decision table that a comparison matches, with the moves it read."""

    row: str
    """The row's phrase key (``stage_retrieval``, ``stage_rerank``, ...)."""
    moves: tuple[MetricDiff, ...]
    """The metrics whose moves the row reads, each said with its delta and p-value."""

    def text(self, language: str = "en") -> str:
        """The likely-stage line: the same words wherever it is shown (``diff``, its summary, the
        report, the demo); a move the paired test does not confirm says so, with its p-value."""
        evidence = "; ".join(m.evidence(language) for m in self.moves)
        return f"{t(self.row, language)} ({evidence})" if evidence else t(self.row, language)


def diagnose(metrics: list[MetricDiff]) -> list[Hint]:
    """The decision table of the RAG evaluation article: which pipeline stage a pattern of moves
    points at. It reads each metric's ``stage`` from the registry, never its name, and each move
    by the direction of its delta: a drop the paired test cannot confirm is still a drop, and the
    line says how sure each move is."""
    by_stage: dict[str, list[MetricDiff]] = {}
    for m in metrics:
        spec = METRICS.get(m.name)
        if spec is not None and spec.stage is not None and m.moved() != "none":
            by_stage.setdefault(spec.stage, []).append(m)

    def worse(stage: Stage) -> list[MetricDiff]:
        return [m for m in by_stage.get(stage, []) if m.moved() == "worse"]

    def flat(stage: Stage) -> list[MetricDiff]:
        found = by_stage.get(stage, [])
        return found if found and all(m.moved() == "flat" for m in found) else []

    found = []
    if worse("recall") and worse("ranking"):
        found.append(Hint("stage_retrieval", (*worse("recall"), *worse("ranking"))))
    elif flat("recall") and worse("ranking"):
        found.append(Hint("stage_rerank", (*flat("recall"), *worse("ranking"))))
    if not worse("recall") and not worse("ranking") and worse("answer"):
        found.append(Hint("stage_answer", tuple(worse("answer"))))
    if worse("citation") and not worse("answer"):
        found.append(Hint("stage_citation", tuple(worse("citation"))))
    quality_up = [
        m
        for m in metrics
        if m.moved() == "better" and (METRICS.get(m.name) is None or METRICS[m.name].stage not in ("latency", "errors"))
    ]
    doubled = [
        m
        for m in metrics
        if METRICS.get(m.name) is not None
        and METRICS[m.name].stage == "latency"
        and m.baseline
        and m.candidate
        and m.candidate >= 2 * m.baseline
    ]
    if quality_up and doubled:
        found.append(Hint("stage_tradeoff", (*quality_up, *doubled)))
    return found
