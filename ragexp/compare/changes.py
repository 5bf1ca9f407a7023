"""What changed between two runs, case by case: every case that got worse, every case that got
better, on which metrics, and what each run retrieved and answered for it.

A case moves on a metric as ``ragexp diff`` counts it: over the pairs that enter the metric's mean
(both runs scored it; answerable cases for a metric averaged over those), by more than rounding,
in the metric's direction. So for each metric the cases listed here as worse and better are the
diff table's down and up counts. A case that newly errored got worse on the error rate, one that
no longer errors got better. Run-level percentiles (P95) have no per-case move.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ragexp.compare.data import RunData
from ragexp.compare.diff import TOLERANCE
from ragexp.metrics.population import covered
from ragexp.metrics.registry import METRICS, case_values_metric
from ragexp.metrics.wording import rendered

SHOWN_MAX = 1000
"""Cases listed per direction; beyond it the rest are counted (cases.jsonl has them all)."""


@dataclass(frozen=True)
class MetricMove:
    """One metric of one case: the baseline's and the candidate's per-case value."""

    metric: str
    baseline: float | None
    candidate: float | None


@dataclass(frozen=True)
class Side:
    """What one run did for a case."""

    retrieved_ids: list[str]
    answer: str | None
    error: str | None
    rationale: dict[str, str]
    """Metric -> why it scored what it did (the row's ``rationale``, when the run wrote one),
    rendered in the reader's language where the row kept its code."""
    recorded: tuple[str, ...] = ()
    """The metrics whose rationale is the recorded text, not rendered in the reader's language."""

    @classmethod
    def of(cls, row: dict[str, Any], language: str | None = None) -> Side:
        """``language``: render the rationales in it (:func:`ragexp.metrics.wording.rendered`);
        None: as the run wrote them."""
        output = row.get("output") or {}
        rationale = row.get("rationale")
        if language is not None:
            texts, recorded = rendered(row, language)
        else:
            texts = (
                {str(k): str(v) for k, v in rationale.items() if v is not None} if isinstance(rationale, dict) else {}
            )
            recorded = list(texts)
        return cls(
            [str(i) for i in output.get("ranked_ids") or []],
            output.get("answer"),
            row.get("error"),
            texts,
            tuple(recorded),
        )


@dataclass(frozen=True)
class CaseChange:
    case_id: str
    question: str
    moves: tuple[MetricMove, ...]
    """The metrics on which the case moved this way, in the runs' metric order."""
    size: float
    """How far it moved, summed over those metrics (for the order of the list)."""
    baseline: Side
    candidate: Side


@dataclass(frozen=True)
class Changes:
    worse: list[CaseChange]
    """Every case that got worse on at least one metric (the first :data:`SHOWN_MAX`), most first."""
    better: list[CaseChange]
    worse_count: int
    better_count: int
    per_metric: dict[str, tuple[int, int]]
    """Metric -> (cases worse, cases better): the diff table's down and up counts."""

    def to_json(self) -> dict[str, Any]:
        def case(change: CaseChange) -> dict[str, Any]:
            return {
                "id": change.case_id,
                "metrics": {m.metric: {"baseline": m.baseline, "candidate": m.candidate} for m in change.moves},
                "baseline": _side_json(change.baseline),
                "candidate": _side_json(change.candidate),
            }

        return {
            "worse": [case(c) for c in self.worse],
            "better": [case(c) for c in self.better],
            "worse_count": self.worse_count,
            "better_count": self.better_count,
            "per_metric": {name: {"worse": w, "better": b} for name, (w, b) in self.per_metric.items()},
        }


def _side_json(side: Side) -> dict[str, Any]:
    return {
        "retrieved_ids": side.retrieved_ids,
        "answer": side.answer,
        "error": side.error,
        "rationale": side.rationale,
    }


def case_changes(baseline: RunData, candidate: RunData, language: str | None = None) -> Changes:
    """Every case of the shared ones that moved, worse then better (module docstring); their
    rationales in ``language`` where the runs kept their codes (None: as the runs wrote them)."""
    candidate_ids = set(candidate.case_ids)
    shared = [case_id for case_id in baseline.case_ids if case_id in candidate_ids]
    base, cand = baseline.select(shared), candidate.select(shared)
    n = len(shared)
    change: dict[str, np.ndarray] = {}
    names = [name for name in base.scores if name in cand.scores and name in METRICS]
    errors = case_values_metric("errored")
    if errors.name in base.metrics or errors.name in cand.metrics:
        names.append(errors.name)
    for name in names:
        spec = METRICS[name]
        b_values, c_values = base.per_case(name), cand.per_case(name)
        if b_values is None or c_values is None:
            continue
        mask = np.isfinite(b_values) & np.isfinite(c_values) & covered(spec, base.unanswerable)
        moved = np.where(mask, c_values - b_values, 0.0)
        change[name] = moved if spec.direction == "higher" else -moved
    per_metric = {name: (int((d < -TOLERANCE).sum()), int((d > TOLERANCE).sum())) for name, d in change.items()}
    lists = []
    for sign in (-1, 1):
        moved_by = {name: sign * d > TOLERANCE for name, d in change.items()}
        total = np.zeros(n)
        for name, d in change.items():
            total += np.where(moved_by[name], np.abs(d), 0.0)
        picked = [i for i in range(n) if any(flags[i] for flags in moved_by.values())]
        picked.sort(key=lambda i: -total[i])
        cases = []
        for i in picked[:SHOWN_MAX]:
            b_row, c_row = base.row(i), cand.row(i)
            moves = tuple(
                MetricMove(name, _value(base, name, i), _value(cand, name, i)) for name in change if moved_by[name][i]
            )
            cases.append(
                CaseChange(
                    shared[i],
                    str(c_row.get("question") or ""),
                    moves,
                    float(total[i]),
                    Side.of(b_row, language),
                    Side.of(c_row, language),
                )
            )
        lists.append((cases, len(picked)))
    (worse, worse_count), (better, better_count) = lists
    return Changes(worse, better, worse_count, better_count, per_metric)


def _value(run: RunData, name: str, i: int) -> float | None:
    values = run.per_case(name)
    if values is None or not np.isfinite(values[i]):
        return None
    return float(values[i])
