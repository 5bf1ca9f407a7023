"""Conversations: the turns of each conversation asked in order, with the history before them;
conversations asked side by side.

A turn is asked once every earlier turn of its conversation has its answer; the provider is given
batches of the turns that are ready, so its concurrency spreads over conversations. A turn that
fails is an error for it and for every later turn of its conversation, which is then not asked:
a later turn without the history it follows would measure another conversation.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ragexp.errors import ConfigError
from ragexp.records import Case, CaseResult

Message = dict[str, str]
"""One message of a history: ``{"role": "user" | "assistant", "content": text}``."""


@dataclass(frozen=True, slots=True)
class Conversation:
    """A conversation's turns, by their positions in the dataset's cases, in order."""

    id: str
    positions: tuple[int, ...]


def conversations(cases: Sequence[Case]) -> list[Conversation]:
    """The conversations among ``cases``, in the order of their first turn."""
    turns: dict[str, list[int]] = {}
    for position, case in enumerate(cases):
        if case.conversation is not None:
            turns.setdefault(case.conversation, []).append(position)
    return [
        Conversation(conversation, tuple(sorted(positions, key=lambda p: cases[p].turn)))
        for conversation, positions in turns.items()
    ]


def check_history(cases: Sequence[Case], mode: str, source: str) -> None:
    """``conversation.history=reference`` needs a reference answer on every turn another follows."""
    if mode != "reference":
        return
    for conversation in conversations(cases):
        for position in conversation.positions[:-1]:
            case = cases[position]
            if not case.reference:
                raise ConfigError(
                    f"conversation.history=reference: turn {case.id} ({source}:{case.line}, field "
                    f"'turns[{case.turn - 1}].reference') has no reference answer for the turns after it; "
                    "give one, or use conversation.history=own"
                )


def complete(cases: Sequence[Case], kept: dict[str, CaseResult]) -> dict[str, CaseResult]:
    """``kept`` without the turns of any conversation not every turn of which is kept: a resumed
    run asks an incomplete conversation again from its first turn."""
    dropped: set[str] = set()
    for conversation in conversations(cases):
        ids = [cases[position].id for position in conversation.positions]
        if not all(case_id in kept for case_id in ids):
            dropped.update(ids)
    return {case_id: result for case_id, result in kept.items() if case_id not in dropped}


RunBatch = Callable[[Sequence[Case], Callable[[int, CaseResult], None]], None]
"""A provider's ``run``: asks every case of a batch, reporting each result with its position."""


def ask_in_turns(
    cases: Sequence[Case],
    run: RunBatch,
    on_result: Callable[[int, CaseResult], None],
    mode: str,
    width: int,
) -> None:
    """Ask ``cases`` (single questions and whole conversations), reporting each result with the
    case's position in ``cases``. The single questions go in the first batch with the first
    turns; a turn becomes ready when the one before it was answered, and each batch takes the
    turns longest ready in whole rounds of ``width`` (the provider's concurrency), so the
    provider's slots stay full while turns are ready."""
    chats = conversations(cases)
    chat_of = {position: chat for chat in chats for position in chat.positions}
    step = {chat.id: 0 for chat in chats}
    history: dict[str, list[Message]] = {chat.id: [] for chat in chats}
    service_id: dict[str, str | None] = {chat.id: None for chat in chats}
    ready: deque[int] = deque(chat.positions[0] for chat in chats)
    batch = [position for position, case in enumerate(cases) if case.conversation is None]
    batch += _take(ready, width)
    while batch:
        asked = [_with_history(cases[position], history, service_id) for position in batch]
        results: dict[int, CaseResult] = {}

        def arrived(
            index: int, result: CaseResult, batch: list[int] = batch, results: dict[int, CaseResult] = results
        ) -> None:
            results[batch[index]] = result
            on_result(batch[index], result)

        run(asked, arrived)
        for position in batch:
            chat = chat_of.get(position)
            result = results.get(position)
            if chat is None or result is None:  # a single question; or a provider bug, caught by the caller
                continue
            case = cases[position]
            step[chat.id] += 1
            if not result.ok:
                _not_asked(cases, chat, step[chat.id], result, on_result)
                continue
            answer = result.output.answer if result.output is not None else ""
            history[chat.id] += [
                {"role": "user", "content": case.question},
                {"role": "assistant", "content": (case.reference or "") if mode == "reference" else answer},
            ]
            if result.output is not None and result.output.conversation_id:
                service_id[chat.id] = result.output.conversation_id
            if step[chat.id] < len(chat.positions):
                ready.append(chat.positions[step[chat.id]])
        batch = _take(ready, width)


def _take(ready: deque[int], width: int) -> list[int]:
    """The next batch: the longest-ready turns, as many as fill the provider's ``width`` slots a
    whole number of times (at least one turn): a batch whose last round is partly empty leaves
    slots idle that the next batch's turns could have used."""
    count = max(len(ready) // width * width, min(width, len(ready)))
    return [ready.popleft() for _ in range(count)]


def histories(cases: Sequence[Case], results: Sequence[CaseResult], mode: str) -> list[list[Message] | None]:
    """What each case was asked after, rebuilt from the results (as :func:`ask_in_turns` built
    it): the earlier turns' questions and answers; None for a single question."""
    out: list[list[Message] | None] = [None] * len(cases)
    for chat in conversations(cases):
        history: list[Message] = []
        for position in chat.positions:
            case, result = cases[position], results[position]
            out[position] = list(history)
            answer = result.output.answer if result.output is not None else ""
            history = [
                *history,
                {"role": "user", "content": case.question},
                {"role": "assistant", "content": (case.reference or "") if mode == "reference" else answer},
            ]
    return out


def transcript(question: str, history: Sequence[Message] | None) -> str:
    """The question as a judge reads it: after the conversation so far, when there is one."""
    if not history:
        return question
    said = "\n".join(f"{message['role']}: {message['content']}" for message in history)
    return f"[conversation so far]\n{said}\n[question]\n{question}"


def _with_history(case: Case, history: dict[str, list[Message]], service_id: dict[str, str | None]) -> Case:
    if case.conversation is None:
        return case
    return dataclasses.replace(
        case, history=list(history[case.conversation]), conversation_ref=service_id[case.conversation]
    )


def _not_asked(
    cases: Sequence[Case],
    chat: Conversation,
    failed_turn: int,
    cause: CaseResult,
    on_result: Callable[[int, CaseResult], None],
) -> None:
    """The turns after a failed one: errors (retried by ``--resume`` when the failure is)."""
    failed = cases[chat.positions[failed_turn - 1]].id
    for position in chat.positions[failed_turn:]:
        on_result(
            position,
            CaseResult(
                cases[position].id,
                None,
                f"not asked: turn {failed} of its conversation failed",
                retryable=cause.retryable,
            ),
        )
