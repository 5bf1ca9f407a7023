"""Per-conversation figures from the per-turn scores: whether every turn of a conversation was
correct, and the first turn that was not.

A turn is correct when it has no error and no per-case metric scored it below full marks (the
rule of :func:`ragexp.metrics.missed.below_full_marks`). A conversation with an errored turn has
neither figure: it is an error, counted apart, never a failed conversation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
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
class TurnPosition:
    """The turns at one position of their conversations (every first turn, every second...)."""

    turn: int
    """1-based position in the conversation."""
    cases: int
    correct: int
    """Turns at this position with no error and every per-case metric at full marks."""
    errored: int
    means: dict[str, float | None]
    """Per-case metric -> its mean over this position's scored turns (answerable ones for a metric
    averaged over those); None: none scored."""

    def to_json(self) -> dict[str, Any]:
        return {
            "turn": self.turn,
            "cases": self.cases,
            "correct": self.correct,
            "errored": self.errored,
            "means": self.means,
        }


@dataclass(frozen=True)
class ConversationFigures:
    rows: list[ConversationRow]
    positions: list[TurnPosition] = field(default_factory=list)
    """Results by turn position, first turns first."""

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
            "by_turn": [position.to_json() for position in self.positions],
            "by_conversation": [row.to_json() for row in self.rows],
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
    return ConversationFigures(rows, _by_turn(specs, scores, cases, errored, missed))


def _by_turn(
    specs: Sequence[MetricSpec],
    scores: Mapping[str, np.ndarray],
    cases: Sequence[Case],
    errored: np.ndarray,
    missed: np.ndarray,
) -> list[TurnPosition]:
    turn = np.fromiter((case.turn if case.conversation is not None else 0 for case in cases), dtype=int)
    unanswerable = np.fromiter((case.unanswerable for case in cases), dtype=bool, count=len(cases))
    averaged = [spec for spec in specs if spec.per_case and spec.mean_of_cases and spec.name in scores]
    positions = []
    for at in sorted(set(turn[turn > 0].tolist())):
        here = turn == at
        means: dict[str, float | None] = {}
        for spec in averaged:
            within = here & ~unanswerable if spec.population == "answerable" else here
            values = scores[spec.name][within]
            values = values[np.isfinite(values)]
            means[spec.name] = float(values.mean()) if values.size else None
        count, wrong = int(here.sum()), int((here & (errored | missed)).sum())
        positions.append(TurnPosition(at, count, count - wrong, int((here & errored).sum()), means))
    return positions
