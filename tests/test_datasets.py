"""Dataset loading: every rejection names file, line, field and reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ragexp.datasets.loader import load_dataset, only_cases
from ragexp.errors import ConfigError, DatasetErrors
from ragexp.escape import terminal
from tests.conftest import ROOT, write_jsonl

GOOD = {"id": "a", "question": "退款多久到账？", "relevant_ids": ["refund-arrival"], "expected_facts": ["1-3 个工作日"]}


def first_error(path: Path) -> str:
    with pytest.raises(DatasetErrors) as info:
        load_dataset(path)
    return str(info.value.errors[0])


def test_valid_jsonl(tmp_path: Path) -> None:
    rows = [GOOD, {"id": "u", "question": "可以寄到美国吗？", "unanswerable": True}]
    data = load_dataset(write_jsonl(tmp_path / "d.jsonl", rows))
    assert [c.id for c in data.cases] == ["a", "u"]
    assert data.cases[1].unanswerable and data.cases[1].line == 2
    assert data.format == "jsonl"
    assert {"relevant_ids", "expected_facts"} <= data.label_fields
    assert data.output_fields == frozenset()


@pytest.mark.parametrize(
    ("rows", "expected"),
    [
        ([GOOD, {**GOOD, "id": "a"}], "d.jsonl:2: field 'id': duplicate id 'a' (first on line 1)"),
        ([{**GOOD, "relevant_ids": []}], "d.jsonl:1: field 'relevant_ids': an answerable case needs at least one"),
        ([{k: v for k, v in GOOD.items() if k != "relevant_ids"}], "field 'relevant_ids': an answerable case needs"),
        ([{**GOOD, "unanswerable": True}], "d.jsonl:1: field 'relevant_ids': an unanswerable case must not have"),
        ([{**GOOD, "question": 42}], "d.jsonl:1: field 'question': expected a string, got a number"),
        ([{**GOOD, "question": ""}], "d.jsonl:1: field 'question': must not be empty"),
        ([{**GOOD, "question": "x" * 1_000_001}], "field 'question': too long: 1,000,001 characters"),
        ([{**GOOD, "relevant_ids": "refund"}], "field 'relevant_ids': expected a list of strings, got a string"),
        ([{**GOOD, "relevant_ids": [1]}], "field 'relevant_ids': item 0 is a number, expected a string"),
        ([{**GOOD, "unanswerable": "no"}], "field 'unanswerable': expected true or false, got a string"),
        ([{**GOOD, "id": ""}], "d.jsonl:1: field 'id': required: a non-empty string"),
        ([{**GOOD, "relevant_id": ["x"]}], "field 'relevant_id': unknown field (did you mean 'relevant_ids'?)"),
        ([{**GOOD, "citations": [0]}], "field 'citations': expected a list of 1-based integers"),
        ([{**GOOD, "latency_seconds": -1}], "field 'latency_seconds': expected a non-negative number"),
        ([GOOD, [1, 2]], "d.jsonl:2: expected a JSON object, got a list"),
    ],
)
def test_rejections(tmp_path: Path, rows: list[object], expected: str) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    assert expected in first_error(path)


def test_invalid_json_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(GOOD) + "\n\n{not json}\n", encoding="utf-8")
    assert first_error(path).startswith(f"{path}:3: invalid JSON")


def test_empty_and_missing_files(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n  \n", encoding="utf-8")
    assert first_error(empty) == f"{empty}: empty file: no cases"
    assert first_error(tmp_path / "nope.jsonl") == f"{tmp_path / 'nope.jsonl'}: no such file"


def test_every_problem_is_listed(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "d.jsonl", [{**GOOD, "id": f"c{i}", "relevant_ids": []} for i in range(5)])
    with pytest.raises(DatasetErrors) as info:
        load_dataset(path)
    assert [e.line for e in info.value.errors] == [1, 2, 3, 4, 5]
    assert "(and 4 more" in str(info.value)


def test_column_format(tmp_path: Path) -> None:
    data = load_dataset(ROOT / "ragexp/data/scifacts_zh/mindsdk_columns.json")
    assert data.format == "columns" and len(data.cases) == 3
    assert data.cases[0].recorded is not None and len(data.cases[0].recorded.contexts) == 3
    assert "relevant_ids" not in data.label_fields and "reference" in data.label_fields
    assert data.output_fields == {"response", "retrieved_contexts"}


def test_column_format_rejects_unequal_lengths(tmp_path: Path) -> None:
    path = tmp_path / "cols.json"
    path.write_text(
        json.dumps(
            {
                "user_input": ["q1", "q2", "q3"],
                "response": ["a1", "a2"],
                "retrieved_contexts": [["c"], ["c"], ["c"]],
                "reference": ["r1", "r2", "r3"],
            },
            indent=1,
        ),
        encoding="utf-8",
    )
    message = first_error(path)
    assert message.startswith(f"{path}:")
    assert "field 'response': has 2 items but user_input has 3: lists must be equally long" in message


def test_dataset_hash_covers_labels_not_outputs_nor_order(tmp_path: Path) -> None:
    a = {**GOOD, "response": "one answer", "retrieved_ids": ["x"]}
    b = {"id": "b", "question": "q2", "unanswerable": True}
    first = load_dataset(write_jsonl(tmp_path / "1.jsonl", [a, b]))
    replay = load_dataset(write_jsonl(tmp_path / "2.jsonl", [b, {**a, "response": "another answer"}]))
    changed = load_dataset(write_jsonl(tmp_path / "3.jsonl", [{**a, "expected_facts": ["3-7 个工作日"]}, b]))
    assert first.dataset_hash == replay.dataset_hash
    assert first.file_sha256 != replay.file_sha256
    assert changed.dataset_hash != first.dataset_hash


def test_bundled_sets() -> None:
    kb = load_dataset(ROOT / "ragexp/data/kb_zh/cases.jsonl")
    assert len(kb.cases) >= 30
    assert sum(c.unanswerable for c in kb.cases) >= 3
    # The article's trap: "how long until the refund arrives" is not the seven-day application window.
    arrival = next(c for c in kb.cases if c.question == "退款多久到账？")
    assert arrival.relevant_ids == ["refund-arrival"] and "七天" not in "".join(arrival.expected_facts)
    docs = {
        json.loads(line)["id"]: json.loads(line)["text"]
        for line in (ROOT / "ragexp/data/kb_zh/docs.jsonl").read_text(encoding="utf-8").splitlines()
    }
    for c in kb.cases:
        for fact in c.expected_facts:  # every expected fact is written in one of its relevant documents
            assert any(fact in docs[d] for d in c.relevant_ids), (c.id, fact)
    sci = load_dataset(ROOT / "ragexp/data/scifacts_zh/cases.jsonl")
    assert len(sci.cases) >= 20
    assert {"response", "retrieved_ids", "retrieved_contexts", "citations", "latency_seconds"} <= sci.output_fields
    imperfect = [c for c in sci.cases if c.recorded and c.recorded.ranked_ids[:1] != c.relevant_ids[:1]]
    assert len(imperfect) >= 5


def test_the_documented_fields_are_the_fields_the_loader_checks() -> None:
    from ragexp.datasets.fields import RULES

    text = (ROOT / "docs/datasets.md").read_text(encoding="utf-8")
    table = next(part for part in text.split("\n\n") if part.startswith("| field |"))
    documented = set()
    for line in table.splitlines()[2:]:
        documented.update(name.strip(" `") for name in line.split("|")[1].split(","))
    assert documented == set(RULES)


@pytest.mark.parametrize("value", [0, "", False, {}, "1,2", [1, "2"]])
def test_citations_are_a_list_of_positions_or_absent(tmp_path: Path, value: object) -> None:
    # A falsy non-list was once read as "no citations" by one check and refused by the other.
    path = write_jsonl(tmp_path / "d.jsonl", [{**GOOD, "citations": value}])
    assert first_error(path) == f"{path}:1: field 'citations': expected a list of 1-based integers"
    for absent in (None, []):
        case = load_dataset(write_jsonl(tmp_path / "ok.jsonl", [{**GOOD, "citations": absent}])).cases[0]
        assert case.recorded is None if absent is None else case.recorded is not None


def test_ids_that_look_the_same_but_differ_in_code_points_are_told_apart(tmp_path: Path) -> None:
    nfc, nfd, spaced = "caf\u00e9", "cafe\u0301", "chat\u200b-1"
    rows = [{"id": i, "question": "q", "relevant_ids": ["d"]} for i in (nfc, nfd, "chat-1", spaced)]
    with pytest.raises(DatasetErrors) as refused:
        load_dataset(write_jsonl(tmp_path / "set.jsonl", rows))
    assert [str(error) for error in refused.value.errors] == [
        f"{tmp_path / 'set.jsonl'}:2: field 'id': id {nfd!r} looks the same as the id on line 1 ({nfc!r}) but is "
        "written with other code points (U+0063 U+0061 U+0066 U+0065 U+0301, not U+0063 U+0061 U+0066 U+00E9)",
        f"{tmp_path / 'set.jsonl'}:4: field 'id': id 'chat\\u200b-1' looks the same as the id on line 3 ('chat-1') "
        "but is written with other code points (U+0063 U+0068 U+0061 U+0074 U+200B U+002D U+0031, not U+0063 "
        "U+0068 U+0061 U+0074 U+002D U+0031)",
    ]
    # A subset naming a case in another form than the file's says which id it looks like.
    rows = [{"id": i, "question": "q", "relevant_ids": ["refund-policy"]} for i in (nfd, "chat-1")]
    path = write_jsonl(tmp_path / "ok.jsonl", rows)
    with pytest.raises(ConfigError) as chosen:
        only_cases(load_dataset(path), [nfc])
    assert str(chosen.value) == (
        f"config: dataset.case_ids: no case {nfc!r} in {path}; it has {nfd!r}, which looks the same, "
        "written with other code points (U+0063 U+0061 U+0066 U+0065 U+0301, not U+0063 U+0061 U+0066 U+00E9)"
    )
    with pytest.raises(ConfigError) as hidden:
        only_cases(load_dataset(path), ["chat\u200b-1"])
    assert "no case 'chat\\u200b-1'" in str(hidden.value) and "looks the same" in str(hidden.value)
    assert terminal("chat\u200b-1 \u00ad\u2060") == "chat\\u200b-1 \\xad\\u2060"
