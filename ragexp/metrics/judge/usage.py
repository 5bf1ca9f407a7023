"""Counts of judge calls and tokens, kept by the judge's HTTP client and summed by its scorer and
the drafter: a module of its own, so that the client does not import the scorer that imports it."""

from __future__ import annotations

from dataclasses import dataclass


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
        }
