"""Canaries: a small human-labelled set every judged run grades again, so a judge's drift shows.

A canary file (``judge.canaries: PATH``) is JSONL, one graded answer a line: ``id``, ``question``,
``contexts`` (list of texts), ``answer``, optional ``reference``, and ``human: {metric: score}``.
The run's judge grades each canary like a case (through the judge cache, per served identity) and
the run logs how its judge agrees with people on them (``judge_agreement.<metric>.kappa``,
``.bias``, ``.mae``, ``.n``) and each canary's grade (the ``canaries.json`` artifact), so that two
runs' judges can be compared on the same answers.

The maths here are pure: :func:`agreement` (κ, bias and MAE through
:func:`ragexp.metrics.calibration.calibrate`), :func:`agreement_change` (two judges on the same
canaries: the paired change of their bias, with its interval and p-value: drift) and
:func:`bridged_delta` (two runs' mean difference, each run's judge corrected by its own canary
error: the prediction-powered rectifier of Angelopoulos et al., 2023, with the canaries as the
labelled set).
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from statistics import NormalDist
from typing import TYPE_CHECKING, Any

import numpy as np
import orjson

from ragexp.errors import ConfigError
from ragexp.metrics.calibration import calibrate, cohen_kappa, normal_quantile
from ragexp.metrics.registry import MetricSpec
from ragexp.records import Case, CaseResult, SystemOutput

if TYPE_CHECKING:
    from ragexp.config.models import CalibrationConfig
    from ragexp.metrics.judge.scorer import JudgeOutcome, Judging

ID_PREFIX = "canary:"
"""Canary case ids carry this prefix, so a canary never passes for a case of the dataset."""


@dataclass(frozen=True)
class Canary:
    id: str
    question: str
    contexts: list[str]
    answer: str
    reference: str | None
    human: dict[str, float]


@dataclass(frozen=True)
class Canaries:
    path: str
    digest: str
    """sha256 of the file's bytes: two runs' canaries pair only when it is the same."""
    items: list[Canary]

    def records(self) -> tuple[list[Case], list[CaseResult]]:
        """The canaries as cases and recorded outputs, for the judge to grade like any case."""
        cases, results = [], []
        for line, canary in enumerate(self.items, start=1):
            case_id = ID_PREFIX + canary.id
            cases.append(Case(case_id, canary.question, [], [], canary.reference, False, line))
            results.append(CaseResult(case_id, SystemOutput(contexts=list(canary.contexts), answer=canary.answer)))
        return cases, results

    def human(self, metric: str) -> np.ndarray:
        return np.array([canary.human.get(metric, np.nan) for canary in self.items], dtype=np.float64)


def load_canaries(path: str | Path) -> Canaries:
    """Read and check a canary file; the first problem is one ConfigError naming file, line, field."""
    where = Path(path)
    try:
        raw = where.read_bytes()
    except OSError as exc:
        raise ConfigError(f"judge.canaries: cannot read {where}: {exc.strerror or exc}") from None
    items: list[Canary] = []
    seen: set[str] = set()
    for number, text in enumerate(raw.splitlines(), start=1):
        if not text.strip():
            continue

        def bad(field: str, why: str, number: int = number) -> ConfigError:
            return ConfigError(f"{where}:{number}: {field}: {why}")

        try:
            row = orjson.loads(text)
        except orjson.JSONDecodeError as exc:
            raise bad("line", f"invalid JSON ({exc})") from None
        if not isinstance(row, dict):
            raise bad("line", "expected a JSON object")
        canary_id, question, answer = row.get("id"), row.get("question"), row.get("answer")
        contexts, reference, human = row.get("contexts", []), row.get("reference"), row.get("human")
        for field, value in (("id", canary_id), ("question", question), ("answer", answer)):
            if not isinstance(value, str) or not value.strip():
                raise bad(field, "a non-empty string is required")
        assert isinstance(canary_id, str) and isinstance(question, str) and isinstance(answer, str)
        if canary_id in seen:
            raise bad("id", f"duplicate canary id {canary_id!r}")
        seen.add(canary_id)
        if not isinstance(contexts, list) or not all(isinstance(c, str) for c in contexts):
            raise bad("contexts", "a list of strings is required")
        if reference is not None and not isinstance(reference, str):
            raise bad("reference", "a string or null is required")
        if not isinstance(human, dict) or not human:
            raise bad("human", "an object of metric -> human score is required")
        scores: dict[str, float] = {}
        for metric, value in human.items():
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
                raise bad(f"human.{metric}", "a finite number is required")
            scores[str(metric)] = float(value)
        items.append(Canary(canary_id, question, list(contexts), answer, reference, scores))
    if not items:
        raise ConfigError(f"{where}: no canaries (one JSON object per line)")
    return Canaries(str(where), hashlib.sha256(raw).hexdigest(), items)


@dataclass(frozen=True)
class Agreement:
    """A judge against people on the canaries of one metric."""

    n: int
    kappa: float | None
    bias: float
    """Mean judge - human: positive, the judge is more lenient than people."""
    mae: float

    def to_json(self) -> dict[str, float | int | None]:
        return asdict(self)


def agreement(judge: np.ndarray, human: np.ndarray, *, threshold: float, min_labelled: int) -> Agreement | None:
    """κ (pass/fail at ``threshold``), bias and MAE over the canaries both graded; None under
    ``min_labelled`` of them."""
    figures = calibrate(judge, human, threshold=threshold, resamples=100, min_labelled=min_labelled)
    if figures is None:
        return None
    return Agreement(figures.n, figures.kappa, figures.bias, figures.mae)


def agreement_metrics(found: Mapping[str, Agreement]) -> dict[str, float]:
    """MLflow metrics ``judge_agreement.<metric>.<stat>`` (an undefined κ left out)."""
    metrics: dict[str, float] = {}
    for name, figures in found.items():
        for stat, value in figures.to_json().items():
            if value is not None:
                metrics[f"judge_agreement.{name}.{stat}"] = float(value)
    return metrics


@dataclass(frozen=True)
class AgreementChange:
    """Two judges graded the same canaries: how far the candidate's agreement with people moved
    from the baseline's, each figure paired canary by canary (the canaries, their answers and
    human scores are the same in both runs, so only the judge moved)."""

    n: int
    change: float
    """Mean (candidate judge - baseline judge) over the canaries both graded = the change of bias."""
    ci_low: float
    ci_high: float
    p_value: float
    """Two-sided, of no change of bias (a paired normal test on the per-canary shifts)."""
    kappa_change: float | None
    mae_change: float | None = None
    """Mean (|candidate judge - human| - |baseline judge - human|) over the canaries both graded
    and people scored; None under 2 of them."""
    mae_ci_low: float | None = None
    mae_ci_high: float | None = None
    mae_p_value: float | None = None
    """Two-sided, of no change of MAE (the same paired test on the per-canary errors)."""
    kappa_ci_low: float | None = None
    kappa_ci_high: float | None = None
    """Percentile interval of the κ change over paired resamples of the canaries (None: no
    resamples asked, or κ undefined)."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _paired_mean(shift: np.ndarray, confidence: float) -> tuple[float, float, float, float]:
    """Mean of paired differences, its normal interval and the two-sided p-value of a zero mean."""
    mean = float(shift.mean())
    se = float(shift.std(ddof=1)) / math.sqrt(shift.size)
    if se == 0.0:
        return mean, mean, mean, 1.0 if mean == 0.0 else 0.0
    half = normal_quantile(confidence) * se
    return mean, mean - half, mean + half, 2.0 * (1.0 - NormalDist().cdf(abs(mean) / se))


def _kappa_change_interval(
    baseline: np.ndarray, candidate: np.ndarray, human: np.ndarray, *, resamples: int, confidence: float, seed: int
) -> tuple[float | None, float | None]:
    """Percentile interval of κ(candidate) - κ(baseline) over resamples of the canaries, the same
    canaries drawn for both judges (a resample where either κ is undefined is left out)."""
    rng = np.random.default_rng(seed)
    draws = rng.integers(0, human.size, size=(resamples, human.size))
    found = []
    for rows in draws:
        cand = cohen_kappa(candidate[rows], human[rows])
        base = cohen_kappa(baseline[rows], human[rows])
        if cand is not None and base is not None:
            found.append(cand - base)
    if not found:
        return None, None
    alpha = (1.0 - confidence) / 2.0
    low, high = np.quantile(np.array(found), [alpha, 1.0 - alpha])
    return float(low) + 0.0, float(high) + 0.0


def agreement_change(
    baseline: np.ndarray,
    candidate: np.ndarray,
    human: np.ndarray,
    *,
    threshold: float,
    confidence: float = 0.95,
    resamples: int = 0,
    seed: int = 0,
) -> AgreementChange | None:
    """The paired change of agreement between two judges on the same canaries (aligned arrays,
    NaN: not graded): of bias (over the canaries both graded), of MAE (over those people scored
    too), each with a normal interval and a two-sided p-value of no change; of κ, with a paired
    bootstrap interval when ``resamples`` > 0. None under 2 pairs."""
    both = np.isfinite(baseline) & np.isfinite(candidate)
    n = int(both.sum())
    if n < 2:
        return None
    mean, low, high, p_value = _paired_mean(candidate[both] - baseline[both], confidence)
    kappa_change = None
    mae: tuple[float | None, float | None, float | None, float | None] = (None, None, None, None)
    kappa_ci: tuple[float | None, float | None] = (None, None)
    labelled = both & np.isfinite(human)
    if labelled.sum() >= 2:
        b, c, h = baseline[labelled], candidate[labelled], human[labelled]
        mae = _paired_mean(np.abs(c - h) - np.abs(b - h), confidence)
        base = calibrate(b, h, threshold=threshold, resamples=100, min_labelled=2)
        cand = calibrate(c, h, threshold=threshold, resamples=100, min_labelled=2)
        if base and cand and base.kappa is not None and cand.kappa is not None:
            kappa_change = cand.kappa - base.kappa
            if resamples > 0:
                kappa_ci = _kappa_change_interval(
                    b >= threshold,
                    c >= threshold,
                    h >= threshold,
                    resamples=resamples,
                    confidence=confidence,
                    seed=seed,
                )
    return AgreementChange(n, mean, low, high, p_value, kappa_change, *mae, *kappa_ci)


@dataclass(frozen=True)
class BridgedDelta:
    """Two runs judged by different judges, compared after each judge's canary correction."""

    n: int
    """Cases both runs scored."""
    canaries: int
    """Canaries both judges graded (paired) or the smaller of the two sets."""
    raw: float
    """Candidate - baseline mean of the judge scores as they were."""
    correction: float
    """What the canaries say the judges' difference of bias adds: baseline judge - candidate judge."""
    delta: float
    ci_low: float
    ci_high: float

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def bridged_delta(
    baseline: np.ndarray,
    candidate: np.ndarray,
    baseline_canaries: np.ndarray,
    candidate_canaries: np.ndarray,
    human: np.ndarray,
    *,
    confidence: float = 0.95,
    paired: bool = True,
) -> BridgedDelta | None:
    """The difference of two runs' means, each run's judge corrected by its own canary error.

    ``baseline``/``candidate``: the runs' scores of the same cases (aligned, NaN: no score);
    ``*_canaries``: each run's judge on the canaries; ``human``: the canaries' human scores.
    Each run's corrected mean is its judge mean plus mean(human - judge) over the canaries; the
    difference needs no human score when both judges graded the same canaries (``paired``), since
    the human parts cancel. Variance: the paired case differences over n plus the canary
    rectifiers' over their count (their difference, paired). None under 2 cases or canaries."""
    cases = np.isfinite(baseline) & np.isfinite(candidate)
    n = int(cases.sum())
    if n < 2:
        return None
    difference = candidate[cases] - baseline[cases]
    raw = float(difference.mean())
    variance = float(difference.var(ddof=1)) / n
    if paired:
        both = np.isfinite(baseline_canaries) & np.isfinite(candidate_canaries) & np.isfinite(human)
        m = int(both.sum())
        if m < 2:
            return None
        gap = baseline_canaries[both] - candidate_canaries[both]
        correction = float(gap.mean())
        variance += float(gap.var(ddof=1)) / m
    else:
        rect_b = (human - baseline_canaries)[np.isfinite(human) & np.isfinite(baseline_canaries)]
        rect_c = (human - candidate_canaries)[np.isfinite(human) & np.isfinite(candidate_canaries)]
        m = int(min(rect_b.size, rect_c.size))
        if m < 2:
            return None
        correction = float(rect_c.mean() - rect_b.mean())
        variance += float(rect_b.var(ddof=1)) / rect_b.size + float(rect_c.var(ddof=1)) / rect_c.size
    delta = raw + correction
    half = normal_quantile(confidence) * math.sqrt(variance)
    return BridgedDelta(n, m, raw, correction, delta, delta - half, delta + half)


@dataclass
class Graded:
    """The run's judge on the canaries."""

    canaries: Canaries
    scores: dict[str, np.ndarray]
    """Judge metric -> each canary's grade (NaN: none)."""
    agreement: dict[str, Agreement]
    outcome: JudgeOutcome

    def artifact(self) -> dict[str, Any]:
        return {
            "digest": self.canaries.digest,
            "ids": [canary.id for canary in self.canaries.items],
            "human": {name: _nullable(self.canaries.human(name)) for name in self.scores},
            "judge": {name: _nullable(values) for name, values in self.scores.items()},
            "agreement": {name: figures.to_json() for name, figures in self.agreement.items()},
            "served": sorted(self.outcome.served),
        }


def _nullable(values: np.ndarray) -> list[float | None]:
    return [float(v) if math.isfinite(v) else None for v in values]


def grade(
    scorer: Judging,
    canaries: Canaries,
    specs: list[MetricSpec],
    settings: CalibrationConfig,
    *,
    progress: bool | None,
) -> Graded:
    """The run's judge grades the canaries (through its cache, per served identity), and how it
    agrees with people on each judge metric the canaries carry human scores for."""
    judged = [spec for spec in specs if spec.judge and any(spec.name in c.human for c in canaries.items)]
    cases, results = canaries.records()
    outcome = scorer.score(cases, results, progress=progress)
    scores = {spec.name: outcome.scores[spec.name] for spec in judged if spec.name in outcome.scores}
    found: dict[str, Agreement] = {}
    for name, values in scores.items():
        human = canaries.human(name)
        figures = agreement(values, human, threshold=settings.threshold, min_labelled=settings.min_labelled)
        if figures is not None:
            found[name] = figures
    return Graded(canaries, scores, found, outcome)
