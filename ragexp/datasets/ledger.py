"""Dataset versions case by case: a content hash per case, and the ledger of two versions.

A case's content is three parts, hashed apart so that a ledger can say which one changed:
``question``; ``history``, the earlier turns of its conversation (their questions and reference
answers, in turn order; nothing for a single question); and ``gold``, every label the dataset hash
covers other than the id, the question and the case's place in its conversation (relevant ids and
spans, expected facts, reference, unanswerable, and any label added later). Human scores are not
gold: they grade a run's outputs, and runs whose only difference is them stay comparable.

``ragexp run`` writes each case's hashes in its ``cases.jsonl`` row (``content_hash``), so two runs
of two versions of a dataset can be compared on the cases both versions hold unchanged
(``--common-cases``), and ``ragexp datasets diff`` can list what changed between two files or runs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from ragexp.records import Case

PARTS = ("question", "history", "gold")
"""What a case's content hash covers, each part hashed apart, in the order a ledger names them."""
KEY = "content_hash"
"""The ``cases.jsonl`` key of a case's hashes: ``{"case", "question", "history", "gold"}``."""
_NOT_GOLD = frozenset({"id", "question", "conversation", "turn"})
_DIGEST = 8
"""Bytes of each hash (16 hex digits): a ledger compares the cases of one id, never looks one up."""


def _digest(value: Any) -> str:
    return hashlib.blake2b(orjson.dumps(value, option=orjson.OPT_SORT_KEYS), digest_size=_DIGEST).hexdigest()


def case_hashes(cases: Sequence[Case]) -> dict[str, dict[str, str]]:
    """Each case's hashes by id: ``question``, ``history``, ``gold`` and ``case`` (the three
    together). A turn's history is the turns before it in the same sequence of cases."""
    return {case.id: hashes for case, hashes in zip(cases, iter_case_hashes(cases), strict=True)}


def iter_case_hashes(cases: Sequence[Case]) -> Iterator[dict[str, str]]:
    """:func:`case_hashes`' values, one case at a time in the order of ``cases``: a writer of
    every case keeps one case's hashes at a time, not every case's."""
    earlier: dict[str, list[tuple[int, str, str | None]]] = {}
    for case in cases:
        if case.conversation is not None:
            earlier.setdefault(case.conversation, []).append((case.turn, case.question, case.reference))
    alone = _digest(None)  # the history of every single question
    blake2b, dumps, sort_keys = hashlib.blake2b, orjson.dumps, orjson.OPT_SORT_KEYS
    for case in cases:
        history = alone
        if case.conversation is not None:
            history = _digest(
                [
                    [question, reference]
                    for turn, question, reference in sorted(earlier[case.conversation])
                    if turn < case.turn
                ]
            )
        gold = case.labels(human=False)
        for key in _NOT_GOLD:
            gold.pop(key, None)
        question = blake2b(dumps(case.question), digest_size=_DIGEST).hexdigest()
        gold_hash = blake2b(dumps(gold, option=sort_keys), digest_size=_DIGEST).hexdigest()
        # The JSON of the three hex digests (``_digest`` of the list), which need no escaping.
        together = f'["{question}","{history}","{gold_hash}"]'.encode()
        yield {
            "case": blake2b(together, digest_size=_DIGEST).hexdigest(),
            "question": question,
            "history": history,
            "gold": gold_hash,
        }


@dataclass
class Ledger:
    """How a new version of a dataset differs from an old one, case by case."""

    added: list[str] = field(default_factory=list)
    """Ids only the new version holds, in its order."""
    removed: list[str] = field(default_factory=list)
    """Ids only the old version holds, in its order."""
    changed: dict[str, list[str]] = field(default_factory=dict)
    """Id -> the parts (:data:`PARTS`) whose hash differs, for ids both hold, in the new order."""
    unchanged: list[str] = field(default_factory=list)
    """Ids both versions hold with the same content, in the new version's order."""

    @property
    def same(self) -> bool:
        return not (self.added or self.removed or self.changed)

    def counts(self) -> dict[str, int]:
        return {
            "added": len(self.added),
            "removed": len(self.removed),
            "changed": len(self.changed),
            "unchanged": len(self.unchanged),
        }

    def changed_by_part(self) -> dict[str, int]:
        """Part -> how many changed cases changed it (a case may change several)."""
        return {part: n for part in PARTS if (n := sum(part in parts for parts in self.changed.values()))}

    def words(self) -> str:
        """``2 added, 1 removed, 1 changed (gold 1), 32 unchanged``."""
        by_part = ", ".join(f"{part} {n}" for part, n in self.changed_by_part().items())
        changed = f"{len(self.changed)} changed" + (f" ({by_part})" if by_part else "")
        return f"{len(self.added)} added, {len(self.removed)} removed, {changed}, {len(self.unchanged)} unchanged"

    def to_json(self) -> dict[str, Any]:
        return {
            **self.counts(),
            "added_ids": self.added,
            "removed_ids": self.removed,
            "changed_ids": {case_id: parts for case_id, parts in self.changed.items()},
        }

    def summary_json(self) -> dict[str, Any]:
        """The counts and the changed parts, without the ids (what a comparison's outputs carry)."""
        return {**self.counts(), "changed_by_part": self.changed_by_part()}


def compare(old: Mapping[str, Mapping[str, str]], new: Mapping[str, Mapping[str, str]]) -> Ledger:
    """The ledger from the old version's case hashes to the new one's (both by id, in file order)."""
    ledger = Ledger(removed=[case_id for case_id in old if case_id not in new])
    for case_id, hashes in new.items():
        before = old.get(case_id)
        if before is None:
            ledger.added.append(case_id)
            continue
        parts = [part for part in PARTS if before.get(part) != hashes.get(part)]
        if parts:
            ledger.changed[case_id] = parts
        else:
            ledger.unchanged.append(case_id)
    return ledger


def hashes_of_rows(rows: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, str]] | None:
    """The case hashes a run's ``cases.jsonl`` rows carry; None when a row has none (a run made
    before they were recorded)."""
    found = {}
    for row in rows:
        hashes = row.get(KEY)
        if not isinstance(hashes, dict):
            return None
        found[str(row["id"])] = hashes
    return found
