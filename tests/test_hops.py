"""Multi-hop cases: gold per hop, retrievals per hop, per-hop metrics, the first failing hop."""

from __future__ import annotations

from pathlib import Path

import pytest

from ragexp.datasets.loader import load_dataset
from ragexp.errors import DatasetErrors
from tests.conftest import write_jsonl


def _hop_case(case_id: str = "q1", **extra: object) -> dict[str, object]:
    row: dict[str, object] = {
        "id": case_id,
        "question": "星河电热水壶的生产商总部在哪？",
        "hops": [{"relevant": ["p1"], "bridge": "澜川电器"}, {"relevant": ["b1"]}],
        "expected_facts": ["杭州"],
    }
    row.update(extra)
    return row


def test_loader_reads_hops_and_makes_the_case_gold_their_union(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "hops.jsonl",
        [
            _hop_case(),
            {
                "id": "q2",
                "question": "问题二",
                "hops": [
                    {"relevant": [{"doc": "d1", "span": "甲"}]},
                    {"relevant": [{"doc": "d2", "span": "乙"}, {"doc": "d1", "span": "甲"}]},
                ],
                "expected_facts": ["乙"],
            },
        ],
    )
    dataset = load_dataset(path)
    one, two = dataset.cases
    assert one.relevant_ids == ["p1", "b1"]
    assert [hop.relevant_ids for hop in one.hops] == [["p1"], ["b1"]]
    assert one.hops[0].bridge == "澜川电器" and one.hops[1].bridge is None
    assert [(e.doc, e.span) for e in two.relevant] == [("d1", "甲"), ("d2", "乙")]
    assert [[e.doc for e in hop.relevant] for hop in two.hops] == [["d1"], ["d2", "d1"]]
    assert dataset.hop_count == 2
    # the hops enter the dataset hash: other hop gold, another hash
    other = write_jsonl(tmp_path / "other.jsonl", [_hop_case(hops=[{"relevant": ["b1"]}, {"relevant": ["p1"]}])])
    first = write_jsonl(tmp_path / "first.jsonl", [_hop_case()])
    assert load_dataset(other).dataset_hash != load_dataset(first).dataset_hash


@pytest.mark.parametrize(
    ("hops", "extra", "field", "words"),
    [
        ([], {}, "hops", "non-empty list"),
        ([{"relevant": []}], {}, "hops[0].relevant", "required"),
        ([{"relevant": ["a"]}, {"relevant": [{"doc": "d"}]}], {}, "hops[1].relevant", "one form"),
        ([{"relevant": [{"doc": "d"}]}], {}, "hops[0].relevant[0].start", "give span"),
        ([{"relevant": ["a"], "brige": "x"}], {}, "hops[0].brige", "unknown key"),
        ([{"relevant": ["a"], "bridge": ""}], {}, "hops[0].bridge", "non-empty string"),
        ([{"relevant": ["a"]}, {"relevant": ["b"]}], {"relevant_ids": ["a", "c"]}, "relevant_ids", "union"),
        ([{"relevant": ["a"]}], {"unanswerable": True}, "relevant_ids", "unanswerable"),
    ],
)
def test_loader_refuses_bad_hops_naming_line_and_field(
    tmp_path: Path, hops: object, extra: dict[str, object], field: str, words: str
) -> None:
    path = write_jsonl(tmp_path / "bad.jsonl", [_hop_case("ok"), _hop_case("bad", hops=hops, **extra)])
    with pytest.raises(DatasetErrors) as caught:
        load_dataset(path)
    (problem,) = caught.value.errors
    assert (problem.line, problem.field) == (2, field), str(problem)
    assert words in str(problem)


def test_case_gold_that_equals_the_union_is_accepted(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "ok.jsonl", [_hop_case(relevant_ids=["b1", "p1"])])
    assert load_dataset(path).cases[0].relevant_ids == ["b1", "p1"]
