"""How the first failing hop of each case moved between two runs of a multi-hop set: a table
hop × hop of the cases both runs scored (the per-hop metrics themselves are compared in
:mod:`ragexp.compare.diff`, paired like any other metric)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from ragexp.compare.data import RunData
from ragexp.metrics.registry import FIRST_FAILING_HOP, HOP_RECALL, hop_of


@dataclass(frozen=True)
class HopMoves:
    """Cases by (baseline's first failing hop, candidate's); 0: no hop failed."""

    hops: int
    """The last hop either run named (rows and columns run 0..hops)."""
    counts: np.ndarray
    """(hops + 1, hops + 1) int: row the baseline's first failing hop, column the candidate's."""
    paired: int
    """Cases both runs scored (the table's total)."""

    def label(self, hop: int) -> str:
        return "none" if hop == 0 else f"hop {hop}"

    def moved_to(self, hop: int) -> int:
        """Cases whose first failing hop became ``hop`` (from anything else)."""
        return int(self.counts[:, hop].sum() - self.counts[hop, hop])

    def to_json(self) -> dict[str, Any]:
        labels = [self.label(hop) for hop in range(self.hops + 1)]
        return {
            "paired": self.paired,
            "labels": labels,
            "rows": {
                labels[b]: {labels[c]: int(self.counts[b, c]) for c in range(self.hops + 1)}
                for b in range(self.hops + 1)
            },
        }

    def lines(self) -> list[str]:
        """The table as text: rows the baseline, columns the candidate."""
        labels = [self.label(hop) for hop in range(self.hops + 1)]
        width = max(len(label) for label in labels) + 2
        head = "baseline \\ candidate".ljust(22) + "".join(label.rjust(width) for label in labels)
        rows = [
            self.label(b).ljust(22) + "".join(str(int(self.counts[b, c])).rjust(width) for c in range(self.hops + 1))
            for b in range(self.hops + 1)
        ]
        return [head, *rows]


def hop_moves(base: RunData, cand: RunData) -> HopMoves | None:
    """The table over the cases of ``base`` and ``cand`` (already the shared cases, in one order)
    that both scored; None when either run has no first failing hop."""
    before, after = base.scores.get(FIRST_FAILING_HOP), cand.scores.get(FIRST_FAILING_HOP)
    if before is None or after is None:
        return None
    mask = np.isfinite(before) & np.isfinite(after)
    b, c = before[mask].astype(np.int64), after[mask].astype(np.int64)
    named = [found[1] for found in map(hop_of, [*base.metrics, *cand.metrics]) if found and found[0] == HOP_RECALL]
    hops = max([int(b.max(initial=0)), int(c.max(initial=0)), *named])
    counts = np.zeros((hops + 1, hops + 1), dtype=np.int64)
    np.add.at(counts, (b, c), 1)
    return HopMoves(hops, counts, int(mask.sum()))
