"""Systems described in config: per-kind config models, request templates and response mappings,
HTTP services with their own contract (presets and generic mappings), streaming."""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from mlflow.entities import Run
from mlflow.tracking import MlflowClient
from pydantic import BaseModel

from ragexp.config.compose import compose
from ragexp.config.identity import identity_view
from ragexp.config.models import ResponseMapping
from ragexp.errors import ConfigError
from ragexp.providers.expressions import to_plain
from ragexp.providers.mapping import MappingError, SystemReplyError, check_template, compile_mapping, render
from ragexp.records import Case
from tests.conftest import ROOT, write_jsonl
from tests.servers.procs import preset_standin, serve, stats


def case(case_id: str = "c1", question: str = "What is RAG?", **metadata: Any) -> Case:
    return Case(case_id, question, ["d1"], [], None, False, 3, metadata=metadata)


# --- per-kind config models --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["system=fake", "provider.system.url=http://x"], "config: provider.system.url: unknown key for kind 'fake'"),
        (
            ["system=replay", "provider.system.timeout_s=3"],
            "config: provider.system.timeout_s: unknown key for kind 'replay'",
        ),
        (
            ["system=sample", "provider.system.method=GET"],
            "config: provider.system.method: unknown key for kind 'sample'",
        ),
        (["system=http", "provider.system.target=a:b"], "config: provider.system.target: unknown key for kind 'http'"),
        (
            ["system=http", "+provider.system.response.answr=x"],
            "config: provider.system.response.answr: unknown key for kind 'http'",
        ),
        (
            ["system=http", "provider.system.method=PUT"],
            "config: provider.system.method: Input should be 'POST' or 'GET'",
        ),
        (
            ["system=http", "provider.system.stream.format=websocket"],
            "config: provider.system.stream.format: Input should be 'none', 'sse' or 'ndjson'",
        ),
        (["system=http", "provider.system.kind=ftp"], "config: provider.system.kind: unknown provider 'ftp' (known: "),
    ],
)
def test_each_kind_takes_only_its_own_keys(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        compose(overrides)
    assert str(info.value).startswith(message), str(info.value)
    assert "\n" not in str(info.value)


def test_each_kind_hashes_only_its_own_keys() -> None:
    assert identity_view(compose(["system=fake"]).provider.system) == {"kind": "fake"}
    assert identity_view(compose(["system=replay"]).provider.system) == {"kind": "replay"}
    # Today's HTTP configs keep the identity (and so the hash) they had: the new keys at their
    # defaults stay out of it.
    http = compose(["system=http"]).provider.system
    assert identity_view(http) == {"kind": "http", "url": "http://127.0.0.1:8000/query", "headers_env": {}}
    mapped = compose(["system=http", "provider.system.method=GET", "provider.system.response.answer=data.text"])
    view = identity_view(mapped.provider.system)
    assert view["method"] == "GET" and view["response"]["answer"] == "data.text"
    assert "timeout_s" not in view and "max_retries" not in view


# --- request templates -------------------------------------------------------------------------


def test_render_fills_every_string_and_keeps_k_a_number() -> None:
    template = {
        "query": "{question}",
        "top_k": "{k}",
        "meta": ["id={case_id}", {"lang": "{lang}", "tier": "{tier}"}, 7, None, True],
        "literal": "{{not a placeholder}} and {  spaced }",
        "text": "k is {k}; tier {tier}",
    }
    body = render(template, case(lang="zh", tier=2), 5)
    assert body == {
        "query": "What is RAG?",
        "top_k": 5,
        "meta": ["id=c1", {"lang": "zh", "tier": 2}, 7, None, True],
        "literal": "{not a placeholder} and {  spaced }",
        "text": "k is 5; tier 2",
    }
    assert template["top_k"] == "{k}"  # the template is not changed in place


def test_check_template_refuses_a_placeholder_no_case_fills() -> None:
    check_template({"q": "{question}", "x": ["{k}", "{case_id}"]}, "provider.system.request")
    check_template({"lang": "{lang}"}, "provider.system.request", [case(lang="zh"), case("c2", lang="en")])
    with pytest.raises(ConfigError) as info:
        check_template({"lang": "{lang}"}, "provider.system.request", [case(lang="zh"), case("c2")])
    assert str(info.value) == (
        "provider.system.request: unknown placeholder {lang}: not one of question, k, case_id, history, "
        "messages, conversation_id and not a metadata field of case 'c2' (line 3)"
    )
    with pytest.raises(ConfigError, match=r"unknown placeholder \{questoin\}"):
        check_template({"q": "{questoin}"}, "provider.system.request")


# --- response mappings -------------------------------------------------------------------------


def mapping(**keys: Any) -> ResponseMapping:
    return ResponseMapping.model_validate(keys)


def test_extract_maps_every_field_and_reports_what_it_supplies() -> None:
    compiled = compile_mapping(
        mapping(
            answer="data.answer",
            ranked_ids="data.chunks[].id",
            contexts="data.chunks[].content",
            citations="data.cited",
            timings="data.timings",
            citation_base=0,
        ),
        "provider.system.response",
    )
    reply = {
        "data": {
            "answer": "Retrieval-augmented generation.",
            "chunks": [{"id": "d7", "content": "RAG is ..."}, {"id": 12, "content": "It retrieves ..."}],
            "cited": [1, 0, 1],
            "timings": {"retrieve": 0.25, "generate": 1},
        }
    }
    output = compiled.extract(reply, 0.5)
    assert output.answer == "Retrieval-augmented generation."
    assert output.ranked_ids == ["d7", "12"]
    assert output.contexts == ["RAG is ...", "It retrieves ..."]
    assert output.citations == [2, 1]
    assert output.timings == {"retrieve": 0.25, "generate": 1.0}
    assert output.latency_seconds == 0.5
    assert compiled.fields() == {"response", "retrieved_ids", "retrieved_contexts", "citations", "latency_seconds"}
    answer_only = compile_mapping(mapping(answer="choices[0].message.content"), "r")
    assert answer_only.fields() == {"response", "latency_seconds"}
    assert compile_mapping(mapping(answer="a", citation_pattern=r"\[(\d+)\]"), "r").fields() >= {"citations"}


def test_citations_from_markers_by_index_or_id() -> None:
    reply = {"answer": "A [ID:0] and B [ID:2], again [ID:0].", "ids": ["x", "y", "z"]}
    by_index = compile_mapping(
        mapping(answer="answer", ranked_ids="ids", citation_pattern=r"\[ID:(\d+)\]", citation_base=0), "r"
    )
    assert by_index.extract(reply, None).citations == [1, 3]
    by_id = compile_mapping(
        mapping(answer="answer", ranked_ids="ids", citation_pattern=r"【(\w+)】", citations_as="id"), "r"
    )
    # An id that was not retrieved cites nothing retrieved: past the end, counted as unsupported.
    assert by_id.extract({"answer": "see 【z】 and 【q】", "ids": ["x", "y", "z"]}, None).citations == [3, 4]


def test_an_error_envelope_is_an_error_for_the_case() -> None:
    compiled = compile_mapping(mapping(answer="data.answer", error="code != `0` && message"), "r")
    with pytest.raises(SystemReplyError, match=r"^You don.t own the dialog\.$"):
        compiled.extract({"code": 102, "message": "You don't own the dialog."}, 0.1)
    assert compiled.extract({"code": 0, "data": {"answer": "fine"}}, 0.1).answer == "fine"


@pytest.mark.parametrize(
    ("keys", "reply", "message"),
    [
        ({"answer": "a"}, {"a": ["x"]}, "answer: 'a' gave a list, not a string"),
        ({"answer": "a"}, {"b": "x"}, "answer: 'a' found nothing in the reply"),
        ({"answer": "a", "ranked_ids": "ids"}, {"a": "", "ids": "d1"}, "ranked_ids: 'ids' gave a string, not a list"),
        (
            {"answer": "a", "contexts": "c"},
            {"a": "", "c": [{"t": 1}]},
            "contexts: 'c' gave a list holding an object, not strings",
        ),
        (
            {"answer": "a", "ranked_ids": "i", "contexts": "c"},
            {"a": "", "i": ["x"], "c": ["1", "2"]},
            "contexts ('c') has 2 items but ranked_ids ('i') has 1",
        ),
        ({"answer": "a", "citations": "c"}, {"a": "", "c": [0]}, "citations: 0 is not a 1-based position"),
        ({"answer": "a", "timings": "t"}, {"a": "", "t": {"x": -1}}, "timings: 't' must give an object"),
    ],
)
def test_a_mapped_field_of_the_wrong_type_names_field_and_expression(
    keys: dict[str, Any], reply: dict[str, Any], message: str
) -> None:
    with pytest.raises(MappingError) as info:
        compile_mapping(mapping(**keys), "r").extract(reply, None)
    assert str(info.value).startswith(message), str(info.value)


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        ({"answer": "data.[answer"}, "provider.system.response.answer: not a JMESPath expression: "),
        ({"answer": " "}, "provider.system.response.answer: empty JMESPath expression"),
        ({"citation_pattern": "[ID:"}, "provider.system.response.citation_pattern: not a regular expression"),
        ({"citation_pattern": r"\[\d+\]"}, "provider.system.response.citation_pattern: needs exactly one group"),
    ],
)
def test_a_bad_mapping_is_one_config_error(keys: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        compile_mapping(mapping(**keys), "provider.system.response")
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


EXPRESSIONS = [
    "a",
    "a.b",
    "a[0]",
    "a[-1].b",
    "a[5]",
    "a.b[0].c",
    "a[]",
    "a[].b",
    "a.b[].c.d",
    "a[].b[0]",
    "choices[0].delta.content",
    "a[].b[].c",  # not a common shape: left to JMESPath's interpreter
    "contains(['x', 'y'], a) && b || null",
]
VALUES: list[Any] = [
    None,
    "text",
    7,
    [1, 2],
    {"a": None},
    {"a": "x", "b": "B"},
    {"a": {"b": [{"c": {"d": 1}}, {"c": {"e": 2}}, "s", [{"c": {"d": 3}}]]}},
    {"a": [{"b": 1}, {"b": None}, [{"b": 2}, {"c": 3}], 4, [[{"b": 5}]]]},
    {"a": [[1, 2], 3, [4, [5]]]},
    {"a": [{"b": [9, 8]}, {"b": "no"}, {"b": []}]},
    {"choices": [{"delta": {"content": "piece"}}], "a": {"b": []}},
    {"choices": [], "a": [{"b": [{"c": 1}, {"c": 2}]}, {"b": [{"c": 3}]}]},
]


@pytest.mark.parametrize("expression", EXPRESSIONS)
def test_compiled_expressions_find_what_jmespath_finds(expression: str) -> None:
    import jmespath

    from ragexp.providers.expressions import compile_expression

    compiled = compile_expression(expression, "r")
    for value in VALUES:
        try:
            expected = jmespath.search(expression, value)
        except jmespath.exceptions.JMESPathError:  # contains() of null: a type error either way
            with pytest.raises(jmespath.exceptions.JMESPathError):
                compiled.search(value)
            continue
        assert compiled.search(value) == expected, (expression, value)


# --- plain data --------------------------------------------------------------------------------


@dataclass
class Chunk:
    id: str
    text: str


class Source(BaseModel):
    chunk: Chunk
    score: float


class Node:
    def __init__(self) -> None:
        self.id_ = "n1"
        self.text = "node text"
        self._private = "hidden"


def test_to_plain_takes_objects_apart_field_by_field() -> None:
    from langchain_core.documents import Document

    value = {
        "answer": "a",
        "context": [Document(page_content="page", metadata={"source": "s"}, id="doc-1")],
        "sources": (Source(chunk=Chunk("c1", "t"), score=0.5),),
        "node": Node(),
    }
    plain = to_plain(value)
    document = plain["context"][0]
    assert (document["id"], document["page_content"], document["metadata"]) == ("doc-1", "page", {"source": "s"})
    assert plain["sources"] == [{"chunk": {"id": "c1", "text": "t"}, "score": 0.5}]
    assert plain["node"] == {"id_": "n1", "text": "node text"}
    loop: dict[str, Any] = {}
    loop["self"] = loop
    assert isinstance(to_plain(loop)["self"], str)  # a cycle ends, as text


# --- services with their own API, end to end ---------------------------------------------------

SERVERS = ROOT / "tests/servers"
SOME = "metrics.names=[recall_at_k,mrr,answer_accuracy,p95_seconds,error_rate]"
FAST = ["provider.system.backoff_s=0.01", "provider.system.max_retries=1"]


def numbered(*questions: str) -> list[dict[str, Any]]:
    """Cases the stand-ins answer from their knowledge: "... n?" retrieves seg-n, states fact n."""
    rows: list[dict[str, Any]] = []
    for index, question in enumerate(questions, start=1):
        match = re.search(r"(\d+)\D*$", question)
        row: dict[str, Any] = {"id": f"c{index}", "question": question}
        if match:
            row |= {"relevant_ids": [f"seg-{match.group(1)}"], "expected_facts": [f"fact {match.group(1)}"]}
        else:
            row |= {"unanswerable": True}
        rows.append(row)
    return rows


def rows_of(store_uri: str, run_id: str, tmp_path: Path) -> dict[str, dict[str, Any]]:
    path = MlflowClient(store_uri).download_artifacts(run_id, "cases.jsonl", str(tmp_path / f"rows-{run_id}"))
    return {row["id"]: row for row in map(json.loads, Path(path).read_text().splitlines())}


@pytest.mark.system  # a whole run: `make test`, not the edit loop
def test_dify_preset_end_to_end(ragexp: Any, store_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = write_jsonl(tmp_path / "cases.jsonl", numbered("what about 1?", "and 2?", "over quota 3?", "hello there"))
    with preset_standin("dify", monkeypatch) as (url, dify):
        result = ragexp("run", *dify, f"dataset.path={data}", SOME, "--json")
        attempts = stats(url)
    assert result.code == 0, result.stderr
    payload = result.json()
    assert (payload["case_count"], payload["error_count"]) == (4, 1)
    rows = rows_of(store_uri, payload["run_id"], tmp_path)
    first = rows["c1"]["output"]
    # What the service streamed, joined: pieces of `message` events, segments of `message_end`.
    assert first["answer"] == "fact 1 is documented."
    assert first["ranked_ids"] == ["seg-1", "seg-1-x"] and first["contexts"] == [
        "fact 1 lives here.",
        "Unrelated text.",
    ]
    assert first["citations"] == [] and 0 < first["ttft_seconds"] <= rows["c1"]["latency_seconds"]
    assert rows["c1"]["metrics"]["recall_at_k"] == 1.0 and rows["c1"]["metrics"]["answer_accuracy"] == 1.0
    assert rows["c4"]["output"]["ranked_ids"] == [] and rows["c4"]["metrics"]["answer_accuracy"] == 1.0
    # An `error` event in the stream is an error for that case, with Dify's message, never a score.
    assert rows["c3"]["error"] == "service error: Your quota of provider has been exceeded."
    assert set(rows["c3"]["metrics"].values()) == {None}
    assert {question: len(times) for question, times in attempts.items()}["over quota 3?"] == 1
    metrics = MlflowClient(store_uri).get_run(payload["run_id"]).data.metrics
    assert 0 < metrics["ttft_p95_seconds"] <= metrics["p95_seconds"]


def test_a_metric_needing_a_field_the_system_does_not_give_is_refused(
    ragexp: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAGEXP_DIFY_AUTH", "Bearer app-standin")
    data = write_jsonl(tmp_path / "mine.jsonl", numbered("what about 1?"))
    result = ragexp(
        "run", "system=dify", "provider.system.url=http://127.0.0.1:9/v1/chat-messages", f"dataset.path={data}"
    )
    assert result.code == 1
    # The refusal names the fix: the packaged sets that fit, and the chosen metrics that do.
    assert result.stderr.strip().splitlines() == [
        "ragexp: error: metric 'citation_precision' needs output field 'citations', which provider dify+none "
        "does not give for every case of mine; metrics that fit: metrics=retrieval or "
        "metrics.names=[recall_at_k,mrr,ndcg_at_k,answer_accuracy,p95_seconds,error_rate]"
    ]
    answer_only = ragexp(
        "run", "system=openai_chat", f"dataset.path={data}", "metrics.names=[answer_accuracy,recall_at_k]"
    )
    assert answer_only.code == 1 and "metric 'recall_at_k' needs output field 'retrieved_ids'" in answer_only.stderr


@pytest.mark.system  # a whole run: `make test`, not the edit loop
def test_ragflow_preset_end_to_end(
    ragexp: Any, store_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = write_jsonl(tmp_path / "cases.jsonl", numbered("what about 5?", "forbidden 6?", "nothing"))
    with preset_standin("ragflow", monkeypatch) as (url, ragflow):
        result = ragexp("run", *ragflow, f"dataset.path={data}", "--json")
        wrong_chat = ragexp(
            "run",
            "system=ragflow",
            f"provider.system.url={url}/api/v1/chats/nope/completions",
            f"dataset.path={data}",
            SOME,
            "--json",
        )
    assert result.code == 0, result.stderr
    rows = rows_of(store_uri, result.json()["run_id"], tmp_path)
    output = rows["c1"]["output"]
    # Each event repeats the answer so far: the last one is the answer, its marker a citation.
    assert output["answer"] == "fact 5 is documented [ID:0]."
    assert output["ranked_ids"] == ["seg-5", "seg-5-x"] and output["citations"] == [1]
    assert rows["c1"]["metrics"]["citation_precision"] == 1.0 and rows["c1"]["metrics"]["recall_at_k"] == 1.0
    # Business errors come as HTTP 200 {"code": 102, ...}, as plain JSON even when streaming.
    assert rows["c2"]["error"] == "service error: You don't own the dialog."
    assert rows["c3"]["output"]["answer"] == "无法回答: the knowledge base has nothing on that."
    assert wrong_chat.code == 1  # every case errored: nothing to compare
    assert "You don't own the chat nope" in wrong_chat.stderr


@pytest.mark.system  # a whole run: `make test`, not the edit loop
def test_openai_chat_preset_end_to_end(
    ragexp: Any, store_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = write_jsonl(tmp_path / "cases.jsonl", numbered("what about 8?", "a very long 9?"))
    with preset_standin("openai_chat", monkeypatch) as (_, openai_chat):
        result = ragexp(
            "run",
            *openai_chat,
            "provider.system.request.model=standin-model",
            f"dataset.path={data}",
            "metrics.names=[answer_accuracy,p95_seconds,error_rate]",
            "--json",
        )
    assert result.code == 0, result.stderr
    rows = rows_of(store_uri, result.json()["run_id"], tmp_path)
    assert rows["c1"]["output"]["answer"] == "fact 8 is documented." and rows["c1"]["output"]["ranked_ids"] == []
    assert rows["c1"]["metrics"]["answer_accuracy"] == 1.0
    # A 4xx shows the server's own reason.
    assert rows["c2"]["error"] == "HTTP 400 (not retried): This model's maximum context length is 8192 tokens."


INHOUSE = """\
# @package provider.system
kind: http
method: GET
url: {url}/search
headers_env: {{X-Api-Key: INHOUSE_KEY}}
request: {{q: "{{question}}", top: "{{k}}", lang: "{{lang}}", tag: "case {{case_id}}"}}
response:
  answer: result.text
  ranked_ids: "result.hits[].doc"
  contexts: "result.hits[].body"
  citations: result.cites
  citations_as: id
  timings: took
  error: "status == 'error' && reason"
"""


@contextlib.contextmanager
def inhouse_system(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The in-house stand-in served, its key set, and ``system=inhouse`` (:data:`INHOUSE`) in a
    config folder of the test's own, while the block runs."""
    monkeypatch.setenv("INHOUSE_KEY", "inhouse-standin")
    conf = tmp_path / "conf"
    (conf / "system").mkdir(parents=True)
    monkeypatch.setenv("RAGEXP_CONFIG_DIR", str(conf))
    with serve(SERVERS / "inhouse.py") as url:
        (conf / "system/inhouse.yaml").write_text(INHOUSE.format(url=url), encoding="utf-8")
        yield


@pytest.mark.system  # a whole run: `make test`, not the edit loop
def test_a_get_api_with_its_own_field_names(
    ragexp: Any, store_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = numbered("what about 3?", "broken 4?", "badtype 5?", "echo 6?")
    for row in rows:
        row["metadata"] = {"lang": "en"}
    data = write_jsonl(tmp_path / "cases.jsonl", rows)
    with inhouse_system(tmp_path, monkeypatch):
        result = ragexp("run", "system=inhouse", "k=1", f"dataset.path={data}", "--json")
    assert result.code == 0, result.stderr
    got = rows_of(store_uri, result.json()["run_id"], tmp_path)
    output = got["c1"]["output"]
    # k=1 went out as top=1: one hit; the cited id is its position.
    assert output == {
        "answer": "fact 3 is documented.",
        "ranked_ids": ["seg-3"],
        "contexts": ["fact 3 lives here."],
        "citations": [1],
        "timings": {"search": 0.01, "llm": 0.02},
    }
    assert got["c1"]["metrics"]["citation_precision"] == 1.0
    assert got["c2"]["error"] == "service error: index is rebuilding"
    assert got["c3"]["error"] == "contract: answer: 'result.text' gave a list, not a string"
    assert got["c4"]["output"]["answer"] == "invalid key ***"  # a key echoed back is masked
    assert "inhouse-standin" not in json.dumps(got)


@pytest.mark.system  # a whole run: `make test`, not the edit loop
def test_an_unknown_placeholder_is_refused_before_the_run(
    ragexp: Any, store_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = numbered("what about 3?", "and 4?")
    rows[0]["metadata"] = {"lang": "en"}
    data = write_jsonl(tmp_path / "cases.jsonl", rows)
    monkeypatch.setenv("INHOUSE_KEY", "inhouse-standin")
    base = ["system=http", "provider.system.url=http://127.0.0.1:9/search", f"dataset.path={data}"]
    result = ragexp("run", *base, "+provider.system.request={q: '{question}', lang: '{lang}'}")
    assert result.code == 1
    assert result.stderr.strip() == (
        "ragexp: error: provider.system.request: unknown placeholder {lang}: not one of question, k, case_id, "
        f"history, messages, conversation_id and not a metadata field of case 'c2' ({data}:2)"
    )
    bad = ragexp("run", *base, "provider.system.response.answer='data.[x'")
    assert bad.code == 1 and bad.stderr.startswith(
        "ragexp: error: provider.system.response.answer: not a JMESPath expression"
    )
    assert len(bad.stderr.strip().splitlines()) == 1
    assert count_runs(store_uri) == 0


def count_runs(store_uri: str) -> int:
    client = MlflowClient(store_uri)
    experiment = client.get_experiment_by_name("ragexp")
    return 0 if experiment is None else len(client.search_runs([experiment.experiment_id]))


NDJSON = [
    "system=http",
    "+provider.system.request={q: '{question}'}",
    "provider.system.stream.format=ndjson",
    "provider.system.stream.delta=\"type == 'token' && text || null\"",
    "provider.system.response.ranked_ids='hits[].doc'",
    "provider.system.response.contexts='hits[].body'",
    "+provider.system.headers_env={X-Api-Key: INHOUSE_KEY}",
]


def cut_then_resumed(
    ragexp: Any, store_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cut_question: str
) -> tuple[Any, Run, dict[str, dict[str, Any]]]:
    """The in-house NDJSON stand-in, its cut switch on, asked three cases (the second one
    ``cut_question``) at concurrency 1, stopping after one failed call; then the stopped run resumed
    with the switch off, and checked: every case answered, the cut one asked twice while cut (one
    retry) and once more on resume, the answered one kept. The first run's result, the stopped run
    and its rows."""
    monkeypatch.setenv("INHOUSE_KEY", "inhouse-standin")
    cut = tmp_path / "cut"
    cut.write_text("cut")
    data = write_jsonl(tmp_path / "cases.jsonl", numbered("what about 1?", cut_question, "and 3?"))
    env = {**os.environ, "STANDIN_CUT_FILE": str(cut)}
    with serve(SERVERS / "inhouse.py", env=env) as url:
        args = [*NDJSON, f"provider.system.url={url}/ask/stream", f"dataset.path={data}", SOME, *FAST]
        args += ["concurrency=1", "provider.system.abort_after=1"]
        first = ragexp("run", *args)
        client = MlflowClient(store_uri)
        (aborted,) = client.search_runs([client.get_experiment_by_name("ragexp").experiment_id])
        cut.unlink()
        resumed = ragexp("run", *args, "--resume", aborted.info.run_id, "--json")
        attempts = stats(url)
    assert resumed.code == 0, resumed.stderr
    assert resumed.json()["error_count"] == 0
    rows = rows_of(store_uri, aborted.info.run_id, tmp_path)
    assert rows["c2"]["output"]["answer"] == "fact 2 is documented." and rows["c2"]["metrics"]["recall_at_k"] == 1.0
    assert len(attempts[cut_question]) == 3 and len(attempts["what about 1?"]) == 1
    return first, aborted, rows


@pytest.mark.system  # a whole run: `make test`, not the edit loop
def test_a_stream_cut_in_the_middle_is_an_error_that_resume_asks_again(
    ragexp: Any, store_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, aborted, rows = cut_then_resumed(ragexp, store_uri, tmp_path, monkeypatch, "cut at 2?")
    # A cut stream is a transport failure: retried, then counted toward stopping the run.
    assert first.code == 1
    assert "the service failed 1 calls in a row since its last answer: connection failed (RemoteProtocolError" in (
        first.stderr
    )
    assert aborted.data.tags["ragexp.status"] == "aborted"
    assert rows["c2"]["output"]["ranked_ids"] == ["seg-2", "seg-2-x"]


@pytest.mark.system
def test_a_stalled_stream_is_a_timeout(
    ragexp: Any, store_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = write_jsonl(tmp_path / "cases.jsonl", numbered("what about 1?", "stall on 2?"))
    with preset_standin("dify", monkeypatch) as (_, dify):
        result = ragexp(
            "run",
            *dify,
            f"dataset.path={data}",
            SOME,
            "provider.system.timeout_s=1",
            "provider.system.max_retries=0",
            "--json",
        )
    assert result.code == 0, result.stderr
    rows = rows_of(store_uri, result.json()["run_id"], tmp_path)
    assert rows["c2"]["error"] == "timed out after 1 s after 1 attempt"
    assert rows["c1"]["output"]["answer"] == "fact 1 is documented."


@pytest.mark.system  # a whole run: `make test`, not the edit loop
def test_a_stream_larger_than_the_cap_is_an_error_read_no_further(
    ragexp: Any, store_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = write_jsonl(tmp_path / "cases.jsonl", numbered("what about 1?", "and 2?"))
    with preset_standin("dify", monkeypatch) as (_, dify):
        result = ragexp(
            "run",
            *dify,
            f"dataset.path={data}",
            SOME,
            "provider.system.max_response_bytes=600",
            "--json",
        )
    assert result.code == 1  # every case errored
    assert "stream is larger than max_response_bytes (600 bytes)" in result.stderr


# --- init templates and the probe ----------------------------------------------------------------


@pytest.mark.parametrize("system", ["http", "dify", "ragflow", "openai_chat", "python", "langchain", "llamaindex"])
def test_init_writes_the_template_of_each_system(
    ragexp: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, system: str
) -> None:
    result = ragexp("init", str(tmp_path), "--system", system)
    assert result.code == 0, result.stderr
    text = (tmp_path / "conf/system/my_service.yaml").read_text(encoding="utf-8")
    assert "CHANGE ME" in text
    monkeypatch.setenv("RAGEXP_CONFIG_DIR", str(tmp_path / "conf"))
    mine = compose(["system=my_service"]).provider.system
    if system == "python":
        assert mine.kind == "python" and mine.target == "my_package.rag:answer"
    elif system in ("langchain", "llamaindex"):
        # The preset's input and response mapping, with a target to fill in where the preset has '???'.
        packaged = compose([f"system={system}", "provider.system.target=x:y"]).provider.system
        assert mine.model_copy(update={"target": "x:y"}) == packaged
        assert mine.target in ("my_package.rag:chain", "my_package.rag:query_engine.query")
    elif system != "http":
        # Every key of the preset, to fill in: the same system as the packaged one.
        assert mine == compose([f"system={system}"]).provider.system


def test_init_refuses_an_unknown_system(ragexp: Any, tmp_path: Path) -> None:
    result = ragexp("init", str(tmp_path), "--system", "haystack")
    assert result.code == 1
    assert result.stderr.strip() == (
        "ragexp: error: --system: unknown system 'haystack' "
        "(known: http, dify, ragflow, openai_chat, python, langchain, llamaindex)"
    )
    assert not (tmp_path / "conf").exists()


@pytest.mark.system  # a whole run: `make test`, not the edit loop
def test_probe_shows_the_raw_reply_and_what_each_expression_read(
    ragexp: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    good = write_jsonl(tmp_path / "good.jsonl", numbered("what about 5?"))
    bad = write_jsonl(tmp_path / "bad.jsonl", numbered("forbidden 6?"))
    with preset_standin("ragflow", monkeypatch) as (url, ragflow):
        args = ["validate", *ragflow]
        probed = ragexp(*args, f"dataset.path={good}", "--probe", "--json")
        text = ragexp(*args, f"dataset.path={good}", "--probe")
        refused = ragexp(*args, f"dataset.path={bad}", "--probe", "--json")
        attempts = stats(url)
    assert probed.code == 0, probed.stderr
    report = probed.json()["probe"]
    assert report["status"] == 200 and report["body"] == {"question": "what about 5?", "stream": True}
    assert report["raw"].startswith('data:{"code": 0, "message": "", "data": {"answer": "fact "')
    assert report["extracted"]["ranked_ids ('data.reference.chunks[].id')"] == ["seg-5", "seg-5-x"]
    assert report["extracted"]["answer (stream.delta 'data.answer', over 6 events)"] == "fact 5 is documented [ID:0]."
    assert report["output"]["citations"] == [1] and report["error"] is None
    assert '  ranked_ids (\'data.reference.chunks[].id\') -> ["seg-5", "seg-5-x"]' in text.stdout
    assert refused.code == 1 and refused.json()["probe"]["error"] == "service error: You don't own the dialog."
    assert len(attempts["what about 5?"]) == 2  # one request per probe, no retries
    local = ragexp("validate", "system=fake", f"dataset.path={good}", "--probe")
    assert local.code == 1
    assert local.stderr.strip().splitlines()[-1] == (
        "ragexp: error: --probe: provider kind fake calls no live system; nothing to probe"
    )


@pytest.mark.system
def test_a_streamed_service_behind_a_private_ca(
    ragexp: Any, store_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.tls import make_ca_and_server_cert

    ca, cert, key = make_ca_and_server_cert(tmp_path)
    data = write_jsonl(tmp_path / "cases.jsonl", numbered("what about 1?"))
    with preset_standin("dify", monkeypatch, "--tls-cert", str(cert), "--tls-key", str(key)) as (url, dify):
        assert url.startswith("https://")
        args = ["run", *dify, f"dataset.path={data}", SOME]
        trusted = ragexp(*args, f"provider.system.ca_file={ca}", "--json")
        untrusted = ragexp(*args)
    assert trusted.code == 0, trusted.stderr
    rows = rows_of(store_uri, trusted.json()["run_id"], tmp_path)
    assert rows["c1"]["output"]["ranked_ids"] == ["seg-1", "seg-1-x"]
    assert untrusted.code == 1 and "TLS certificate of 127.0.0.1" in untrusted.stderr


# --- reading streams ---------------------------------------------------------------------------


def read_stream(body: bytes, stream: dict[str, Any], content_type: str = "text/event-stream", **keys: Any) -> Any:
    import asyncio

    import httpx

    from ragexp.config.models import StreamConfig
    from ragexp.providers.streams import StreamReader

    reader = StreamReader(compile_mapping(mapping(**keys), "r"), StreamConfig.model_validate(stream))
    response = httpx.Response(200, headers={"content-type": content_type}, content=body)
    return asyncio.run(reader.read(response, 10_000, 0.0)).output(1.0)


def test_sse_events_skip_comments_keepalives_and_done_in_any_line_ending() -> None:
    body = (
        b": a comment from a proxy\r\n\r\n"
        b"event: ping\r\n\r\n"
        b'id: 1\r\nretry: 3000\r\ndata:{"t": "Hel"}\r\n\r\n'
        b'data: {"t": "lo",\ndata:  "ids": ["a"]}\n\n'  # one event over two data lines
        b'data: {"t": ""}\r\r'
        b"data: [DONE]\n\n"
    )
    output = read_stream(body, {"format": "sse", "delta": "t"}, ranked_ids="ids")
    assert (output.answer, output.ranked_ids) == ("Hello", ["a"])
    assert output.ttft_seconds is not None and output.ttft_seconds > 0


def test_a_stream_ending_inside_an_event_is_a_transport_failure() -> None:
    import httpx

    with pytest.raises(httpx.RemoteProtocolError, match="ended in the middle of an event"):
        read_stream(b'data: {"t": "a"}\n\ndata: {"t": "b"}', {"format": "sse", "delta": "t"})
    with pytest.raises(httpx.RemoteProtocolError):
        read_stream(b'data: {"t": "a"}\n\ndata: {"t": "b"}\n', {"format": "sse", "delta": "t"})


def test_ndjson_cumulative_and_a_json_body_instead_of_a_stream() -> None:
    body = b'{"a": "I"}\n\n{"a": "I am"}\n{"a": "I am here", "ids": [3]}'  # last line unterminated
    output = read_stream(
        body, {"format": "ndjson", "cumulative": True}, "application/x-ndjson", answer="a", ranked_ids="ids"
    )
    assert (output.answer, output.ranked_ids) == ("I am here", ["3"])
    # An error envelope sent as one JSON body while a stream was asked for is read as one event.
    with pytest.raises(SystemReplyError, match=r"^quota$"):
        read_stream(
            b'{"code": 7, "message": "quota"}',
            {"format": "sse", "delta": "t"},
            "application/json",
            error="code != `0` && message",
        )
    from ragexp.transport import BadReply

    with pytest.raises(BadReply, match=r"stream event 1 is not JSON \(hello\)"):
        read_stream(b"data: hello\n\n", {"format": "sse", "delta": "t"})
