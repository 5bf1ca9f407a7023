"""Per-conversation figures from the per-turn scores: whether every turn of a conversation was
correct, and the first turn that was not.

A turn is correct when it has no error and no per-case metric scored it below full marks (the
rule of :func:`ragexp.metrics.missed.below_full_marks`). A conversation with an errored turn has
neither figure: it is an error, counted apart, never a failed conversation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ragexp.conversations import conversations
from ragexp.metrics.missed import below_full_marks
from ragexp.metrics.registry import MetricSpec
from ragexp.records import Case


@dataclass(frozen=True)
class ConversationRow:
    conversation: str
    turns: int
    all_correct: bool | None
    """Every turn correct; None when a turn errored."""
    first_failed_turn: int | None
    """1-based index of the first turn that was not correct (None: all were, or a turn errored)."""
    errored_turn: int | None
    """1-based index of the first turn that errored (None: none did)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "conversation": self.conversation,
            "turns": self.turns,
            "all_correct": self.all_correct,
            "first_failed_turn": self.first_failed_turn,
            "errored_turn": self.errored_turn,
        }


@dataclass(frozen=True)
class ConversationFigures:
    rows: list[ConversationRow]

    @property
    def count(self) -> int:
        return len(self.rows)

    @property
    def turns(self) -> int:
        return sum(row.turns for row in self.rows)

    @property
    def errored(self) -> int:
        return sum(row.errored_turn is not None for row in self.rows)

    @property
    def all_correct(self) -> float | None:
        """Share of the conversations without an errored turn whose every turn was correct."""
        scored = [row.all_correct for row in self.rows if row.all_correct is not None]
        return sum(scored) / len(scored) if scored else None

    def as_metrics(self) -> dict[str, float]:
        """The run's MLflow figures (``conversations.*``)."""
        figures = {
            "conversations.count": float(self.count),
            "conversations.turns": float(self.turns),
            "conversations.errored": float(self.errored),
        }
        if self.all_correct is not None:
            figures["conversations.all_correct"] = self.all_correct
        return figures

    def to_json(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "turns": self.turns,
            "errored": self.errored,
            "all_correct": self.all_correct,
        }

    def line(self) -> str:
        """``12 conversations, 38 turns: every turn correct in 7 of 11 (1 errored)``."""
        scored = [row for row in self.rows if row.all_correct is not None]
        correct = sum(bool(row.all_correct) for row in scored)
        errored = f" ({self.errored} errored)" if self.errored else ""
        return (
            f"{self.count} conversations, {self.turns} turns: every turn correct in {correct} of {len(scored)}{errored}"
        )


def score_conversations(
    specs: Sequence[MetricSpec], scores: Mapping[str, np.ndarray], cases: Sequence[Case], errored: np.ndarray
) -> ConversationFigures | None:
    """The figures of each conversation among ``cases`` (None: there is none)."""
    chats = conversations(cases)
    if not chats:
        return None
    masks = below_full_marks(specs, scores, cases)
    missed = np.logical_or.reduce(list(masks.values())) if masks else np.zeros(len(cases), dtype=bool)
    rows = []
    for chat in chats:
        turns = [cases[position].turn for position in chat.positions]
        errored_turn = next((turn for turn, p in zip(turns, chat.positions, strict=True) if errored[p]), None)
        failed = next((turn for turn, p in zip(turns, chat.positions, strict=True) if missed[p]), None)
        if errored_turn is not None:
            rows.append(ConversationRow(chat.id, len(turns), None, None, errored_turn))
        else:
            rows.append(ConversationRow(chat.id, len(turns), failed is None, failed, None))
    return ConversationFigures(rows)
