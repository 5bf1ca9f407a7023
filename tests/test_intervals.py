"""Diff intervals agree with their p-values: the sign-flip test inverted, checked by simulation
and against exact enumeration."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from ragexp.stats.paired import paired, paired_differences


@pytest.mark.system  # a whole run: `make test`, not the edit loop
def test_interval_excludes_zero_exactly_when_p_is_below_alpha_on_1000_generated_pairs() -> None:
    rng = np.random.default_rng(2026)
    agree = significant = 0
    for i in range(1000):
        n = int(rng.integers(10, 200))
        kind = i % 4
        if kind == 0:  # binary accuracy of two systems
            base = (rng.random(n) < rng.uniform(0.3, 0.9)).astype(float)
            cand = np.where(rng.random(n) < 0.7, base, (rng.random(n) < rng.uniform(0.3, 0.9)).astype(float))
        elif kind == 1:  # judge ratings on five levels
            base = rng.integers(0, 5, n) / 4
            cand = np.clip(base + rng.integers(-1, 2, n) / 4 * (rng.random(n) < 0.4), 0, 1)
        elif kind == 2:  # continuous scores with a small shift
            base = rng.random(n)
            cand = np.clip(base + rng.normal(rng.uniform(-0.05, 0.05), 0.15, n), 0, 1)
        else:  # reciprocal ranks
            base = 1 / rng.integers(1, 6, n)
            cand = 1 / rng.integers(1, 6, n)
        stats = paired(base, cand, resamples=1000, confidence=0.95, seed=i)
        assert stats is not None
        excludes = stats.ci_low > 0 or stats.ci_high < 0
        significant += stats.p_value < 0.05
        agree += excludes == (stats.p_value < 0.05)
    assert agree >= 990  # by construction every one agrees; the issue asks for at least 99%
    assert agree == 1000
    assert 100 < significant < 900  # the simulation exercised both outcomes


def _coverage(generate, reps: int = 1000) -> float:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(7)
    covered = 0
    for i in range(reps):
        diffs, truth = generate(rng)
        found = paired_differences(diffs, resamples=2000, confidence=0.95, seed=i)
        assert found is not None
        _, low, high = found
        covered += low <= truth <= high
    return covered / reps


@pytest.mark.system
def test_coverage_at_nominal_95_on_25_discrete_pairs() -> None:
    def accuracy(rng: np.random.Generator) -> tuple[np.ndarray, float]:
        base, cand = rng.random(25) < 0.7, rng.random(25) < 0.6
        return cand.astype(float) - base.astype(float), 0.6 - 0.7

    levels = np.array([0, 0.25, 0.5, 0.75, 1.0])
    p_base, p_cand = np.array([0.1, 0.1, 0.2, 0.3, 0.3]), np.array([0.15, 0.15, 0.2, 0.25, 0.25])

    def ratings(rng: np.random.Generator) -> tuple[np.ndarray, float]:
        base, cand = rng.choice(levels, 25, p=p_base), rng.choice(levels, 25, p=p_cand)
        return cand - base, float(levels @ p_cand - levels @ p_base)

    assert _coverage(accuracy) >= 0.94
    assert _coverage(ratings) >= 0.94


def _exact_p(diffs: np.ndarray, theta: float, signs: np.ndarray) -> float:
    residual = diffs - theta
    return float(np.mean(np.abs(signs @ residual) >= abs(residual.sum()) - 1e-12))


def test_interval_matches_exact_inversion_of_the_sign_flip_test() -> None:
    # n = 12: every one of the 4,096 sign vectors enumerated; the exact interval is where the
    # exact p-value of "mean = θ" stays at or above 0.05, found by bisection on each side.
    rng = np.random.default_rng(3)
    diffs = np.round(rng.normal(0.3, 0.5, 12), 3)
    signs = np.array(list(itertools.product([-1.0, 1.0], repeat=12)))

    def edge(inside: float, outside: float) -> float:
        for _ in range(60):
            middle = (inside + outside) / 2
            if _exact_p(diffs, middle, signs) >= 0.05:
                inside = middle
            else:
                outside = middle
        return inside

    mean = float(diffs.mean())
    low, high = edge(mean, mean - 5), edge(mean, mean + 5)
    found = paired_differences(diffs, resamples=200_000, confidence=0.95, seed=1)
    assert found is not None
    p_value, ci_low, ci_high = found
    assert ci_low == pytest.approx(low, abs=0.02) and ci_high == pytest.approx(high, abs=0.02)
    assert p_value == pytest.approx(_exact_p(diffs, 0.0, signs), abs=0.005)


def test_degenerate_differences() -> None:
    assert paired_differences(np.zeros(10), resamples=1000, confidence=0.95, seed=0) == (1.0, 0.0, 0.0)
    p_value, low, high = paired_differences(np.full(25, 0.5), resamples=1000, confidence=0.95, seed=0) or (0, 0, 0)
    assert p_value < 0.01 and low == pytest.approx(0.5) and high == pytest.approx(0.5)
    assert paired(np.array([np.nan]), np.array([1.0]), resamples=1000, confidence=0.95, seed=0) is None


@pytest.mark.system  # a whole run: `make test`, not the edit loop
def test_draws_in_blocks_give_the_figures_of_one_draw_matrix(monkeypatch: pytest.MonkeyPatch) -> None:
    # The draws are made a block of rows at a time to bound memory; the generator must fill them
    # in the order of the whole (resamples, groups) matrix, so a seed keeps giving the same figures.
    from ragexp.stats import paired as stats

    rng = np.random.default_rng(7)
    kinds = [
        rng.random(5000) - rng.random(5000),  # continuous: MAX_GROUPS quantile bins
        1 / rng.integers(1, 8, 5000) - 1 / rng.integers(1, 8, 5000),  # reciprocal ranks
        (rng.random(300) < 0.5) - (rng.random(300) < 0.4).astype(float),  # binary
    ]
    for diffs in kinds:
        for resamples in (100, 1001, 10_000):
            blocked = paired_differences(diffs, resamples=resamples, confidence=0.95, seed=3)
            monkeypatch.setattr(stats, "DRAW_BLOCK", 1 << 40)  # one block: the whole matrix at once
            whole = paired_differences(diffs, resamples=resamples, confidence=0.95, seed=3)
            monkeypatch.setattr(stats, "DRAW_BLOCK", 1)  # the smallest blocks: 8 rows
            rows = paired_differences(diffs, resamples=resamples, confidence=0.95, seed=3)
            monkeypatch.undo()
            assert blocked == whole == rows
