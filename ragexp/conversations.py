"""Conversations: the turns of each conversation asked in order, with the history before them;
conversations asked side by side.

A turn is asked as soon as the turn before it has its answer: a provider's workers take the next
ready case, whichever conversation it belongs to, so its concurrency spreads over conversations
with no wait between rounds of turns. A turn that
fails is an error for it and for every later turn of its conversation, which is then not asked:
a later turn without the history it follows would measure another conversation.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

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


class Turns:
    """A run's cases as chains for :meth:`Provider.ask_chains`: a single question is a chain of
    one, a conversation the chain of its turns. A provider asks a chain's next case as soon as
    the one before it has its result, so its workers stay busy across conversations; each case
    is filled in with the history of its conversation (:meth:`prepare`) just before it is asked.
    """

    def __init__(self, cases: Sequence[Case], mode: str) -> None:
        self.cases: list[Case] = list(cases)
        """The cases by position; :meth:`prepare` fills in a turn's history in place."""
        self.mode = mode
        chats = conversations(cases)
        self.chains: list[tuple[int, ...]] = [
            (position,) for position, case in enumerate(cases) if case.conversation is None
        ]
        self.chains += [chat.positions for chat in chats]
        self._chat_of = {position: chat for chat in chats for position in chat.positions}
        self._step = {chat.id: 0 for chat in chats}
        self._history: dict[str, list[Message]] = {chat.id: [] for chat in chats}
        self._service_id: dict[str, str | None] = {chat.id: None for chat in chats}

    def first(self) -> list[int]:
        """The first case of every chain, in the order to ask them."""
        return [chain[0] for chain in self.chains]

    def prepare(self, index: int) -> None:
        """Fill in the case at ``index`` with what the earlier turns of its conversation left:
        the history and the id the service issued."""
        case = self.cases[index]
        if case.conversation is not None:
            self.cases[index] = dataclasses.replace(
                case,
                history=list(self._history[case.conversation]),
                conversation_ref=self._service_id[case.conversation],
            )

    def settled(self, index: int, result: CaseResult) -> tuple[list[tuple[int, CaseResult]], int | None]:
        """After the case at ``index`` got ``result``: the later turns of its conversation that
        are now errors, not asked (when it failed), and the position of the turn to ask next
        (None: none)."""
        chat = self._chat_of.get(index)
        if chat is None:
            return [], None
        case = self.cases[index]
        self._step[chat.id] += 1
        step = self._step[chat.id]
        if not result.ok:
            return _not_asked(self.cases, chat, step, result), None
        answer = result.output.answer if result.output is not None else ""
        self._history[chat.id] += [
            {"role": "user", "content": case.question},
            {"role": "assistant", "content": (case.reference or "") if self.mode == "reference" else answer},
        ]
        if result.output is not None and result.output.conversation_id:
            self._service_id[chat.id] = result.output.conversation_id
        return [], chat.positions[step] if step < len(chat.positions) else None


class AsksChains(Protocol):
    def ask_chains(self, chains: Turns, on_result: Callable[[int, CaseResult], None]) -> None: ...


def ask_in_turns(
    cases: Sequence[Case], provider: AsksChains, on_result: Callable[[int, CaseResult], None], mode: str
) -> None:
    """Ask ``cases`` (single questions and whole conversations), reporting each result with the
    case's position in ``cases``: each conversation's turns in order, each after the history of
    the turns before it."""
    provider.ask_chains(Turns(cases, mode), on_result)


def histories(cases: Sequence[Case], results: Sequence[CaseResult], mode: str) -> list[list[Message] | None]:
    """What each case was asked after, rebuilt from the results (as :class:`Turns` built
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


def _not_asked(
    cases: Sequence[Case], chat: Conversation, failed_turn: int, cause: CaseResult
) -> list[tuple[int, CaseResult]]:
    """The turns after a failed one: errors (retried by ``--resume`` when the failure is)."""
    failed = cases[chat.positions[failed_turn - 1]].id
    reason = f"not asked: turn {failed} of its conversation failed"
    return [
        (position, CaseResult(cases[position].id, None, reason, retryable=cause.retryable))
        for position in chat.positions[failed_turn:]
    ]
