"""Stage attribution (``diff --attribute``): the decomposition, generation from given contexts,
and the replay workflow end to end on real runs in a SQLite MLflow store."""

from __future__ import annotations

import numpy as np
import pytest

from ragexp.compare.attribution import Cells, bootstrap_intervals, case_causes, decompose


def _cells(bb: list[float], cb: list[float], bc: list[float], cc: list[float]) -> Cells:
    return Cells(*(np.array(values, dtype=np.float64) for values in (bb, cb, bc, cc)))


def test_parts_add_up_to_the_total_for_every_case_and_on_average() -> None:
    rng = np.random.default_rng(3)
    cells = Cells(*(rng.random(200) for _ in range(4)))
    parts = cells.parts()
    assert np.allclose(parts["retrieval"] + parts["generation"] + parts["interaction"], parts["total"], atol=1e-12)
    found = decompose(cells, resamples=500, confidence=0.95, seed=0)
    assert found is not None and found.n == 200
    assert found.retrieval + found.generation + found.interaction == pytest.approx(found.total, abs=1e-12)
    assert found.total == pytest.approx(float((cells.cc - cells.bb).mean()))
    for low, high in (found.retrieval_ci, found.generation_ci, found.interaction_ci, found.total_ci):
        assert low < high


def test_known_interaction_of_a_2x2() -> None:
    # Either change alone keeps the answer right; both together break it: pure interaction.
    cells = _cells([1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 1])
    parts = cells.parts()
    assert parts["retrieval"].tolist() == [0, -1, 0]
    assert parts["generation"].tolist() == [0, 0, 1]
    assert parts["interaction"].tolist() == [-1, 0, 0]
    assert case_causes([cells]) == ["neither", "retrieval", "generation"]
    found = decompose(cells, resamples=200, confidence=0.9, seed=1)
    assert found is not None
    assert (found.total, found.retrieval, found.generation, found.interaction) == pytest.approx((-1 / 3, -1 / 3, 1 / 3, -1 / 3))


def test_a_part_that_is_zero_for_every_case_is_exactly_zero_with_a_zero_interval() -> None:
    cells = _cells([1, 0, 1, 1], [1, 0, 1, 1], [0, 1, 0, 1], [0, 1, 0, 1])
    found = decompose(cells, resamples=300, confidence=0.95, seed=0)
    assert found is not None
    assert found.retrieval == 0.0 and found.retrieval_ci == (0.0, 0.0)
    assert found.interaction == 0.0 and found.interaction_ci == (0.0, 0.0)
    assert found.generation == found.total == -0.25
    assert case_causes([cells]) == ["generation", "generation", "generation", None]


def test_a_missing_cell_leaves_its_case_out_never_zero() -> None:
    cells = _cells([1, 1], [np.nan, 1], [0, 1], [0, 0])
    found = decompose(cells, resamples=200, confidence=0.95, seed=0)
    assert found is not None and found.n == 1 and found.total == -1.0
    assert case_causes([cells]) == [None, "neither"]
    assert decompose(_cells([np.nan], [1], [1], [1]), resamples=200, confidence=0.95, seed=0) is None


def test_both_swaps_moving_a_case_is_both() -> None:
    assert case_causes([_cells([1], [0], [0], [0])]) == ["both"]


def test_bootstrap_is_paired_and_covers_the_mean() -> None:
    rng = np.random.default_rng(0)
    values = rng.normal(0.3, 1.0, size=400)
    rows = np.vstack([values, values * 2])
    (low_a, high_a), (low_b, high_b) = bootstrap_intervals(rows, resamples=2000, confidence=0.95, seed=5)
    assert low_a < values.mean() < high_a
    # The same case weights for both rows: the second interval is exactly twice the first.
    assert (low_b, high_b) == pytest.approx((2 * low_a, 2 * high_a))
    # The interval's width is that of the mean's standard error (about 2 x 1.96 x 1/sqrt(400)).
    assert 0.15 < high_a - low_a < 0.25
    again = bootstrap_intervals(rows, resamples=2000, confidence=0.95, seed=5)
    assert again[0] == (low_a, high_a)
