"""Conversations: multi-turn cases, asked turn by turn with their history, scored per turn and per
conversation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ragexp.datasets.loader import load_dataset
from ragexp.errors import DatasetErrors
from tests.conftest import write_jsonl

CONV = {
    "id": "conv-7",
    "turns": [
        {"question": "退货怎么办？", "relevant_ids": ["return-policy"], "reference": "七天内可退货。"},
        {"question": "那运费呢？", "relevant_ids": ["return-shipping"], "expected_facts": ["运费"]},
    ],
}
SINGLE = {"id": "a", "question": "退款多久到账？", "relevant_ids": ["refund-arrival"]}


def first_error(path: Path) -> str:
    with pytest.raises(DatasetErrors) as info:
        load_dataset(path)
    return str(info.value.errors[0])


def test_conversation_turns_are_cases_beside_single_questions(tmp_path: Path) -> None:
    data = load_dataset(write_jsonl(tmp_path / "d.jsonl", [SINGLE, CONV]))
    assert [c.id for c in data.cases] == ["a", "conv-7#1", "conv-7#2"]
    first, second = data.cases[1], data.cases[2]
    assert (first.conversation, first.turn, first.line) == ("conv-7", 1, 2)
    assert (second.conversation, second.turn, second.question) == ("conv-7", 2, "那运费呢？")
    assert second.relevant_ids == ["return-shipping"] and second.expected_facts == ["运费"]
    assert data.cases[0].conversation is None and data.cases[0].turn == 0
    assert data.has_conversations


def test_dataset_hash_covers_the_turns(tmp_path: Path) -> None:
    base = load_dataset(write_jsonl(tmp_path / "a.jsonl", [CONV])).dataset_hash
    changed = {**CONV, "turns": [CONV["turns"][0], {**CONV["turns"][1], "question": "那保价呢？"}]}
    assert load_dataset(write_jsonl(tmp_path / "b.jsonl", [changed])).dataset_hash != base
    shorter = {**CONV, "turns": CONV["turns"][:1]}
    assert load_dataset(write_jsonl(tmp_path / "c.jsonl", [shorter])).dataset_hash != base
    # The same question asked alone is not the same case as that turn of a conversation.
    alone = {"id": "conv-7#1", "question": "退货怎么办？", "relevant_ids": ["return-policy"], "reference": "七天内可退货。"}
    assert load_dataset(write_jsonl(tmp_path / "d.jsonl", [alone])).dataset_hash != load_dataset(
        write_jsonl(tmp_path / "e.jsonl", [shorter])
    ).dataset_hash


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        ({"id": "c", "turns": []}, "d.jsonl:2: field 'turns': required: a non-empty list of turns"),
        ({"id": "c", "turns": "hi"}, "d.jsonl:2: field 'turns': required: a non-empty list of turns ({question, ...}), got a string"),
        ({"id": "c", "turns": [{"relevant_ids": ["x"]}]}, "d.jsonl:2: field 'turns[0].question': required: every turn asks a question"),
        (
            {"id": "c", "turns": [{"question": "q", "relevant_ids": ["x"]}, {"question": "q2", "relevant_id": ["x"]}]},
            "d.jsonl:2: field 'turns[1].relevant_id': not a field of a turn (did you mean 'relevant_ids'?)",
        ),
        (
            {"id": "c", "turns": [{"question": "q", "relevant_ids": ["x"], "response": "r"}]},
            "d.jsonl:2: field 'turns[0].response': not a field of a turn",
        ),
        ({"id": "c", "turns": [{"question": "q"}]}, "d.jsonl:2: field 'turns[0].relevant_ids': an answerable case needs"),
        ({"id": "c", "turns": [{"question": 3, "unanswerable": True}]}, "field 'turns[0].question': expected a string"),
        ({"id": "c", "turns": ["q"]}, "d.jsonl:2: field 'turns[0]': expected an object {question, ...}, got a string"),
        ({"turns": [{"question": "q", "unanswerable": True}]}, "d.jsonl:2: field 'id': required: a non-empty string"),
        (
            {"id": "c", "question": "q", "turns": [{"question": "q", "unanswerable": True}]},
            "d.jsonl:2: field 'question': not a field of a conversation (a turn's field goes inside its item of turns)",
        ),
        ({**CONV, "id": "a"}, "d.jsonl:2: field 'id': duplicate id 'a' (first on line 1)"),
    ],
)
def test_refusals_name_file_line_and_field(tmp_path: Path, row: dict[str, object], expected: str) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in [SINGLE, row]), encoding="utf-8")
    assert expected in first_error(path)


def test_a_single_case_cannot_take_a_turn_id(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [CONV, {**SINGLE, "id": "conv-7#2"}])
    assert "d.jsonl:2: field 'id': duplicate id 'conv-7#2' (first on line 1)" in first_error(path)
