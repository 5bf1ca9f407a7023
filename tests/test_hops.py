"""Multi-hop cases: gold per hop, retrievals per hop, per-hop metrics, the first failing hop."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

import pytest

from ragexp import artifacts
from ragexp.datasets.loader import load_dataset
from ragexp.errors import DatasetErrors
from ragexp.records import Evidence
from ragexp.tracking.store import Store
from tests.conftest import write_jsonl
from tests.pipelines import hops as pipelines


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


# --- a Python target's retrieval calls, scored per hop --------------------------------------------

HOPS_RUN = ("dataset=kb_zh_hops", "system=python", "metrics=retrieval", "k=3", "report.language=en", "--json")


def _hop_run(ragexp: Any, target: str, *extra: str) -> dict[str, Any]:
    result = ragexp("run", *HOPS_RUN, f"provider.system.target=tests.pipelines.hops:{target}", *extra)
    assert result.code == 0, result.stderr
    return cast(dict[str, Any], result.json())


def _case_rows(store_uri: str, run_id: str) -> dict[str, dict[str, Any]]:
    lines = artifacts.CaseLines(Store(store_uri).read_artifact(run_id, artifacts.CASES))
    return {row["id"]: row for row in (artifacts.case_row(line) for line in lines)}


def _direct(question: str, hop: int, gold: list[Evidence], k: int) -> tuple[float, float, float]:
    """recall@K, reciprocal rank and evidence recall of one hop, computed here from the calls the
    pipeline returned (a chunk matches a span when it is of the span's document and holds it)."""
    call = pipelines.CALLS[question][hop - 1]
    pairs = list(zip(call["doc_ids"], call["contexts"], strict=True))

    def found(items: list[tuple[str, str]]) -> int:
        return sum(any(doc == e.doc and e.span in text for doc, text in items) for e in gold)

    ranks = [r + 1 for r, (doc, text) in enumerate(pairs) if any(doc == e.doc and e.span in text for e in gold)]
    return found(pairs[:k]) / len(gold), (1 / ranks[0] if ranks else 0.0), found(pairs) / len(gold)


@pytest.mark.parametrize(("target", "planted"), [("hop2_fault", 2), ("hop1_fault", 1), ("two_step", 0)])
def test_first_failing_hop_names_the_planted_fault_and_hop_scores_equal_a_direct_computation(
    ragexp: Any, store_uri: str, target: str, planted: int
) -> None:
    run = _hop_run(ragexp, target)
    rows = _case_rows(store_uri, run["run_id"])
    dataset = load_dataset(Path("ragexp/data/kb_zh_hops/cases.jsonl"))
    assert len(rows) == len(dataset.cases) >= 60
    named = [row["metrics"]["first_failing_hop"] for row in rows.values()]
    assert sum(value == planted for value in named) >= 0.9 * len(named), named
    for case in dataset.cases:
        row = rows[case.id]
        for hop in (1, 2):
            recall, rank, evidence = _direct(case.question, hop, case.hops[hop - 1].relevant, 3)
            assert row["metrics"][f"recall_at_k.hop{hop}"] == pytest.approx(recall)
            assert row["metrics"][f"mrr.hop{hop}"] == pytest.approx(rank)
            assert row["metrics"][f"evidence_recall.hop{hop}"] == pytest.approx(evidence)
        assert row["metrics"]["retrieval_calls"] == 2
        assert row["metrics"]["hop_seconds.hop1"] == pytest.approx(0.01 * len(case.question))
    # the run's means are the means of those per-case scores, and each carries its population
    for hop in (1, 2):
        name = f"recall_at_k.hop{hop}"
        values = [row["metrics"][name] for row in rows.values()]
        assert run["summary"][name] == pytest.approx(sum(values) / len(values))
    some = next(row for row in rows.values() if row["metrics"]["first_failing_hop"] == planted)
    why = some["rationale"]["first_failing_hop"]
    if planted:
        assert why.startswith(f"hop {planted} is the first whose gold is not all in its top 3"), why
    else:
        assert why == "every hop's gold is in its top 3 (2 hops)"


def test_diff_pairs_each_hop_and_tabulates_how_the_first_failing_hop_moved_and_the_gate_rules_a_hop(
    ragexp: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = _hop_run(ragexp, "two_step")["run_id"]
    hop2_run = _hop_run(ragexp, "hop2_fault")
    hop2 = hop2_run["run_id"]
    hop1 = _hop_run(ragexp, "hop1_fault")["run_id"]
    cases = 64
    for cand, planted in ((hop2, 2), (hop1, 1)):
        diff = ragexp("diff", base, cand, "--json")
        assert diff.code == 0, diff.stderr
        found = diff.json()
        table = found["hops"]
        assert table["paired"] == cases and table["labels"] == ["none", "hop 1", "hop 2"]
        assert table["rows"]["none"][f"hop {planted}"] >= 0.9 * cases
        assert sum(sum(row.values()) for row in table["rows"].values()) == cases
        metrics = {m["name"]: m for m in found["metrics"]}
        moved = metrics[f"recall_at_k.hop{planted}"]
        assert moved["n"] == cases and moved["population"]["scored"] == cases
        assert moved["delta"] < -0.8 and moved["regressed"] >= 0.9 * cases
        if planted == 2:  # the first hop is untouched: no case moved on it
            assert metrics["recall_at_k.hop1"]["delta"] == 0 and metrics["recall_at_k.hop1"]["regressed"] == 0
    shown = ragexp("diff", base, hop2)
    assert "first failing hop, cases by baseline (rows) and candidate (columns), 64 paired:" in shown.stdout
    made = ragexp("report", hop2, "--baseline", base, "--out", str(tmp_path / "report"), "--language", "en")
    assert made.code == 0, made.stderr
    text = (tmp_path / "report" / "report.md").read_text(encoding="utf-8")
    section = text[text.index("### Per hop") :]
    summary = hop2_run["summary"]
    row = " | ".join(f"{summary[f'{base}.hop2']:.4f} (64 of 64)" for base in ("recall_at_k", "mrr", "evidence_recall"))
    assert f"| 2 | {row} |" in section, section
    assert "How the first failing hop moved, cases by baseline (rows) and candidate (columns), 64 paired:" in section
    moved = ragexp("diff", base, hop2, "--json").json()["hops"]["rows"]["none"]
    assert f"| none | {moved['none']} | {moved['hop 1']} | {moved['hop 2']} |" in section, section
    conf = tmp_path / "conf"
    (conf / "gates").mkdir(parents=True)
    (conf / "gates" / "hops.yaml").write_text(
        "name: hops\nrules:\n  recall_at_k@hop1: {max_drop: 0.0}\n  recall_at_k@hop2: {max_drop: 0.05}\n",
        encoding="utf-8",
    )
    monkeypatch.setattr("os.environ", dict(__import__("os").environ))  # --config-dir sets a variable
    gate = ragexp("gate", "--config-dir", str(conf), "--baseline", base, "--candidate", hop2, "gates=hops", "--json")
    assert gate.code == 2, gate.stderr
    rules = {(rule["metric"], rule["outcome"]) for rule in gate.json()["rules"]}
    assert ("recall_at_k@hop2", "failed") in rules and ("recall_at_k@hop1", "passed") in rules


def test_a_langchain_agent_is_scored_per_hop_from_its_retriever_tool_calls(ragexp: Any, store_uri: str) -> None:
    from tests.pipelines import agent

    result = ragexp(
        "run",
        "dataset=kb_zh_hops",
        "system=langchain_agent",
        "provider.system.target=tests.pipelines.agent:agent",
        f"provider.system.response.retriever_tool={agent.TOOL}",
        "metrics=retrieval",
        "k=3",
        "--json",
    )
    assert result.code == 0, result.stderr
    run = result.json()
    assert run["error_count"] == 0
    rows = _case_rows(store_uri, run["run_id"])
    dataset = load_dataset(Path("ragexp/data/kb_zh_hops/cases.jsonl"))
    bridged = 0
    for case in dataset.cases:
        row = rows[case.id]
        calls = row["output"]["retrievals"]
        assert len(calls) == 2 and calls[0]["query"] == case.question
        assert row["output"]["tool_calls"] == [{"name": agent.TOOL, "args": {"query": call["query"]}} for call in calls]
        bridged += calls[1]["query"] == case.hops[0].bridge
        for hop, call in enumerate(calls, start=1):
            docs = agent.RETURNED[call["query"]]  # what the tool returned for this call
            assert call["ranked_ids"] == [doc.id for doc in docs]
            gold = case.hops[hop - 1].relevant
            hit = [any(doc.id == e.doc and e.span in doc.page_content for e in gold) for doc in docs]
            assert row["metrics"][f"recall_at_k.hop{hop}"] == pytest.approx(sum(hit[:3]) / len(gold))
            assert row["metrics"][f"mrr.hop{hop}"] == pytest.approx(1 / (hit.index(True) + 1) if any(hit) else 0.0)
        assert row["metrics"]["retrieval_calls"] == 2 and row["metrics"]["redundant_calls"] == 0
    assert bridged == len(dataset.cases)
    assert run["summary"]["recall_at_k.hop2"] == pytest.approx(1.0)


def test_the_sample_systems_two_step_mode_is_scored_per_hop_with_a_span_per_hop(
    ragexp: Any, store_uri: str, tmp_path: Path
) -> None:
    from tests.test_stage_spans import spans_by_case

    result = ragexp(
        "run",
        "dataset=kb_zh_hops",
        "provider.system.sample.docs=kb_zh_hops/docs.jsonl",
        "provider.system.sample.hops=2",
        "metrics=offline",
        "k=3",
        "report.language=en",
        "--json",
    )
    assert result.code == 0, result.stderr
    run = result.json()
    rows = _case_rows(store_uri, run["run_id"])
    row = rows["hop-kettle"]
    first, second = row["output"]["retrievals"]
    # the second search is the question with the bridge: the first evidence's sentence naming the maker
    assert first["query"] == row["question"]
    assert second["query"] == f"{row['question']} 该产品由澜川电器生产，全国联保一年。"
    assert first["ranked_ids"][0] == "product-kettle" and "product-kettle" not in second["ranked_ids"]
    assert second["ranked_ids"][0] == "maker-lanchuan"
    assert row["metrics"]["recall_at_k.hop1"] == row["metrics"]["recall_at_k.hop2"] == 1.0
    # hop 2 is where this system fails when it fails: its first hop finds the product almost always
    assert run["summary"]["recall_at_k.hop1"] > 0.9 > run["summary"]["recall_at_k.hop2"]
    missed = [r for r in rows.values() if r["metrics"]["first_failing_hop"] == 2]
    assert missed and all(r["metrics"]["recall_at_k.hop2"] < 1 for r in missed)
    spans = spans_by_case(store_uri, run["run_id"])["hop-kettle"]
    hop2 = spans["hop 2"]
    assert hop2.inputs["query"] == second["query"] and hop2.inputs["gold"]["relevant"][0]["doc"] == "maker-lanchuan"
    assert hop2.outputs["recall_at_k.hop2"]["value"] == 1.0
    assert hop2.outputs["recall_at_k.hop2"]["rationale"].startswith("hop 2 (query '")
    assert [doc["id"] for doc in spans["retrieve (hop 2)"].outputs] == second["ranked_ids"]


def test_a_reply_without_its_calls_is_an_error_for_the_hop_metrics_never_a_zero(ragexp: Any, store_uri: str) -> None:
    run = _hop_run(ragexp, "calls_unreported_for_some")
    rows = _case_rows(store_uri, run["run_id"])
    unreported = [row for row in rows.values() if "笔" in row["question"]]
    assert unreported and run["error_count"] == len(unreported)
    for row in unreported:
        assert row["metrics"]["recall_at_k.hop2"] is None and row["metrics"]["first_failing_hop"] is None
        assert "reported no retrieval calls" in row["metric_errors"]["recall_at_k.hop2"]
        assert row["metrics"]["recall_at_k"] is not None  # the case's own ranking is still scored
    assert run["populations"]["recall_at_k.hop2"]["scored"] == len(rows) - len(unreported)
    assert run["summary"]["recall_at_k.hop2"] == pytest.approx(1.0)


def test_a_mapped_reply_gives_its_calls_and_a_bad_call_is_named() -> None:
    from ragexp.config.models import ResponseMapping
    from ragexp.providers.mapping import MappingError, compile_mapping

    mapping = compile_mapping(
        ResponseMapping(answer="data.answer", retrievals="data.steps[].{query: q, ranked_ids: hits[].id, tokens: t}"),
        "provider.system.response",
    )
    reply = {
        "data": {
            "answer": "杭州",
            "steps": [
                {"q": "星河电热水壶", "hits": [{"id": "p1"}, {"id": "x"}], "t": 12},
                {"q": "澜川电器", "hits": [{"id": "m1"}]},
            ],
        }
    }
    output = mapping.extract(reply, 0.5)
    assert [(r.query, r.ranked_ids, r.tokens) for r in output.retrievals or []] == [
        ("星河电热水壶", ["p1", "x"], 12),
        ("澜川电器", ["m1"], None),
    ]
    assert output.ranked_ids == ["p1", "x", "m1"]  # no ranking of its own: the calls' merged
    assert "retrievals" in mapping.fields()
    reply["data"]["steps"][1]["hits"] = [{"id": {"nested": 1}}]
    with pytest.raises(MappingError, match=r"^retrievals\[1\]\.ranked_ids holds dict, not a string"):
        mapping.extract(reply, 0.5)


@pytest.mark.system  # a service process: `make test`, not the edit loop
def test_a_service_over_http_reports_its_calls_and_scores_as_in_process(ragexp: Any, store_uri: str) -> None:
    from tests.servers.procs import SAMPLE, serve

    common = ("dataset=kb_zh_hops", "metrics=retrieval", "k=3", "--json")
    local = ragexp("run", *common, "provider.system.sample.docs=kb_zh_hops/docs.jsonl", "provider.system.sample.hops=2")
    assert local.code == 0, local.stderr
    docs = Path("ragexp/data/kb_zh_hops/docs.jsonl").resolve()
    with serve(SAMPLE, "--docs", str(docs), "--hops", "2") as url:
        remote = ragexp("run", *common, "provider=http", f"provider.system.url={url}")
    assert remote.code == 0, remote.stderr
    here, there = _case_rows(store_uri, local.json()["run_id"]), _case_rows(store_uri, remote.json()["run_id"])
    for case_id, row in here.items():
        for hop in (1, 2):
            name = f"recall_at_k.hop{hop}"
            assert there[case_id]["metrics"][name] == row["metrics"][name]
        assert there[case_id]["metrics"]["first_failing_hop"] == row["metrics"]["first_failing_hop"]
        assert there[case_id]["output"]["retrievals"][1]["query"] == row["output"]["retrievals"][1]["query"]
