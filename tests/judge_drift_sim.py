"""A simulated judge drift, for the test suite (small) and ``make bench-judge-drift`` (large).

Each simulation draws a baseline system and a candidate system answering the same ``cases``
(true quality per answer in [0, 1], the candidate better by ``effect`` on average), and a canary
set of ``canaries`` human-graded answers drawn like the baseline's. The judge grades an answer as
its true quality plus an error of its own for that answer (the same for both judge versions: a
judge's idiosyncrasy), plus call noise. The baseline run is judged by the old judge; the
candidate run by the drifted judge, ``drift`` more lenient on borderline answers (true quality
within ``BORDER``). Both runs grade the canaries with their own judge, as every judged run does.

What it measures, with the project's own functions:
- **detection**: :func:`ragexp.metrics.canaries.agreement_change` on the canaries (the candidate
  judge's bias minus the baseline judge's, paired) rejects "no change" at ``alpha``;
- **coverage**: whether the 95% interval of the raw paired delta (the runs' judge scores as they
  are, :func:`ragexp.stats.paired`'s normal interval of the mean difference) and of the bridged
  delta (:func:`ragexp.metrics.canaries.bridged_delta`) covers the true system delta.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ragexp.metrics.calibration import normal_quantile
from ragexp.metrics.canaries import agreement_change, bridged_delta

BORDER = (0.35, 0.65)
QUALITY_MEAN, QUALITY_SD = 0.55, 0.22
JUDGE_ERROR_SD = 0.08
CALL_NOISE_SD = 0.03
CHANGE_SD = 0.08
"""Spread of the per-answer change between the two systems around ``effect``."""


@dataclass(frozen=True)
class Figures:
    simulations: int
    detected: float
    """Share of simulations where the canaries showed the drift (p < alpha)."""
    raw_coverage: float
    bridged_coverage: float
    true_delta: float
    mean_raw: float
    mean_bridged: float
    mean_bridged_width: float


def _judge(rng: np.random.Generator, quality: np.ndarray, error: np.ndarray, drift: float) -> np.ndarray:
    border = (quality >= BORDER[0]) & (quality <= BORDER[1])
    graded = quality + error + rng.normal(0.0, CALL_NOISE_SD, quality.size) + drift * border
    return np.clip(graded, 0.0, 1.0)


def _qualities(rng: np.random.Generator, n: int) -> np.ndarray:
    return np.clip(rng.normal(QUALITY_MEAN, QUALITY_SD, n), 0.0, 1.0)


def true_delta(effect: float, draws: int = 2_000_000, seed: int = 12345) -> float:
    """The candidate's mean true quality minus the baseline's over the population (clipping makes
    it a little under ``effect``), by a large Monte Carlo draw."""
    rng = np.random.default_rng(seed)
    base = _qualities(rng, draws)
    cand = np.clip(base + rng.normal(effect, CHANGE_SD, draws), 0.0, 1.0)
    return float((cand - base).mean())


def simulate(
    simulations: int,
    *,
    cases: int = 500,
    canaries: int = 60,
    drift: float = 0.08,
    effect: float = 0.03,
    alpha: float = 0.05,
    confidence: float = 0.95,
    seed: int = 0,
) -> Figures:
    rng = np.random.default_rng(seed)
    truth = true_delta(effect)
    z = normal_quantile(confidence)
    detected = raw_hits = bridged_hits = 0
    raws, bridged, widths = [], [], []
    for _ in range(simulations):
        base_quality = _qualities(rng, cases)
        cand_quality = np.clip(base_quality + rng.normal(effect, CHANGE_SD, cases), 0.0, 1.0)
        base_scores = _judge(rng, base_quality, rng.normal(0.0, JUDGE_ERROR_SD, cases), 0.0)
        cand_scores = _judge(rng, cand_quality, rng.normal(0.0, JUDGE_ERROR_SD, cases), drift)
        human = _qualities(rng, canaries)
        canary_error = rng.normal(0.0, JUDGE_ERROR_SD, canaries)
        base_canaries = _judge(rng, human, canary_error, 0.0)
        cand_canaries = _judge(rng, human, canary_error, drift)

        change = agreement_change(base_canaries, cand_canaries, human, threshold=0.5, confidence=confidence)
        assert change is not None
        detected += change.p_value < alpha

        difference = cand_scores - base_scores
        raw = float(difference.mean())
        half = z * float(difference.std(ddof=1)) / math.sqrt(cases)
        raw_hits += raw - half <= truth <= raw + half
        bridge = bridged_delta(base_scores, cand_scores, base_canaries, cand_canaries, human, confidence=confidence)
        assert bridge is not None
        bridged_hits += bridge.ci_low <= truth <= bridge.ci_high
        raws.append(raw)
        bridged.append(bridge.delta)
        widths.append(bridge.ci_high - bridge.ci_low)
    return Figures(
        simulations,
        detected / simulations,
        raw_hits / simulations,
        bridged_hits / simulations,
        truth,
        float(np.mean(raws)),
        float(np.mean(bridged)),
        float(np.mean(widths)),
    )
