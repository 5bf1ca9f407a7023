"""An output the mapping or the stream could not read is an error for that case, never a 0
(issue 32 §1), and streams end the way real servers end them (issue 33 §3): real stand-in
services on 127.0.0.1, the real readers, real runs."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from ragexp.config.models import ResponseMapping, StreamConfig
from ragexp.providers.mapping import MappingError, compile_mapping
from ragexp.providers.streams import StreamReader
from ragexp.transport import BadReply, parse_json
from tests.conftest import write_jsonl
from tests.servers.procs import serve, stats
from tests.test_systems import SERVERS, count_runs, cut_then_resumed, inhouse_system, numbered, rows_of

RETRIEVAL = {"retrieved_ids"}


def mapping(**keys: Any) -> Any:
    return compile_mapping(ResponseMapping.model_validate(keys), "provider.system.response")


# --- a mapped reply ----------------------------------------------------------------------------


def test_an_expression_that_finds_nothing_is_an_error_naming_the_output_as_written() -> None:
    hits = mapping(answer="result.text", ranked_ids="result.hits[].doc", contexts="result.hits[].body")
    reply = {"result": {"text": "fact 3.", "documents": [{"doc": "seg-3", "body": "fact 3 lives here."}]}}
    with pytest.raises(MappingError) as caught:
        hits.extract(reply, 0.1, frozenset(RETRIEVAL))
    message = str(caught.value)
    # The output as the mapping names it, the expression, and what the reply held.
    assert message.startswith("ranked_ids: 'result.hits[].doc' found nothing in the reply (")
    assert '{"result": {"text": "fact 3.", "documents": [{"doc": "seg-3"' in message
    assert "retrieved_ids" not in message
    # null is nothing too; a present empty list is an empty ranking.
    with pytest.raises(MappingError, match=r"^ranked_ids: 'result.hits\[\].doc' found nothing"):
        hits.extract({"result": {"text": "x", "hits": None}}, 0.1, frozenset(RETRIEVAL))
    empty = hits.extract({"result": {"text": "无法回答", "hits": []}}, 0.1, frozenset(RETRIEVAL))
    assert (empty.ranked_ids, empty.contexts) == ([], [])


def test_items_that_lack_the_field_are_nothing_found_in_them() -> None:
    # A renamed field (LangChain documents whose id sits under metadata.source): JMESPath drops
    # the items silently, so the ranking would be shorter, or empty.
    langchain = mapping(answer="answer", ranked_ids="context[].[id || metadata.id][]")
    renamed = {"answer": "A", "context": [{"metadata": {"source": "a.md"}}, {"metadata": {"source": "b.md"}}]}
    with pytest.raises(MappingError, match=r"found nothing in 2 of the 2 items it read in the reply"):
        langchain.extract(renamed, 0.1)
    half = {"answer": "A", "context": [{"id": "d1"}, {"metadata": {"source": "b.md"}}]}
    with pytest.raises(MappingError, match=r"^ranked_ids: .* found nothing in 1 of the 2 items"):
        langchain.extract(half, 0.1)
    # Nested projections and filters: only the items the expression reads count.
    nested = mapping(ranked_ids="results[].chunks[].id")
    data = {"results": [{"chunks": [{"id": "a"}, {"id": "b"}]}, {"chunks": []}]}
    assert nested.extract(data, 0.1).ranked_ids == ["a", "b"]
    with pytest.raises(MappingError, match=r"found nothing in 1 of the 2 items"):
        nested.extract({"results": [{"chunks": [{"id": "a"}, {"name": "b"}]}]}, 0.1)
    with pytest.raises(MappingError, match=r"found nothing in 1 of the 2 items"):
        nested.extract({"results": [{"chunks": [{"id": "a"}]}, {"passages": []}]}, 0.1)
    kept = mapping(ranked_ids="hits[?keep].id")
    assert kept.extract({"hits": [{"keep": True, "id": "a"}, {"keep": False}]}, 0.1).ranked_ids == ["a"]
    with pytest.raises(MappingError, match=r"found nothing in 1 of the 1 items"):
        kept.extract({"hits": [{"keep": True, "doc": "a"}, {"keep": False}]}, 0.1)


def test_an_output_no_chosen_metric_reads_may_be_missing() -> None:
    mapped = mapping(answer="text", ranked_ids="hits[].doc", citations="cites")
    output = mapped.extract({"text": "A", "hits": [{"doc": "d1"}]}, 0.1, frozenset(RETRIEVAL))
    assert output.citations == [] and output.ranked_ids == ["d1"]
    with pytest.raises(MappingError, match=r"^citations: 'cites' found nothing"):
        mapped.extract({"text": "A", "hits": [{"doc": "d1"}]}, 0.1, frozenset({"retrieved_ids", "citations"}))


def test_ragexps_own_contract_refuses_a_missing_field_a_metric_reads() -> None:
    from ragexp.config.compose import compose
    from ragexp.providers.base import RunSettings, build_provider
    from ragexp.providers.http import ContractError
    from ragexp.transport import Reply

    config = compose(["system=http"])

    def provider(outputs: set[str]) -> Any:
        return build_provider(config.provider.system, RunSettings(5, 1, config.dataset, frozenset(outputs)))

    reply = Reply({"ranked_ids": ["a"], "answer": "A"}, 0.1)
    assert provider(RETRIEVAL).output(reply).citations == []
    with pytest.raises(ContractError, match=r"^'citations' is missing from the reply \(\{\"ranked_ids\""):
        provider({"retrieved_ids", "citations"}).output(reply)


INHOUSE_RENAMED = """\
# @package provider.system
kind: http
method: GET
url: {url}/search
headers_env: {{X-Api-Key: INHOUSE_KEY}}
request: {{q: "{{question}}", top: "{{k}}", lang: en}}
response:
  answer: result.text
  ranked_ids: "result.hits[].id"
  contexts: "result.hits[].body"
  citations: null
"""


@pytest.mark.system
def test_a_mapped_service_whose_expression_misses_is_an_error_not_a_zero(
    ragexp: Any, store_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("INHOUSE_KEY", "inhouse-standin")
    conf = tmp_path / "conf"
    (conf / "system").mkdir(parents=True)
    monkeypatch.setenv("RAGEXP_CONFIG_DIR", str(conf))
    data = write_jsonl(tmp_path / "cases.jsonl", numbered("what about 3?", "and 4?", "nothing here"))
    with serve(SERVERS / "inhouse.py") as url:
        # The service says "doc", the mapping "id": every hit lacks the field.
        (conf / "system/renamed.yaml").write_text(INHOUSE_RENAMED.format(url=url), encoding="utf-8")
        result = ragexp("run", "system=renamed", f"dataset.path={data}", "metrics=retrieval", "--json")
        probed = ragexp("validate", "system=renamed", f"dataset.path={data}", "metrics=retrieval", "--probe")
        probed_json = ragexp(
            "validate", "system=renamed", f"dataset.path={data}", "metrics=retrieval", "--probe", "--json"
        )
    assert result.code == 0, result.stderr
    payload = result.json()
    # Two answerable cases errored; the unanswerable one retrieved nothing, a legitimate empty list.
    assert payload["error_count"] == 2
    assert payload["summary"]["recall_at_k"] is None
    rows = rows_of(store_uri, payload["run_id"], tmp_path)
    assert rows["c1"]["error"].startswith(
        "contract: ranked_ids: 'result.hits[].id' found nothing in 2 of the 2 items it read in the reply ("
    )
    assert rows["c1"]["metrics"]["recall_at_k"] is None
    assert rows["c3"]["error"] is None and rows["c3"]["output"]["ranked_ids"] == []
    # The probe marks the output, and fails: the chosen metrics read it.
    assert probed.code == 1
    assert (
        "  ranked_ids ('result.hits[].id') -> []  <- found nothing: nothing in 2 of 2 items; "
        "needed by the chosen metrics"
    ) in probed.stdout
    report = probed_json.json()["probe"]
    assert report["missing"] == {
        "ranked_ids ('result.hits[].id')": "nothing in 2 of 2 items; needed by the chosen metrics"
    }
    assert report["error"].startswith("contract: ranked_ids: 'result.hits[].id' found nothing in 2 of the 2 items")


def test_the_probe_marks_an_output_no_chosen_metric_reads_and_passes(
    ragexp: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("INHOUSE_KEY", "inhouse-standin")
    conf = tmp_path / "conf"
    (conf / "system").mkdir(parents=True)
    monkeypatch.setenv("RAGEXP_CONFIG_DIR", str(conf))
    data = write_jsonl(tmp_path / "cases.jsonl", numbered("what about 3?"))
    with serve(SERVERS / "inhouse.py") as url:
        text = INHOUSE_RENAMED.format(url=url).replace('"result.hits[].id"', '"result.hits[].doc"')
        text = text.replace('contexts: "result.hits[].body"', 'contexts: "result.passages"')
        (conf / "system/mine.yaml").write_text(text, encoding="utf-8")
        probed = ragexp("validate", "system=mine", f"dataset.path={data}", "metrics=retrieval", "--probe", "--json")
    assert probed.code == 0, probed.stdout
    report = probed.json()["probe"]
    assert report["missing"] == {"contexts ('result.passages')": "no chosen metric reads it"}
    assert report["error"] is None and report["output"]["ranked_ids"] == ["seg-3", "seg-3-x"]


def test_an_output_declared_absent_refuses_the_metrics_that_need_it_before_the_run(
    ragexp: Any, store_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The one way: leave the key out or set it to null (here: a preset's, switched off).
    monkeypatch.setenv("RAGEXP_RAGFLOW_AUTH", "Bearer ragflow-standin")
    data = write_jsonl(tmp_path / "mine.jsonl", numbered("what about 1?"))
    args = ["system=ragflow", "provider.system.response.citation_pattern=null", f"dataset.path={data}"]
    run = ragexp("run", *args)
    validate = ragexp("validate", *args)
    expected = (
        "ragexp: error: metric 'citation_precision' needs output field 'citations', which provider ragflow+none "
        "does not give for every case of mine; metrics that fit: metrics=retrieval or "
        "metrics.names=[recall_at_k,mrr,ndcg_at_k,answer_accuracy,p95_seconds,error_rate]"
    )
    assert (run.code, validate.code) == (1, 1)
    assert run.stderr.strip().splitlines()[-1] == expected == validate.stderr.strip().splitlines()[-1]
    assert count_runs(store_uri) == 0


# --- a streamed reply --------------------------------------------------------------------------


def read(body: bytes, stream: dict[str, Any], content_type: str = "text/event-stream", **keys: Any) -> Any:
    reader = StreamReader(mapping(**keys), StreamConfig.model_validate(stream))
    response = httpx.Response(200, headers={"content-type": content_type}, content=body)
    return asyncio.run(reader.read(response, 100_000, 0.0))


SSE = {"format": "sse", "delta": "choices[0].delta.content"}
DELTA = b'data: {"object": "chat.completion.chunk", "choices": [{"delta": {"content": "%s"}}]}\n\n'


@pytest.mark.parametrize(
    ("body", "content_type", "arrived"),
    [
        (b": ping\n\n: ping\n\nevent: ping\n\n", "text/event-stream", "0 events, 2 comments, 1 keep-alive"),
        (b"data: [DONE]\n\n", "text/event-stream", "0 events, [DONE]"),
        (b"", "text/event-stream", "0 events"),
        (
            b'data: {"object": "chat.completion.chunk", "choices": [{"delta": {"role": "assistant"}}]}\n\n'
            b"data: [DONE]\n\n",
            "text/event-stream",
            "1 event (chat.completion.chunk 1), [DONE]",
        ),
        (
            b'{"choices": [{"delta": {"content": "hi"}}]}\n{"choices": [{"delta": {"content": "!"}}]}\n',
            "application/x-ndjson",
            "0 events, 2 lines that are not event-stream fields (is it ndjson? provider.system.stream.format=ndjson)",
        ),
    ],
)
def test_a_stream_with_no_answer_text_is_an_error_saying_what_arrived(
    body: bytes, content_type: str, arrived: str
) -> None:
    streamed = read(body, SSE, content_type)
    with pytest.raises(MappingError) as caught:
        streamed.output(0.1)
    assert str(caught.value) == f"answer: the stream ended with no answer text ({arrived})"


def test_one_json_body_where_a_stream_was_asked_for_is_read_as_that_reply() -> None:
    completion = (
        b'{"id": "c", "object": "chat.completion", "choices": [{"index": 0, "message": '
        b'{"role": "assistant", "content": "fact 8 is documented."}, "finish_reason": "stop"}]}'
    )
    # The same mapping as a whole reply: response.answer reads the completion's message.
    output = read(completion, SSE, "application/json", answer="choices[0].message.content").output(0.1)
    assert output.answer == "fact 8 is documented."
    # Without response.answer, the stream's delta finds no text in it: said, never an empty answer.
    with pytest.raises(MappingError, match=r"^answer: the reply ended with no answer text \(one JSON body\)$"):
        read(completion, SSE, "application/json").output(0.1)


def test_a_byte_order_mark_before_a_stream_or_a_reply_is_no_part_of_it() -> None:
    body = b"\xef\xbb\xbf" + DELTA % b"Hel" + DELTA % b"lo"
    assert read(body, SSE).output(0.1).answer == "Hello"  # the first event is kept
    ndjson = b'\xef\xbb\xbf{"t": "a"}\n{"t": "b"}\n'
    assert read(ndjson, {"format": "ndjson", "delta": "t"}, "application/x-ndjson").output(0.1).answer == "ab"
    assert parse_json(b'\xef\xbb\xbf{"answer": "x"}') == {"answer": "x"}


def test_done_without_the_closing_blank_line_ends_the_stream() -> None:
    for ending in (b"data: [DONE]\n", b"data: [DONE]", b"data: [DONE]\r\n"):
        assert read(DELTA % b"ok" + ending, SSE).output(0.1).answer == "ok"
    # An event with data cut before its blank line is still a cut stream.
    with pytest.raises(httpx.RemoteProtocolError):
        read(DELTA % b"ok" + b'data: {"choices": []}\n', SSE)


def test_an_ndjson_line_cut_in_the_middle_is_a_transport_failure() -> None:
    stream = {"format": "ndjson", "delta": "t"}
    with pytest.raises(httpx.RemoteProtocolError, match="ended in the middle of a line"):
        read(b'{"t": "a"}\n{"t": "b', stream, "application/x-ndjson")
    # A whole last line without its ending is complete; a broken line that was ended is not JSON.
    assert read(b'{"t": "a"}\n{"t": "b"}', stream, "application/x-ndjson").output(0.1).answer == "ab"
    with pytest.raises(BadReply, match=r"stream event 2 is not JSON"):
        read(b'{"t": "a"}\n{"t": "b\n', stream, "application/x-ndjson")


def test_a_refused_reply_shows_the_characters_that_made_it_fail() -> None:
    body = b'{"answer": "' + b"x" * 400 + b'", "ranked_ids": [\x00]}'
    with pytest.raises(BadReply) as caught:
        parse_json(body)
    message = str(caught.value)
    assert message.startswith("response is not JSON (at character 430: …")
    assert '"ranked_ids": [\\x00]}' in message  # the NUL, shown; the 400 x's, not all of them
    with pytest.raises(BadReply, match=r"^response is not JSON \(\\ufeff\{\}\)$"):
        parse_json("\ufeff\ufeff{}".encode())  # a second mark is data, shown as an escape
    with pytest.raises(BadReply, match=r"^response is empty$"):
        parse_json(b"")


# --- end to end: real services -------------------------------------------------------------------

OPENAI = [
    "system=openai_chat",
    "provider.system.request.model=standin-model",
    "metrics.names=[answer_accuracy,p95_seconds,error_rate]",
]


@pytest.mark.system
def test_a_streamed_service_that_sends_no_text_is_an_error_and_real_endings_are_read(
    ragexp: Any, store_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAGEXP_OPENAI_AUTH", "Bearer sk-standin")
    questions = ("what about 1?", "silent 2?", "doneonly 3?", "blocking 4?", "lastdone 5?", "bom 6?")
    data = write_jsonl(tmp_path / "cases.jsonl", numbered(*questions))
    silent = write_jsonl(tmp_path / "silent.jsonl", numbered("silent 1?"))
    with serve(SERVERS / "openai_chat.py") as url:
        args = [*OPENAI, f"provider.system.url={url}/v1/chat/completions"]
        result = ragexp("run", *args, f"dataset.path={data}", "--json")
        probed = ragexp("validate", *args, f"dataset.path={silent}", "--probe")
        attempts = stats(url)
    assert result.code == 0, result.stderr
    payload = result.json()
    rows = rows_of(store_uri, payload["run_id"], tmp_path)
    assert payload["error_count"] == 2 and payload["summary"]["error_rate"] == pytest.approx(2 / 6)
    assert rows["c2"]["error"] == (
        "contract: answer: the stream ended with no answer text (3 events (chat.completion.chunk 3), [DONE])"
    )
    assert rows["c3"]["error"] == "contract: answer: the stream ended with no answer text (0 events, [DONE])"
    assert set(rows["c2"]["metrics"].values()) == {None}  # never an empty answer scored 0
    # A gateway that ignored "stream": its one completion, read through the mapping.
    assert rows["c4"]["output"]["answer"] == "fact 4 is documented." and rows["c4"]["metrics"]["answer_accuracy"] == 1
    # [DONE] without its blank line, and a stream starting with a byte-order mark: complete.
    assert rows["c5"]["output"]["answer"] == "fact 5 is documented." and rows["c5"]["error"] is None
    assert rows["c6"]["output"]["answer"] == "fact 6 is documented."
    assert len(attempts["lastdone 5?"]) == 1  # complete, so not retried as a cut stream
    assert probed.code == 1
    assert "<- found nothing: needed by the chosen metrics" in probed.stdout
    assert "error: contract: answer: the stream ended with no answer text" in probed.stdout


@pytest.mark.system
def test_an_ndjson_stream_cut_mid_line_is_asked_again_by_resume(
    ragexp: Any, store_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, _, _ = cut_then_resumed(ragexp, store_uri, tmp_path, monkeypatch, "halfline 2?")
    # The body ended cleanly after half a line (a proxy closed it): a transport failure,
    # retried, then counted toward stopping the run, never a contract error kept for good.
    assert first.code == 1
    assert "connection failed (RemoteProtocolError: the stream ended in the middle of a line)" in first.stderr


def test_a_json_reply_after_a_byte_order_mark_is_read(
    ragexp: Any, store_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    rows = numbered("bom 3?")
    rows[0]["metadata"] = {"lang": "en"}
    data = write_jsonl(tmp_path / "cases.jsonl", rows)
    with inhouse_system(tmp_path, monkeypatch):
        result = ragexp("run", "system=inhouse", f"dataset.path={data}", "--json")
    assert result.code == 0, result.stderr
    assert rows_of(store_uri, result.json()["run_id"], tmp_path)["c1"]["output"]["answer"] == "fact 3 is documented."


def test_a_stream_whose_answer_is_white_space_only_is_an_error_not_an_answer() -> None:
    body = DELTA % b" " + DELTA % b"\\n" + DELTA % b"  "
    with pytest.raises(MappingError, match=r"^answer: the stream ended with white space only as its answer text"):
        read(body, SSE).output(0.1)
    # Blanks before real text stay part of the answer.
    assert read(DELTA % b" " + DELTA % b"Hi", SSE).output(0.1).answer == " Hi"


@pytest.mark.parametrize("kept", [5, 12])
def test_a_gzip_body_cut_in_transit_is_called_cut_not_empty(kept: int) -> None:
    import gzip

    from ragexp.transport import BadReply, read_capped

    whole = gzip.compress(b'{"answer": "fact 8", "ranked_ids": []}' * 20)

    def body(data: bytes) -> httpx.Response:
        return httpx.Response(200, headers={"content-encoding": "gzip"}, stream=httpx.ByteStream(data))

    with pytest.raises(BadReply, match=rf"^response is cut: {kept} bytes arrived as Content-Encoding gzip"):
        asyncio.run(read_capped(body(whole[:kept]), 1_000_000))
    assert asyncio.run(read_capped(body(whole), 1_000_000)).startswith(b'{"answer": "fact 8"')
