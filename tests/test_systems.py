"""Systems described in config: per-kind config models, request templates and response mappings,
HTTP services with their own contract (presets and generic mappings), streaming."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from pydantic import BaseModel

from ragexp.config.compose import compose
from ragexp.config.identity import identity_view
from ragexp.config.models import ResponseMapping
from ragexp.errors import ConfigError
from ragexp.providers.mapping import (
    MappingError,
    SystemReplyError,
    check_template,
    compile_mapping,
    render,
    to_plain,
)
from ragexp.records import Case


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
        "provider.system.request: unknown placeholder {lang}: not one of question, k, case_id "
        "and not a metadata field of case 'c2' (line 3)"
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
