"""Stage attribution of a paired difference: the 2×2 factorial decomposition and its intervals.

Each case has four cells, retrieval {baseline, candidate} × generation {baseline, candidate}:
``bb`` is the baseline run, ``cc`` the candidate run, ``cb`` the baseline's generator answering from
the candidate's retrieval and ``bc`` the candidate's generator answering from the baseline's (first
letter: whose retrieval; second: whose generation). The decomposition is the factorial one with the
baseline as reference cell (treatment coding), which is exact by construction:

- retrieval effect ``R = cb - bb``: what swapping in the candidate's retrieval alone changes;
- generation effect ``G = bc - bb``: what swapping in the candidate's generator alone changes;
- interaction ``I = cc - cb - bc + bb``: what the two changes do together beyond their sum;

so ``R + G + I = cc - bb``, the case's paired delta, for every case and therefore on average.
Each part's mean carries a paired percentile bootstrap interval: one resampling of the cases
(with replacement) draws every part at once, so the parts' intervals come from the same draws.
The total's interval is the one ``diff`` gives the paired delta (:mod:`ragexp.stats.paired`):
over the same cases, the attribution's total and the diff row are one computation, one verdict.

Pure numpy: which runs the cells come from is :mod:`ragexp.workflows.attribution`'s concern.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from ragexp.stats.paired import paired_differences

PARTS = ("retrieval", "generation", "interaction")
Cause = Literal["retrieval", "generation", "both", "neither"]
"""Why a case moved, read from the swapped cells: ``retrieval`` when swapping in the candidate's
retrieval alone moves it and swapping in its generator alone does not, ``generation`` the reverse,
``both`` when either swap alone moves it, ``neither`` when only the two changes together do."""
CAUSES: tuple[Cause, ...] = ("retrieval", "generation", "both", "neither")
TOLERANCE = 1e-9
"""Per-case changes smaller than this are rounding, not change (as in :mod:`ragexp.compare.diff`)."""
BOOTSTRAP_BLOCK = 1 << 21
"""Resampling weights drawn per block (16 MB of float64): memory stays flat in the resamples."""


@dataclass(frozen=True)
class Cells:
    """One metric's per-case values in the four cells, each (n,) over the same cases."""

    bb: np.ndarray
    cb: np.ndarray
    bc: np.ndarray
    cc: np.ndarray

    def parts(self) -> dict[str, np.ndarray]:
        """Per case: ``total`` and its ``retrieval``, ``generation`` and ``interaction`` parts.
        The interaction is the remainder, so the three parts add up to the total exactly."""
        total = self.cc - self.bb
        retrieval = self.cb - self.bb
        generation = self.bc - self.bb
        return {
            "total": total,
            "retrieval": retrieval,
            "generation": generation,
            "interaction": total - retrieval - generation,
        }


@dataclass(frozen=True)
class Decomposition:
    """Mean paired delta of one metric over ``n`` cases, split three ways with intervals."""

    n: int
    total: float
    retrieval: float
    generation: float
    interaction: float
    total_ci: tuple[float, float]
    retrieval_ci: tuple[float, float]
    generation_ci: tuple[float, float]
    interaction_ci: tuple[float, float]


def bootstrap_intervals(
    columns: np.ndarray, *, resamples: int, confidence: float, seed: int
) -> list[tuple[float, float]]:
    """Percentile intervals of the mean of each row of ``columns`` (parts × cases), from one
    paired resampling of the cases: each draw weighs every row with the same case counts."""
    rows, n = columns.shape
    if n == 0:
        raise ValueError("bootstrap_intervals: no case")
    rng = np.random.default_rng(seed)
    means = np.empty((resamples, rows))
    block = max(1, BOOTSTRAP_BLOCK // n)
    uniform = np.full(n, 1.0 / n)
    for start in range(0, resamples, block):
        stop = min(start + block, resamples)
        counts = rng.multinomial(n, uniform, size=stop - start).astype(np.float64)
        means[start:stop] = counts @ columns.T / n
    alpha = (1.0 - confidence) / 2.0
    low = np.quantile(means, alpha, axis=0)
    high = np.quantile(means, 1.0 - alpha, axis=0)
    found = []
    for row in range(rows):
        values = columns[row]
        if not np.any(values != values[0]):  # a constant part: every draw is that value exactly
            found.append((float(values[0]), float(values[0])))
        else:
            found.append((float(low[row]), float(high[row])))
    return found


def decompose(cells: Cells, *, resamples: int, confidence: float, seed: int) -> Decomposition | None:
    """The decomposition of one metric over the cases whose four cells all have a value (None:
    no such case). A missing cell (an errored replay) leaves its case out; it is never 0."""
    parts = cells.parts()
    keep = np.isfinite(cells.bb) & np.isfinite(cells.cb) & np.isfinite(cells.bc) & np.isfinite(cells.cc)
    n = int(keep.sum())
    if n == 0:
        return None
    order = ("total", *PARTS)
    columns = np.vstack([parts[name][keep] for name in order])
    intervals = bootstrap_intervals(columns, resamples=resamples, confidence=confidence, seed=seed)
    # The total is the diff row's paired delta: its interval is the diff's own (the sign-flip test
    # inverted, same draws), so the table and the attribution give a metric one verdict.
    tested = paired_differences(columns[0], resamples=resamples, confidence=confidence, seed=seed)
    if tested is not None:
        intervals[0] = (tested[1], tested[2])
    means = [float(row.mean()) for row in columns]
    # The mean of the remainder is the remainder of the means: the three add up to the total.
    means[3] = means[0] - means[1] - means[2]
    return Decomposition(n, *means, *intervals)  # type: ignore[arg-type]


def case_causes(cells: list[Cells], *, tolerance: float = TOLERANCE) -> list[Cause | None]:
    """Per case, why it moved over the metrics given (None: it moved on none of them, or a cell
    is missing). A swap counts for a case when it alone moves a metric the case moved on."""
    if not cells:
        return []
    n = cells[0].bb.size
    moved = np.zeros(n, dtype=bool)
    by_retrieval = np.zeros(n, dtype=bool)
    by_generation = np.zeros(n, dtype=bool)
    missing = np.zeros(n, dtype=bool)
    for metric in cells:
        absent = ~(np.isfinite(metric.bb) & np.isfinite(metric.cb) & np.isfinite(metric.bc) & np.isfinite(metric.cc))
        missing |= absent
        with np.errstate(invalid="ignore"):
            here = np.abs(metric.cc - metric.bb) > tolerance
            moved |= here
            by_retrieval |= here & (np.abs(metric.cb - metric.bb) > tolerance)
            by_generation |= here & (np.abs(metric.bc - metric.bb) > tolerance)
    found: list[Cause | None] = []
    for i in range(n):
        if missing[i] or not moved[i]:
            found.append(None)
        elif by_retrieval[i] and by_generation[i]:
            found.append("both")
        elif by_retrieval[i]:
            found.append("retrieval")
        elif by_generation[i]:
            found.append("generation")
        else:
            found.append("neither")
    return found
