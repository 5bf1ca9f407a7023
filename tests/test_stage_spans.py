"""Stage spans carry what each stage produced (issue 32 §6): the retrieval span its ranked ids
with their scores, the reranker's span its order in and out; for the bundled sample system (in
process and over HTTP), a Python target (LlamaIndex's NodeWithScore) and a mapped service
(Dify's segment scores). Read back from a real store with MLflow's client."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from mlflow.tracking import MlflowClient

from ragexp.checkpoint import Checkpoint, read_checkpoint
from ragexp.records import CaseResult, SystemOutput
from tests.conftest import write_jsonl
from tests.servers.procs import SAMPLE, serve
from tests.test_systems import SERVERS, SOME, numbered
from tests.test_traces import case_id, rows_of, traces_of


def spans_by_case(store_uri: str, run_id: str) -> dict[str, dict[str, Any]]:
    client = MlflowClient(store_uri)
    return {
        case_id(trace): {span.name: span for span in client.get_trace(trace.info.trace_id).data.spans}
        for trace in traces_of(store_uri, run_id)
    }


def test_stage_detail_round_trips_through_json_and_the_checkpoint(tmp_path: Path) -> None:
    stages = {"rerank": {"ids_in": ["b", "a"], "ids": ["a", "b"], "scores": [0.9, None]}}
    output = SystemOutput(["a", "b"], ["A", "B"], "x", [1], 0.5, {"rerank": 0.1}, 0.2, stages=stages)
    assert SystemOutput.from_json(output.to_json(), 0.5) == output
    assert "stages" not in SystemOutput(["a"]).to_json()  # absent, as before the field existed
    checkpoint = Checkpoint(tmp_path / "run.jsonl")
    checkpoint.add(CaseResult("c1", output))
    checkpoint.close()
    restored = read_checkpoint((tmp_path / "run.jsonl").read_bytes())["c1"].output
    assert restored == output


@pytest.mark.system  # a whole run: `make test`, not the edit loop
def test_the_sample_systems_spans_show_what_bm25_and_the_reranker_produced(
    ragexp: Any, store_uri: str, tmp_path: Path
) -> None:
    result = ragexp("run", "--json")
    assert result.code == 0, result.stderr
    run_id = result.json()["run_id"]
    rows = rows_of(store_uri, run_id, tmp_path)
    spans = spans_by_case(store_uri, run_id)
    case = next(iter(rows))
    stages = rows[case]["output"]["stages"]
    keyword, rerank = spans[case]["keyword"], spans[case]["rerank"]
    # BM25's candidates with their scores, best first; the reranker's order in and its order out.
    assert keyword.outputs["ranked"] == [
        {"rank": rank, "id": doc_id, "score": score}
        for rank, (doc_id, score) in enumerate(
            zip(stages["keyword"]["ids"], stages["keyword"]["scores"], strict=True), start=1
        )
    ]
    scores = stages["keyword"]["scores"]
    assert scores == sorted(scores, reverse=True) and scores[0] > 0
    assert rerank.inputs == {"ids": stages["keyword"]["ids"]}
    assert [item["id"] for item in rerank.outputs["ranked"]] == stages["rerank"]["ids"]
    assert sorted(stages["rerank"]["ids"]) == sorted(stages["keyword"]["ids"])
    # The final ranking is the reranked order, each document once.
    ranked = rows[case]["output"]["ranked_ids"]
    assert ranked == list(dict.fromkeys(stages["rerank"]["ids"]))[: len(ranked)]
    assert rerank.outputs["seconds"] == pytest.approx(rows[case]["output"]["timings"]["rerank"])
    # A case the system refused (BM25's best score under the threshold) still shows what retrieval
    # found, and how weakly: why it refused.
    refused = rows["un-refund-fee"]["output"]
    assert refused["ranked_ids"] == [] and refused["answer"].startswith("知识库中没有足够证据")
    found = spans["un-refund-fee"]["keyword"].outputs["ranked"]
    assert [item["id"] for item in found] == refused["stages"]["keyword"]["ids"] and len(found) == 4
    assert max(item["score"] for item in found) < 3.0  # the sample's default threshold
    # No candidate at all: the stage span says nothing was ranked.
    assert "ranked" not in spans["un-store"]["keyword"].outputs


@pytest.mark.system
def test_the_sample_service_over_http_gives_the_same_stage_detail(ragexp: Any, store_uri: str, tmp_path: Path) -> None:
    local = ragexp("run", "--json")
    with serve(SAMPLE) as url:
        remote = ragexp("run", "provider=http", f"provider.system.url={url}", "--json")
    assert local.code == remote.code == 0, remote.stderr
    here = rows_of(store_uri, local.json()["run_id"], tmp_path / "local")
    there = rows_of(store_uri, remote.json()["run_id"], tmp_path / "remote")
    assert {cid: row["output"]["stages"] for cid, row in here.items()} == {
        cid: row["output"]["stages"] for cid, row in there.items()
    }
    spans = spans_by_case(store_uri, remote.json()["run_id"])
    case = next(iter(there))
    assert spans[case]["rerank"].inputs == {"ids": there[case]["output"]["stages"]["rerank"]["ids_in"]}


@pytest.mark.system  # a whole run: `make test`, not the edit loop
def test_a_python_targets_retrieval_scores_are_on_the_retrieval_span(
    ragexp: Any, store_uri: str, tmp_path: Path
) -> None:
    from tests.pipelines.corpus import CASES
    from tests.pipelines.llama import engine

    data = write_jsonl(tmp_path / "cases.jsonl", CASES)
    result = ragexp(
        "run", f"dataset.path={data}", "k=2", "system=llamaindex",
        "provider.system.target=tests.pipelines.llama:engine.query", "metrics=retrieval", "--json",
    )  # fmt: skip
    assert result.code == 0, result.stderr
    run_id = result.json()["run_id"]
    rows = rows_of(store_uri, run_id, tmp_path)
    spans = spans_by_case(store_uri, run_id)
    for row in CASES:
        nodes = engine.query(row["question"]).source_nodes
        assert rows[row["id"]]["output"]["stages"] == {
            "retrieve": {"ids": [n.node.id_ for n in nodes], "scores": [n.score for n in nodes]}
        }
        documents = spans[row["id"]]["retrieve"].outputs
        assert [(d["id"], d["metadata"]["score"]) for d in documents] == [(n.node.id_, n.score) for n in nodes]


@pytest.mark.system
def test_a_mapped_services_scores_are_on_the_retrieval_span(
    ragexp: Any, store_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAGEXP_DIFY_AUTH", "Bearer app-standin")
    data = write_jsonl(tmp_path / "cases.jsonl", numbered("what about 1?", "hello there"))
    with serve(SERVERS / "dify.py") as url:
        result = ragexp(
            "run", "system=dify", f"provider.system.url={url}/v1/chat-messages", f"dataset.path={data}", SOME, "--json"
        )
    assert result.code == 0, result.stderr
    run_id = result.json()["run_id"]
    rows = rows_of(store_uri, run_id, tmp_path)
    # Dify's retriever_resources scores (position 1: 0.8, position 2: 0.7), aligned with the segments.
    assert rows["c1"]["output"]["stages"] == {"retrieve": {"ids": ["seg-1", "seg-1-x"], "scores": [0.8, 0.7]}}
    documents = spans_by_case(store_uri, run_id)["c1"]["retrieve"].outputs
    assert [(d["id"], d["metadata"]["score"], d["metadata"]["rank"]) for d in documents] == [
        ("seg-1", 0.8, 1),
        ("seg-1-x", 0.7, 2),
    ]
    assert rows["c2"]["output"]["stages"] == {"retrieve": {"ids": [], "scores": []}}
