"""Metric functions of a team's own (``metrics.custom`` of ``kind: python``), in the shapes teams
write them: a bool, a number, ``{"score", "rationale"}``, and the ways they go wrong."""

from __future__ import annotations

import threading
import time
from typing import Any

from ragexp.records import Case, SystemOutput

HOTLINE = "400-820-8820"
SEEN: dict[str, str] = {}
"""Case id -> the name of the thread that scored it (the tests check where calls ran)."""


def hotline(case: Case, output: SystemOutput) -> bool:
    """A refusal must give the hotline number; an answered case passes."""
    SEEN[case.id] = threading.current_thread().name
    return not case.unanswerable or HOTLINE in output.answer


def graded(case: Case, output: SystemOutput) -> dict[str, Any]:
    """Share of the expected facts quoted, with the reason."""
    facts = case.expected_facts or ["-"]
    found = [fact for fact in facts if fact in output.answer]
    return {"score": len(found) / len(facts), "rationale": f"quotes {len(found)} of {len(facts)} facts"}


def raising(case: Case, output: SystemOutput) -> float:
    if "bad" in case.id:
        raise KeyError(f"no policy clause for {case.id}")
    return 1.0


def out_of_range(case: Case, output: SystemOutput) -> float:
    return 1.5 if "bad" in case.id else 0.25


def wrong_type(case: Case, output: SystemOutput) -> Any:
    return "high" if "bad" in case.id else 1


def not_a_number(case: Case, output: SystemOutput) -> float:
    return float("nan") if "bad" in case.id else 0.0


def no_score(case: Case, output: SystemOutput) -> Any:
    return {"rationale": "forgot the score"} if "bad" in case.id else {"score": True}


def sleepy(case: Case, output: SystemOutput) -> float:
    if "bad" in case.id:
        time.sleep(5)
    return 1.0


def chatty(case: Case, output: SystemOutput) -> float:
    print(f"checking {case.id}")
    return 1.0


def one_argument(case: Case) -> float:
    return 1.0


async def asynchronous(case: Case, output: SystemOutput) -> float:
    return 1.0


NOT_CALLABLE = 3


def fussy(case: Case, output: SystemOutput) -> float:
    """Raises on an answer that says "boom" (an error for that case), else 1 for a "good" answer."""
    if "boom" in output.answer:
        raise ValueError("boom")
    return 1.0 if "good" in output.answer else 0.0


def meddling(case: Case, output: SystemOutput) -> float:
    """Scores, and on the "bad" cases rewrites the question and empties the answer it was given."""
    if case.id.startswith("bad"):
        case.question = "rewritten"
        case.expected_facts.clear()
        output.answer = ""
        output.contexts.clear()
    return 1.0


def reads_answer(case: Case, output: SystemOutput) -> float:
    """1 when the answer holds an expected fact: what a later metric reads of the case."""
    return 1.0 if any(fact in output.answer for fact in case.expected_facts) else 0.0
