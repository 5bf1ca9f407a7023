"""How far an automatic score can be trusted, measured against human scores on labelled cases.

Pure functions, arrays in and figures out: :func:`calibrate` compares the automatic score with
the human one (error, bias, rank agreement, and agreement on the pass/fail call at a threshold,
Cohen's κ with a bootstrap interval); :func:`ppi_mean` is the prediction-powered estimate of the
mean (Angelopoulos et al., 2023): the automatic mean over every case, corrected by the mean
human - automatic difference over the labelled cases, with a normal interval whose variance adds
both parts. It stays valid however biased the judge is, provided the labelled cases are a random
subset of the cases.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from ragexp.metrics.population import covered
from ragexp.metrics.registry import MetricSpec, lookup

if TYPE_CHECKING:
    from ragexp.config.models import CalibrationConfig

MIN_LABELLED = 10


@dataclass(frozen=True)
class Calibration:
    """Judge against human on the cases that have both."""

    n: int
    mae: float
    """Mean absolute error |judge - human|."""
    bias: float
    """Mean judge - human: positive, the judge is more generous than people."""
    spearman: float | None
    """Rank correlation (None when either side is constant)."""
    accuracy: float
    """Share of cases where both fall on the same side of the threshold."""
    kappa: float | None
    """Cohen's κ of the thresholded calls (None when chance agreement is total)."""
    kappa_ci_low: float | None
    kappa_ci_high: float | None

    def to_json(self) -> dict[str, float | int | None]:
        return asdict(self)


@dataclass(frozen=True)
class PpiEstimate:
    """Prediction-powered mean of a metric and its confidence interval."""

    mean: float
    ci_low: float
    ci_high: float
    n_labelled: int
    n_total: int
    judge_mean: float
    """The uncorrected automatic mean over the same cases, for comparison."""

    def to_json(self) -> dict[str, float | int]:
        return {
            "mean": self.mean,
            "ci_low": self.ci_low,
            "ci_high": self.ci_high,
            "n_labelled": self.n_labelled,
            "n_total": self.n_total,
        }


def spearman(x: np.ndarray, y: np.ndarray) -> float | None:
    """Spearman's ρ with average ranks for ties; None when either side is constant."""
    rx, ry = _ranks(x), _ranks(y)
    sx, sy = rx.std(), ry.std()
    if sx == 0 or sy == 0:
        return None
    return float(((rx - rx.mean()) * (ry - ry.mean())).mean() / (sx * sy))


def _ranks(values: np.ndarray) -> np.ndarray:
    order = np.argsort(values, kind="stable")
    ordered = values[order]
    # Average rank of each run of equal values.
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    ends = np.r_[starts[1:], ordered.size]
    average = (starts + ends - 1) / 2.0 + 1.0
    ranks = np.empty(values.size, dtype=np.float64)
    ranks[order] = np.repeat(average, ends - starts)
    return ranks


def cohen_kappa(a: np.ndarray, b: np.ndarray) -> float | None:
    """Cohen's κ of two boolean raters; None when both always give the same single call.

    Computed from the integer counts of the 2x2 table (numerator and denominator scaled by n²),
    so κ is exact where it should be: 0 when one rater always says the same, not -3e-17, which a
    ``min_kappa: 0`` rule would fail."""
    n, agree = int(a.size), int(np.sum(a == b))
    count_a, count_b = int(np.sum(a)), int(np.sum(b))
    chance = count_a * count_b + (n - count_a) * (n - count_b)
    if chance >= n * n:
        return None
    # + 0.0 turns a negative zero (no agreement beyond chance) into a plain zero.
    return (n * agree - chance) / (n * n - chance) + 0.0


def _kappa_bootstrap(
    a: np.ndarray, b: np.ndarray, *, resamples: int, confidence: float, rng: np.random.Generator
) -> tuple[float | None, float | None]:
    """Percentile interval of κ over case resamples (a 2x2 table: one multinomial per resample)."""
    cells = np.array([np.sum(a & b), np.sum(a & ~b), np.sum(~a & b), np.sum(~a & ~b)], dtype=np.float64)
    n = int(cells.sum())
    # Counts, as in cohen_kappa: integers held exactly in float64, so a zero is a zero.
    draws = rng.multinomial(n, cells / n, size=resamples).astype(np.float64)
    both, only_a, only_b, neither = draws.T
    count_a, count_b = both + only_a, both + only_b
    chance = count_a * count_b + (n - count_a) * (n - count_b)
    with np.errstate(divide="ignore", invalid="ignore"):
        kappas = (n * (both + neither) - chance) / (n * n - chance)
    # A resample where chance agreement is total has no κ; it is left out.
    kappas = kappas[np.isfinite(kappas)]
    if kappas.size == 0:
        return None, None
    alpha = (1.0 - confidence) / 2.0
    low, high = np.quantile(kappas, [alpha, 1.0 - alpha])
    return float(low) + 0.0, float(high) + 0.0


def calibrate(
    judge: np.ndarray,
    human: np.ndarray,
    *,
    threshold: float,
    confidence: float = 0.95,
    resamples: int = 2000,
    seed: int = 0,
    min_labelled: int = MIN_LABELLED,
) -> Calibration | None:
    """Figures over the cases where both scores exist; None under ``min_labelled`` such cases."""
    both = np.isfinite(judge) & np.isfinite(human)
    j, h = judge[both], human[both]
    if j.size < min_labelled:
        return None
    error = j - h
    a, b = j >= threshold, h >= threshold
    kappa = cohen_kappa(a, b)
    low = high = None
    if kappa is not None:
        low, high = _kappa_bootstrap(a, b, resamples=resamples, confidence=confidence, rng=np.random.default_rng(seed))
    return Calibration(
        n=int(j.size),
        mae=float(np.abs(error).mean()),
        bias=float(error.mean()),
        spearman=spearman(j, h),
        accuracy=float((a == b).mean()),
        kappa=kappa,
        kappa_ci_low=low,
        kappa_ci_high=high,
    )


def normal_quantile(confidence: float) -> float:
    """Two-sided standard normal quantile z with P(|Z| <= z) = confidence."""
    from statistics import NormalDist

    return NormalDist().inv_cdf(0.5 + confidence / 2.0)


def ppi_mean(
    judge: np.ndarray,
    human: np.ndarray,
    *,
    confidence: float = 0.95,
    min_labelled: int = MIN_LABELLED,
    bounds: tuple[float, float | None] | None = None,
) -> PpiEstimate | None:
    """Prediction-powered mean: ``judge`` over every case (NaN: no score), ``human`` where labelled.

    mean = mean(judge over all scored cases) + mean(human - judge over the labelled ones);
    variance = var(judge)/N + var(human - judge)/n. None under ``min_labelled`` labelled cases.
    ``bounds``: the range of the mean (a metric's ``low`` and ``high``; None for ``high``:
    unbounded above); the estimate and both ends of its interval are clipped to it, since the mean
    of a metric bounded by 1 is never above 1 whatever the normal approximation says.
    """
    scored = np.isfinite(judge)
    labelled = scored & np.isfinite(human)
    n, total = int(labelled.sum()), int(scored.sum())
    if n < min_labelled:
        return None
    everyone = judge[scored]
    rectifier = human[labelled] - judge[labelled]
    mean = float(everyone.mean() + rectifier.mean())
    # Population variances, as ppi-python computes them (its ppi_mean_ci with lam=1).
    std = math.sqrt(everyone.var() / total + rectifier.var() / n)
    half = normal_quantile(confidence) * std
    low, high = mean - half, mean + half
    if bounds is not None:
        floor, ceiling = bounds[0], math.inf if bounds[1] is None else bounds[1]
        mean, low, high = (min(max(value, floor), ceiling) for value in (mean, low, high))
    return PpiEstimate(mean, low, high, n, total, float(everyone.mean()))


def labelled_metrics(names: list[str], custom: Mapping[str, MetricSpec] | None = None) -> list[str]:
    """The metrics of ``names`` that take human scores (registry knowledge, not a list here);
    ``custom``: the run's metrics of the user's own config, which take them too."""
    found = [(name, lookup(name, custom)) for name in names]
    return [name for name, spec in found if spec is not None and spec.human_labels]


@dataclass
class Trust:
    """What the human scores say about a run's automatic scores, by metric."""

    calibration: dict[str, Calibration]
    ppi: dict[str, PpiEstimate]

    def to_json(self) -> dict[str, Any]:
        return {
            "calibration": {name: figures.to_json() for name, figures in self.calibration.items()},
            "ppi": {name: estimate.to_json() for name, estimate in self.ppi.items()},
        }

    def as_metrics(self) -> dict[str, float]:
        """MLflow metrics ``calibration.<metric>.<stat>`` and ``ppi.<metric>.<stat>`` (None left out)."""
        metrics: dict[str, float] = {}
        for name, figures in self.calibration.items():
            for stat, value in figures.to_json().items():
                if value is not None:
                    metrics[f"calibration.{name}.{stat}"] = float(value)
        for name, estimate in self.ppi.items():
            for stat, value in estimate.to_json().items():
                metrics[f"ppi.{name}.{stat}"] = float(value)
        return metrics


def assess(
    specs: Sequence[MetricSpec],
    scores: dict[str, np.ndarray],
    human: dict[str, np.ndarray],
    unanswerable: np.ndarray,
    settings: CalibrationConfig,
) -> Trust:
    """Calibration and prediction-powered mean of every metric that has enough human scores,
    over the metric's own population (answerable cases for retrieval-style metrics)."""
    calibration: dict[str, Calibration] = {}
    ppi: dict[str, PpiEstimate] = {}
    for spec in specs:
        if spec.name not in human or spec.name not in scores:
            continue
        mask = covered(spec, unanswerable)
        judge, labels = scores[spec.name][mask], human[spec.name][mask]
        figures = calibrate(
            judge,
            labels,
            threshold=settings.threshold,
            confidence=settings.confidence,
            resamples=settings.resamples,
            min_labelled=settings.min_labelled,
        )
        if figures is not None:
            calibration[spec.name] = figures
        estimate = ppi_mean(
            judge,
            labels,
            confidence=settings.confidence,
            min_labelled=settings.min_labelled,
            bounds=(spec.low, spec.high),
        )
        if estimate is not None:
            ppi[spec.name] = estimate
    return Trust(calibration, ppi)
