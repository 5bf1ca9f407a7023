"""Counts of judge calls and tokens, kept by the judge's HTTP client and summed by its scorer and
the drafter: a module of its own, so that the client does not import the scorer that imports it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ragexp import limits

UNKNOWN_USAGE = "judge.unknown_usage_calls"
"""The figure of the calls whose reply gave no usable token counts (logged when there are any)."""


@dataclass
class Usage:
    """Judge calls and tokens of a run."""

    chat_calls: int = 0
    embedding_calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    failed_calls: int = 0
    transport_failures: int = 0
    successes: int = 0
    unknown_usage: int = 0
    """Calls whose reply gave no usable token counts (one missing, negative, not a whole number):
    their tokens are unknown, not zero, so a judge price cannot be applied."""

    def add(self, other: Usage) -> None:
        for name in vars(self):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    def as_metrics(self) -> dict[str, float]:
        return {
            "judge.chat_calls": self.chat_calls,
            "judge.embedding_calls": self.embedding_calls,
            "judge.prompt_tokens": self.prompt_tokens,
            "judge.completion_tokens": self.completion_tokens,
            "judge.failed_calls": self.failed_calls,
            **({UNKNOWN_USAGE: self.unknown_usage} if self.unknown_usage else {}),
        }

    def count(self, usage: Any, keys: Sequence[str]) -> None:
        """Add the token counts of one reply's ``usage`` object (``keys``: the counts it must
        give, prompt then completion), or count the call as one of unknown usage."""
        found: list[Any] = [usage.get(key) for key in keys] if isinstance(usage, dict) else [None]
        if any(limits.count_problem(value) is not None for value in found):
            self.unknown_usage += 1
            return
        self.prompt_tokens += int(found[0])
        if len(found) > 1:
            self.completion_tokens += int(found[1])
