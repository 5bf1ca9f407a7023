"""A secret the config reads as a credential and also reaches through ``${oc.env:...}`` (a request
body key, a tag, the run's name) is masked in everything a run records; an experiment named with
it is refused in one line, before any run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from mlflow.tracking import MlflowClient

from tests.conftest import invoke, write_jsonl
from tests.servers.procs import FAULTY, serve
from tests.test_http import labelled

SECRET = "s3cr3t-env-7c1e"
ENV = "${oc.env:RAGEXP_SYSTEM_AUTH}"
AUTH = "+provider.system.headers_env.Authorization=RAGEXP_SYSTEM_AUTH"


def test_a_secret_reached_through_oc_env_is_masked_in_params_tags_name_and_artifacts(
    ragexp: Any, store_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAGEXP_SYSTEM_AUTH", f"Bearer {SECRET}")
    data = write_jsonl(tmp_path / "cases.jsonl", labelled(["ok-1", "ok-2"]))
    with serve(FAULTY, env={"FAULTY_TOKEN": SECRET}) as url:
        result = ragexp(
            "run",
            "provider=http",
            f"provider.system.url={url}",
            f"dataset.path={data}",
            AUTH,
            f'provider.system.request={{question: "{{question}}", k: "{{k}}", case_id: "{{case_id}}", key: "{ENV}"}}',
            f"+tags.owner={ENV}",
            f"run_name=nightly-{ENV}",
            "--json",
        )
    assert result.code == 0, result.stderr
    payload = result.json()
    assert payload["error_count"] == 0  # the body key and the header were sent in clear
    client = MlflowClient(store_uri)
    run = client.get_run(payload["run_id"])
    assert run.data.params["provider.system.request.key"] == "***"
    assert run.data.tags["owner"] == "***"
    assert run.info.run_name == "nightly-***"
    folder = Path(client.download_artifacts(payload["run_id"], "", str(tmp_path / "artifacts")))
    texts = [p.read_text(encoding="utf-8") for p in folder.rglob("*") if p.is_file()]
    assert any("key: '***'" in text for text in texts)  # config.yaml keeps the key, masked
    everything = [result.stdout, result.stderr, json.dumps(run.data.params), json.dumps(run.data.tags), *texts]
    everything.append(run.info.run_name)
    assert not any(SECRET in text for text in everything)


def test_an_experiment_named_with_a_secret_is_refused_in_one_line(
    no_store_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ragexp = invoke
    monkeypatch.setenv("RAGEXP_SYSTEM_AUTH", f"Bearer {SECRET}")
    data = write_jsonl(tmp_path / "cases.jsonl", labelled(["ok-1"]))
    result = ragexp(
        "run",
        "provider=http",
        "provider.system.url=http://127.0.0.1:9/query",
        f"dataset.path={data}",
        AUTH,
        f"experiment=team-{ENV}",
    )
    assert result.code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ragexp: error: experiment:"), result.stderr
    assert "secret" in lines[0] and SECRET not in result.stderr
    assert not Path(no_store_uri.removeprefix("sqlite:///")).exists()  # nothing was created
