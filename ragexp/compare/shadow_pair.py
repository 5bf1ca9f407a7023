"""A shadow pair (``ragexp shadow``'s production and candidate runs) compared by stratum, read
back from the store: each case's stratum from the runs' ``traffic.json``; with people's scores of
both runs' answers (``ragexp label`` on the candidate queues a stratified paired subset), each
stratum's judged delta beside its prediction-powered correction, as ``diff`` and ``report`` show
it (:func:`ragexp.workflows.shadow.pair_strata` reads the labels).

The correction is prediction-powered inference on the paired difference
(:func:`ragexp.metrics.calibration.ppi_mean`): the judged difference of every paired case of the
stratum, plus the mean over the labelled pairs of (human difference - judged difference), its
interval from both variances. Each stratum's PPI interval is at the comparison's confidence, not
adjusted over the strata. The judged comparison by stratum is pure statistics
(:mod:`ragexp.stats.strata`); this module attaches the correction to its rows.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np

from ragexp import artifacts
from ragexp.compare.data import RunData
from ragexp.metrics.calibration import MIN_LABELLED, PpiEstimate, ppi_mean
from ragexp.stats.strata import MetricStrata, aligned, by_stratum
from ragexp.tracking.store import TAG_PREFIX, Store

PAIR_TAG = TAG_PREFIX + "shadow.production"
"""On a shadow's candidate: the production run it is compared with."""


def is_pair(baseline: RunData, candidate: RunData) -> bool:
    """Whether ``candidate`` is the candidate of a shadow whose production run is ``baseline``."""
    return candidate.record.tags.get(PAIR_TAG) == baseline.run_id


def traffic_strata(store: Store, run_id: str) -> dict[str, str]:
    """Case id -> stratum, as the run's ``traffic.json`` recorded them (empty: none recorded)."""
    if artifacts.TRAFFIC not in store.list_artifacts(run_id):
        return {}
    found = json.loads(store.read_artifact(run_id, artifacts.TRAFFIC)).get("strata")
    return {str(case): str(stratum) for case, stratum in found.items()} if isinstance(found, dict) else {}


def compare_pair(
    baseline: RunData,
    candidate: RunData,
    strata: Mapping[str, str],
    *,
    confidence: float = 0.95,
    resamples: int = 10_000,
    seed: int = 0,
    human: tuple[Mapping[str, np.ndarray], Mapping[str, np.ndarray]] | None = None,
    min_labelled: int = MIN_LABELLED,
) -> list[MetricStrata]:
    """Every metric both runs scored, compared overall and per stratum on the baseline's cases
    (production's: the whole sample; a case with no stratum recorded is in ``unknown``; a
    stratum the candidate was not asked has no delta); ``human``: people's scores of the
    baseline's and of the candidate's cases (each aligned with its run's case ids)."""
    order = list(baseline.case_ids)
    order += sorted(set(candidate.case_ids) - set(order))
    labels = [strata.get(case_id, "unknown") for case_id in order]
    base_values = aligned(baseline.case_ids, baseline.scores, order)
    cand_values = aligned(candidate.case_ids, candidate.scores, order)
    base_human = aligned(baseline.case_ids, dict(human[0]), order) if human is not None else {}
    cand_human = aligned(candidate.case_ids, dict(human[1]), order) if human is not None else {}
    out = []
    for name in sorted(set(base_values) & set(cand_values)):
        spec = candidate.spec(name)
        if spec is None:
            continue
        labelled = (base_human[name], cand_human[name]) if name in base_human and name in cand_human else None
        width = spec.high - spec.low if spec.high is not None else None
        found = by_stratum(
            name,
            spec.direction,
            base_values[name],
            cand_values[name],
            labels,
            units=_units(baseline, candidate, order),
            confidence=confidence,
            resamples=resamples,
            seed=seed,
        )
        if labelled is not None:
            found = with_ppi(
                found,
                cand_values[name] - base_values[name],
                labelled[1] - labelled[0],
                labels,
                confidence=confidence,
                width=width,
                min_labelled=min_labelled,
            )
        out.append(found)
    return out


Corrected = tuple[int, PpiEstimate | None]
"""(labelled pairs, the PPI estimate of the mean paired difference; None: too few labelled)."""


def ppi_by_stratum(
    judged: np.ndarray,
    human: np.ndarray,
    strata: Sequence[str] | np.ndarray,
    *,
    confidence: float = 0.95,
    width: float | None = None,
    min_labelled: int = MIN_LABELLED,
) -> tuple[Corrected, dict[str, Corrected]]:
    """Over all cases, and stratum -> (labelled pairs, the PPI estimate of the mean paired
    difference). ``judged``: (n,) the judged difference candidate - baseline, NaN where a run has
    no score; ``human``: (n,) people's difference, NaN where either answer is unlabelled;
    ``width``: the metric's ``high - low`` (a difference lies in [-width, width]; None: unbounded).
    The estimate is None under ``min_labelled`` labelled pairs."""
    labels = np.asarray(strata, dtype=object)
    bounds = (-width, width) if width is not None else None

    def correct(mask: np.ndarray) -> Corrected:
        j, h = judged[mask], human[mask]
        count = int((np.isfinite(j) & np.isfinite(h)).sum())
        return count, ppi_mean(j, h, confidence=confidence, min_labelled=min_labelled, bounds=bounds)

    every = correct(np.ones(len(labels), dtype=bool))
    return every, {str(stratum): correct(labels == stratum) for stratum in sorted(set(labels.tolist()))}


def with_ppi(
    found: MetricStrata,
    judged: np.ndarray,
    human: np.ndarray,
    strata: Sequence[str] | np.ndarray,
    *,
    confidence: float = 0.95,
    width: float | None = None,
    min_labelled: int = MIN_LABELLED,
) -> MetricStrata:
    """``found`` with each row's labelled pairs and PPI-corrected delta (:func:`ppi_by_stratum`)."""
    every, corrected = ppi_by_stratum(
        judged, human, strata, confidence=confidence, width=width, min_labelled=min_labelled
    )
    rows = []
    for row in found.strata:
        count, ppi = corrected.get(row.stratum, (0, None))
        rows.append(replace(row, labelled=count, ppi=ppi))
    return replace(found, overall=replace(found.overall, labelled=every[0], ppi=every[1]), strata=rows)


def _units(baseline: RunData, candidate: RunData, order: list[str]) -> np.ndarray | None:
    """Each case's conversation as an integer (a single question its own), None without any."""
    if baseline.conversations is None and candidate.conversations is None:
        return None
    known: dict[str, str | None] = {}
    for run in (candidate, baseline):
        known.update(zip(run.case_ids, run.conversations or [None] * len(run.case_ids), strict=True))
    keys: dict[str, int] = {}
    units = []
    for position, case in enumerate(order):
        conversation = known.get(case)
        units.append(keys.setdefault(conversation if conversation is not None else f"\0{position}", len(keys)))
    return np.array(units, dtype=np.int64)
