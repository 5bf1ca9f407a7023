"""What services send and how users set them up (issue 33 §1 and §5): every httpx exception
classified, undecodable replies as case errors, a 4xx with the server's reason, error streams
read alike by the probe and the run, "no auth" for every preset, and validate checking what run
checks. Real stand-in services on 127.0.0.1 (tests/servers/)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from ragexp.config.compose import compose
from ragexp.paths import package_conf
from ragexp.transport import HTTPX_ERRORS, classify, server_reason
from tests.conftest import write_jsonl
from tests.servers.procs import FAULTY, serve, stats
from tests.test_systems import SERVERS, SOME, count_runs, numbered, rows_of


def every_httpx_exception() -> list[type[BaseException]]:
    found: list[type[BaseException]] = []
    todo: list[type[BaseException]] = list(HTTPX_ERRORS)
    while todo:
        kind = todo.pop()
        found.append(kind)
        todo.extend(kind.__subclasses__())
    return found


def test_every_httpx_exception_is_classified() -> None:
    exported = {value for value in vars(httpx).values() if isinstance(value, type) and issubclass(value, Exception)}
    assert exported <= set(every_httpx_exception())  # the four roots hold every exception httpx exports
    for kind in every_httpx_exception():
        exc = kind.__new__(kind)
        Exception.__init__(exc, "boom")
        failed = classify(exc)
        assert failed is not None, kind
        # The network and the connection: retried, counted, resumed. Anything else: the case's error.
        assert failed.transport == issubclass(kind, httpx.TransportError), kind
    assert classify(ValueError("not httpx")) is None


def faulty_cases(tmp_path: Path, *ids: str) -> Path:
    return write_jsonl(
        tmp_path / "cases.jsonl",
        [{"id": i, "question": f"q {i}?", "relevant_ids": [f"rel-{i.split('-')[1]}"]} for i in ids],
    )


def test_a_reply_that_cannot_be_decoded_is_that_cases_error(ragexp: Any, store_uri: str, tmp_path: Path) -> None:
    data = faulty_cases(tmp_path, "badgzip-1", "ok-2")
    with serve(FAULTY) as url:
        args = ["provider=http", f"provider.system.url={url}", f"dataset.path={data}", "metrics=retrieval"]
        result = ragexp("run", *args, "--json")
        probed = ragexp("validate", *args, "--probe")
        attempts = stats(url)
    assert result.code == 0, result.stderr
    payload = result.json()
    assert payload["error_count"] == 1
    rows = rows_of(store_uri, payload["run_id"], tmp_path)
    assert rows["badgzip-1"]["error"].startswith("contract: the reply could not be decoded (DecodingError: ")
    assert rows["ok-2"]["metrics"]["recall_at_k"] == 1.0
    assert len(attempts["badgzip-1"]) == 2  # the run once (not retried), the probe once
    assert probed.code == 1 and "Traceback" not in probed.stderr
    assert "  error: contract: the reply could not be decoded (DecodingError: " in probed.stdout


def test_a_4xx_shows_the_servers_reason_masked(
    ragexp: Any, store_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAULTY_TOKEN", "sk-faulty-0123456789")
    monkeypatch.setenv("RAGEXP_SYSTEM_AUTH", "Bearer sk-faulty-0123456789")
    data = faulty_cases(tmp_path, "deny-1", "ok-2")
    env = {**os.environ}
    with serve(FAULTY, env=env) as url:
        result = ragexp(
            "run", "provider=http", f"provider.system.url={url}", f"dataset.path={data}", "metrics=retrieval",
            "+provider.system.headers_env={Authorization: RAGEXP_SYSTEM_AUTH}", "--json",
        )  # fmt: skip
    assert result.code == 0, result.stderr
    rows = rows_of(store_uri, result.json()["run_id"], tmp_path)
    assert rows["deny-1"]["error"] == "HTTP 403 (not retried): key *** may not read this index"
    assert "sk-faulty" not in result.stdout + result.stderr


def test_a_servers_reason_is_one_line_of_at_most_200_characters() -> None:
    assert server_reason(b'{"error": {"message": "The model `x` does not exist.", "type": "invalid"}}') == (
        ": The model `x` does not exist."
    )
    assert server_reason(b'{"detail": [{"loc": ["body", "q"], "msg": "field required"}]}') == ": field required"
    assert server_reason(b"<html><title>502 Bad Gateway</title><body><h1>502 Bad Gateway</h1></body></html>") == (
        ": 502 Bad Gateway 502 Bad Gateway"
    )
    long = server_reason(("reason \x1b[31m" + "x" * 500).encode())
    assert long == ": reason \\x1b[31m" + "x" * (200 - len("reason \x1b[31m")) + "…"
    assert server_reason(b"") == server_reason(b"  \n") == ""


def test_the_probe_reads_an_error_stream_as_the_run_does(
    ragexp: Any, store_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Dify streams its error event, then the connection drops without ending the body.
    monkeypatch.setenv("RAGEXP_DIFY_AUTH", "Bearer app-standin")
    data = write_jsonl(tmp_path / "cases.jsonl", numbered("quotacut 3?"))
    with serve(SERVERS / "dify.py") as url:
        args = ["system=dify", f"provider.system.url={url}/v1/chat-messages", f"dataset.path={data}", SOME]
        run = ragexp("run", *args, "--json")
        probe = ragexp("validate", *args, "--probe", "--json")
    assert run.code == 1  # its one case errored
    (row,) = rows_of(store_uri, next(iter(store_runs(store_uri))), tmp_path).values()
    assert row["error"] == "service error: Your quota of provider has been exceeded."
    assert probe.code == 1
    report = probe.json()["probe"]
    assert report["error"] == row["error"]
    assert report["raw"].startswith('data: {"event": "message"') and '"event": "error"' in report["raw"]


def store_runs(store_uri: str) -> list[str]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(store_uri)
    return [run.info.run_id for run in client.search_runs([client.get_experiment_by_name("ragexp").experiment_id])]


def http_presets() -> list[str]:
    names = []
    for path in sorted((package_conf() / "system").glob("*.yaml")):
        if (yaml.safe_load(path.read_text(encoding="utf-8")) or {}).get("kind") == "http":
            names.append(path.stem)
    return names


@pytest.mark.parametrize("preset", http_presets())
def test_headers_env_empty_sends_no_key_for_every_preset(preset: str) -> None:
    system = compose([f"system={preset}", "provider.system.headers_env={}"]).provider.system
    assert system.headers_env == {}  # type: ignore[union-attr]
    # A key set after it is the only one; other overrides leave it empty.
    kept = compose(
        [f"system={preset}", "provider.system.headers_env={}", "+provider.system.headers_env.X-Api-Key=MY_KEY"]
    ).provider.system
    assert kept.headers_env == {"X-Api-Key": "MY_KEY"}  # type: ignore[union-attr]


STANDINS = {
    "dify": ("dify.py", "/v1/chat-messages", []),
    "ragflow": ("ragflow.py", "/api/v1/chats/standin/completions", []),
    "openai_chat": ("openai_chat.py", "/v1/chat/completions", ["provider.system.request.model=standin-model"]),
}


@pytest.mark.parametrize("preset", sorted(STANDINS))
def test_a_service_without_auth_is_asked_without_a_key(
    ragexp: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, preset: str
) -> None:
    with_keys = {name for name in http_presets() if compose([f"system={name}"]).provider.system.headers_env}  # type: ignore[union-attr]
    assert set(STANDINS) == with_keys  # every preset that sends a key has its stand-in here
    for variable in ("RAGEXP_DIFY_AUTH", "RAGEXP_RAGFLOW_AUTH", "RAGEXP_OPENAI_AUTH"):
        monkeypatch.delenv(variable, raising=False)
    script, path, extra = STANDINS[preset]
    data = write_jsonl(tmp_path / "cases.jsonl", numbered("what about 2?"))
    # The stand-in refuses any request that carries an Authorization header.
    with serve(SERVERS / script, env={**os.environ, "STANDIN_NO_AUTH": "1"}) as url:
        args = [f"system={preset}", f"provider.system.url={url}{path}", f"dataset.path={data}", *extra]
        args.append("metrics.names=[answer_accuracy]")
        asked = ragexp("validate", *args, "provider.system.headers_env={}", "--probe")
        refused = ragexp("validate", *args)
    assert asked.code == 0, asked.stdout + asked.stderr
    assert "fact 2 is documented" in asked.stdout
    assert refused.code == 1 and "is not set" in refused.stderr  # without the override, the preset's key


def test_validate_refuses_what_run_refuses_before_any_work(
    ragexp: Any, store_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAGEXP_DIFY_AUTH", "Bearer app-standin")
    data = write_jsonl(tmp_path / "mine.jsonl", numbered("what about 1?"))
    base = ["system=dify", "provider.system.url=http://127.0.0.1:9/v1/chat-messages", f"dataset.path={data}"]
    for extra, message in [
        (
            ["provider.system.response.ranked_ids='metadata.[retriever'", SOME],
            "ragexp: error: provider.system.response.ranked_ids: not a JMESPath expression",
        ),
        (
            [],
            "ragexp: error: metric 'citation_precision' needs output field 'citations', which provider dify+none "
            "does not give for every case of mine; metrics that fit: metrics=retrieval or",
        ),
        (
            ["metrics=core"],
            "ragexp: error: metric 'faithfulness' needs an LLM judge, and provider dify+none has none",
        ),
    ]:
        validated = ragexp("validate", *base, *extra)
        run = ragexp("run", *base, *extra)
        assert validated.code == run.code == 1, extra
        assert validated.stderr.strip().splitlines()[-1].startswith(message), validated.stderr
        assert validated.stderr.strip().splitlines()[-1] == run.stderr.strip().splitlines()[-1]
    assert count_runs(store_uri) == 0
    # Where run would start, validate says ok (without --probe, nothing is asked of the service).
    fits = ragexp("validate", *base, "metrics=retrieval")
    assert fits.code == 0 and fits.stdout.startswith("ok: ")
