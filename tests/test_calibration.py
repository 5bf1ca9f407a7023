"""Judge calibration and prediction-powered means, checked against scipy, scikit-learn and
ppi-python (test-only oracles) on generated data with known answers."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import spearmanr
from sklearn.metrics import cohen_kappa_score

from ragexp.compare.diff import MetricDiff
from ragexp.compare.gate import rule_results
from ragexp.config.compose import compose
from ragexp.metrics.calibration import calibrate, cohen_kappa, ppi_mean, spearman


def biased_judge(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Human scores on five levels; a judge that is generous by about .15 and noisy."""
    human = rng.integers(0, 5, n) / 4
    judge = np.clip(human + 0.15 + rng.normal(0, 0.15, n), 0, 1)
    return judge, human


def test_calibration_figures_match_independent_computations() -> None:
    rng = np.random.default_rng(4)
    judge, human = biased_judge(rng, 60)
    judge[[3, 17]] = np.nan  # judge errors: left out, not scored as anything
    c = calibrate(judge, human, threshold=0.5, resamples=4000, seed=1)
    assert c is not None
    ok = np.isfinite(judge)
    j, h = judge[ok], human[ok]
    assert c.n == 58
    assert c.mae == pytest.approx(np.mean(np.abs(j - h)))
    assert c.bias == pytest.approx(np.mean(j - h)) and c.bias > 0.05
    assert c.spearman == pytest.approx(spearmanr(j, h).statistic)
    assert c.accuracy == pytest.approx(np.mean((j >= 0.5) == (h >= 0.5)))
    assert c.kappa == pytest.approx(cohen_kappa_score(j >= 0.5, h >= 0.5))
    assert c.kappa_ci_low is not None and c.kappa_ci_high is not None
    assert c.kappa_ci_low < c.kappa < c.kappa_ci_high
    # The 2x2-table bootstrap against a plain case-resampling bootstrap of κ.
    a, b = j >= 0.5, h >= 0.5
    draws = rng.integers(0, a.size, (4000, a.size))
    kappas = [cohen_kappa(a[d], b[d]) for d in draws]
    direct = np.quantile([k for k in kappas if k is not None], [0.025, 0.975])
    assert c.kappa_ci_low == pytest.approx(direct[0], abs=0.05)
    assert c.kappa_ci_high == pytest.approx(direct[1], abs=0.05)


def test_spearman_ties_and_constant_sides() -> None:
    x = np.array([0, 0, 0.5, 0.5, 1, 1, 1, 0.25])
    y = np.array([0, 0.25, 0.25, 1, 1, 0.75, 1, 0])
    assert spearman(x, y) == pytest.approx(spearmanr(x, y).statistic)
    assert spearman(np.ones(5), np.arange(5.0)) is None
    assert cohen_kappa(np.ones(5, bool), np.ones(5, bool)) is None


def test_too_few_labels_give_no_calibration() -> None:
    judge, human = np.linspace(0, 1, 20), np.full(20, np.nan)
    human[:9] = 0.5
    assert calibrate(judge, human, threshold=0.5) is None
    assert ppi_mean(judge, human) is None
    human[9] = 0.5
    assert calibrate(judge, human, threshold=0.5) is not None


def test_ppi_matches_ppi_python() -> None:
    from ppi_py import ppi_mean_ci

    rng = np.random.default_rng(9)
    judge, human_all = biased_judge(rng, 500)
    labelled = rng.choice(500, 80, replace=False)
    human = np.full(500, np.nan)
    human[labelled] = human_all[labelled]
    estimate = ppi_mean(judge, human, confidence=0.9)
    assert estimate is not None and (estimate.n_labelled, estimate.n_total) == (80, 500)
    low, high = ppi_mean_ci(human[labelled], judge[labelled], judge, alpha=0.1, lam=1)
    assert estimate.ci_low == pytest.approx(float(np.ravel(low)[0]))
    assert estimate.ci_high == pytest.approx(float(np.ravel(high)[0]))
    assert estimate.mean == pytest.approx(judge.mean() + (human[labelled] - judge[labelled]).mean())


def test_ppi_covers_the_human_mean_where_the_biased_judge_does_not() -> None:
    # Known answer: the population's human mean. The judge mean is off by ~.15; the PPI interval
    # computed from 40 labels out of 400 covers the truth at about its nominal rate.
    rng = np.random.default_rng(12)
    covered = judge_off = 0
    for _ in range(400):
        judge, human_all = biased_judge(rng, 400)
        truth = 0.5  # five equally likely levels 0, .25, .5, .75, 1
        human = np.full(400, np.nan)
        pick = rng.choice(400, 40, replace=False)
        human[pick] = human_all[pick]
        estimate = ppi_mean(judge, human, confidence=0.95)
        assert estimate is not None
        covered += estimate.ci_low <= truth <= estimate.ci_high
        judge_off += not abs(judge.mean() - truth) < 0.04
    assert covered / 400 >= 0.92
    assert judge_off / 400 > 0.9


def diff_of(name: str) -> MetricDiff:
    return MetricDiff(name, "higher", 0.8, 0.8, 0.0, -0.01, 0.01, 0.9, 0, 0, 40, 40)


def test_calibration_gate_rules_fail_with_the_reason() -> None:
    gates = compose(["+gates.rules.faithfulness.min_kappa=0.4", "+gates.rules.faithfulness.max_abs_bias=0.1"]).gates
    metrics = {name: diff_of(name) for name in ["recall_at_k", "mrr", "citation_precision", "answer_accuracy"]}
    metrics["citation_precision"] = MetricDiff("citation_precision", "higher", 1, 1, 0, 0, 0, 1, 0, 0, 40, 40)
    metrics["p95_seconds"] = MetricDiff("p95_seconds", "lower", 1, 1, 0, None, None, None, 0, 0, 40, 40)
    metrics["faithfulness"] = diff_of("faithfulness")

    def faithfulness(calibration: dict[str, float]) -> list[tuple[str, str, str]]:
        results = rule_results(gates, metrics, 0, 40, {"faithfulness": calibration})
        return [(r.rule, r.outcome, r.message) for r in results if r.metric == "faithfulness"]

    low = faithfulness({"n": 40, "kappa": 0.21, "bias": -0.02})
    assert low[0] == ("min_kappa", "failed", "faithfulness: judge not calibrated (κ 0.21 < 0.40 on 40 labelled cases)")
    assert low[1][:2] == ("max_abs_bias", "passed")
    biased = faithfulness({"n": 40, "kappa": 0.62, "bias": 0.25})
    assert biased[0][1] == "passed" and biased[1][:2] == ("max_abs_bias", "failed")
    assert "|bias| 0.250 > 0.100 on 40 labelled cases" in biased[1][2]
    missing = faithfulness({})
    assert [status for _, status, _ in missing] == ["undecided", "undecided"]
    assert all("judge not calibrated" in message for _, _, message in missing)
    undefined = faithfulness({"n": 12, "bias": 0.0})
    assert undefined[0][1] == "undecided" and "κ undefined" in undefined[0][2]
    assert math.isclose(gates.rules["faithfulness"].min_kappa or 0, 0.4)


@pytest.mark.parametrize("n", range(10, 41))
def test_kappa_is_exactly_zero_when_one_rater_always_says_the_same(n: int) -> None:
    # Every human label 0 (or 1), the judge passing some: no agreement beyond chance, exactly —
    # a float-noise -3e-17 would fail a `min_kappa: 0` rule and print as a negative κ.
    for passed in range(1, n):
        judge = np.zeros(n, dtype=bool)
        judge[:passed] = True
        for constant in (np.zeros(n, dtype=bool), np.ones(n, dtype=bool)):
            assert cohen_kappa(judge, constant) == 0.0 and cohen_kappa(constant, judge) == 0.0
    scores = np.linspace(0.1, 0.9, n)
    figures = calibrate(scores, np.zeros(n), threshold=0.5, resamples=200)
    assert figures is not None and figures.kappa == 0.0
    assert figures.kappa_ci_low == 0.0 and figures.kappa_ci_high == 0.0
    gates = compose(["+gates.rules.faithfulness.min_kappa=0"]).gates
    results = rule_results(
        gates, {"faithfulness": diff_of("faithfulness")}, 0, n, {"faithfulness": {"n": n, "kappa": figures.kappa}}
    )
    assert next(r for r in results if r.rule == "min_kappa").outcome == "passed"
