"""A comparison of two runs of conversations by turn position: every first turn, every second...

Each metric's means and delta at a position are over the turns both runs scored there (the pairs
``diff`` compares, within the metric's population), so a row says what moved at which depth of
the conversations.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ragexp.compare.data import RunData
from ragexp.metrics.population import covered


@dataclass(frozen=True)
class TurnRow:
    turn: int
    """1-based position in the conversation."""
    metrics: dict[str, tuple[float, float, int]]
    """Metric -> (baseline mean, candidate mean, pairs) over the turns at this position both runs scored."""

    def to_json(self) -> dict[str, Any]:
        return {
            "turn": self.turn,
            "metrics": {
                name: {"baseline": b, "candidate": c, "delta": c - b, "pairs": n}
                for name, (b, c, n) in self.metrics.items()
            },
        }


def positions(run: RunData) -> np.ndarray | None:
    """(n,) each case's 1-based turn position in its conversation, in the run's case order (0 for a
    single question); None when the run has no conversation."""
    if run.conversations is None:
        return None
    seen: dict[str, int] = {}
    out = np.zeros(len(run.conversations), dtype=np.int64)
    for index, conversation in enumerate(run.conversations):
        if conversation is not None:
            seen[conversation] = seen.get(conversation, 0) + 1
            out[index] = seen[conversation]
    return out


def by_turn(baseline: RunData, candidate: RunData, names: list[str]) -> list[TurnRow]:
    """Per turn position, each per-case metric's paired means over the cases both runs hold."""
    if baseline.conversations is None:
        return []  # before narrowing the runs to their shared ids, which costs a pass over every case
    shared_ids = set(candidate.case_ids)
    shared = [case_id for case_id in baseline.case_ids if case_id in shared_ids]
    base, cand = baseline.select(shared), candidate.select(shared)
    turns = positions(base)
    if turns is None:
        return []
    rows = []
    for at in sorted(set(turns[turns > 0].tolist())):
        here = turns == at
        figures: dict[str, tuple[float, float, int]] = {}
        for name in names:
            spec = cand.spec(name)
            b, c = base.per_case(name), cand.per_case(name)
            if b is None or c is None or spec is None or spec.case_values != "score":
                continue  # a run-level figure (p95, the error rate) has no mean per turn
            mask = here & np.isfinite(b) & np.isfinite(c) & covered(cand.spec(name), base.unanswerable)
            if mask.any():
                figures[name] = (float(b[mask].mean()), float(c[mask].mean()), int(mask.sum()))
        rows.append(TurnRow(at, figures))
    return rows


def turn_table(rows: list[TurnRow], names: list[str], headers: tuple[str, str]) -> tuple[list[str], list[list[str]]]:
    """Headers and cells of the by-turn table every output shows: per turn, each metric's baseline ->
    candidate and delta, and the pairs; ``headers``: the words for "turn" and "pairs"."""
    from ragexp.compare.figures import fmt, signed

    shown = [name for name in names if any(name in row.metrics for row in rows)]
    cells = []
    for row in rows:
        line = [str(row.turn)]
        for name in shown:
            b, c, _ = row.metrics.get(name, (None, None, 0))
            line.append(f"{fmt(b)} -> {fmt(c)} ({signed(c - b)})" if b is not None and c is not None else "—")
        line.append(str(max((n for _, _, n in row.metrics.values()), default=0)))
        cells.append(line)
    return [headers[0], *shown, headers[1]], cells
