"""Judge metrics through ragas against a deterministic OpenAI-compatible and TEI server of our
own on 127.0.0.1 (TLS with a CA made in the test). No network beyond loopback."""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from tests.conftest import ROOT, write_jsonl
from tests.servers.judge import embed
from tests.servers.procs import serve, stats

JUDGE = ROOT / "tests/servers/judge.py"
KEY = "judge-key-9c1e77"
SERVER = os.environ.get("RAGEXP_TEST_MLFLOW_SERVER")
needs_server = pytest.mark.skipif(not SERVER, reason="RAGEXP_TEST_MLFLOW_SERVER not set")

CASES = [
    {
        "id": "full",
        "question": "Who proposed relativity?",
        "relevant_ids": ["d1"],
        "expected_facts": ["Einstein"],
        "reference": "Albert Einstein proposed relativity.",
        "response": "Albert Einstein proposed relativity.",
        "retrieved_ids": ["d1"],
        "retrieved_contexts": ["Albert Einstein proposed the theory of relativity."],
        "citations": [1],
    },
    {
        "id": "half",
        "question": "Who proposed relativity?",
        "relevant_ids": ["d1"],
        "expected_facts": ["Einstein"],
        "reference": "Albert Einstein proposed relativity.",
        "response": "Einstein proposed relativity. He was born on planet Mars.",
        "retrieved_ids": ["d1"],
        "retrieved_contexts": ["Albert Einstein proposed the theory of relativity."],
        "citations": [1],
    },
    {
        "id": "broken",
        "question": "What did Curie study?",
        "relevant_ids": ["d2"],
        "expected_facts": ["radioactivity"],
        "reference": "Marie Curie studied radioactivity.",
        "response": "JUDGE-BROKEN radioactivity.",
        "retrieved_ids": ["d2"],
        "retrieved_contexts": ["Marie Curie studied radioactivity."],
        "citations": [1],
    },
    {
        "id": "nan",
        "question": "What did Curie study? JUDGE-NAN",
        "relevant_ids": ["d2"],
        "expected_facts": ["radioactivity"],
        "reference": "Marie Curie studied radioactivity.",
        "response": "Marie Curie studied radioactivity.",
        "retrieved_ids": ["d2"],
        "retrieved_contexts": ["Marie Curie studied radioactivity."],
        "citations": [1],
    },
]


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    from tests.tls import make_ca_and_server_cert

    return make_ca_and_server_cert(tmp_path_factory.mktemp("tls"))


def judge_args(url: str, ca: Path | None = None, *extra: str) -> list[str]:
    args = [
        "provider=replay_judge",
        f"provider.judge.base_url={url}",
        f"provider.judge.embeddings.url={url}",
        "provider.judge.api_key_env=RAGEXP_TEST_JUDGE_KEY",
        "provider.judge.max_retries=0",
    ]
    if ca is not None:
        args.append(f"provider.judge.ca_file={ca}")
    return [*args, *extra]


def cosine(a: str, b: str) -> float:
    x, y = np.array(embed(a)), np.array(embed(b))
    return float(x @ y / (np.linalg.norm(x) * np.linalg.norm(y)))


def rows_of(store_uri: str, run_id: str, tmp_path: Path) -> dict[str, dict[str, Any]]:
    path = MlflowClient(store_uri).download_artifacts(run_id, "cases.jsonl", str(tmp_path / run_id))
    return {row["id"]: row for row in map(json.loads, Path(path).read_text().splitlines())}


@pytest.mark.system
def test_judge_values_errors_cache_and_repeats(
    ragexp: Any, store_uri: str, tmp_path: Path, tls: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    ca, cert, key = tls
    monkeypatch.setenv("RAGEXP_TEST_JUDGE_KEY", KEY)
    data = write_jsonl(tmp_path / "cases.jsonl", CASES)
    metrics = "metrics.names=[faithfulness,answer_relevancy,answer_similarity,context_recall,nv_accuracy]"
    with serve(JUDGE, "--tls-cert", str(cert), "--tls-key", str(key), "--api-key", KEY) as url:
        base = [f"dataset.path={data}", metrics, *judge_args(url, ca)]
        first = ragexp("run", *base, "--json")
        assert first.code == 0, first.stderr
        calls = stats(url)
        second = ragexp("run", *base, "--json")
        after_rerun = stats(url)
        repeated = ragexp("run", *base, "provider.judge.repeats=3", "--json")
        after_repeats = stats(url)

    # --- values, computed independently from the judge's rules and its embedding function
    payload = first.json()
    rows = rows_of(store_uri, payload["run_id"], tmp_path)
    full, half = rows["full"]["metrics"], rows["half"]["metrics"]
    assert full["faithfulness"] == 1.0 and half["faithfulness"] == 0.5
    assert full["semantic_similarity"] == pytest.approx(1.0)
    assert half["semantic_similarity"] == pytest.approx(cosine(CASES[1]["reference"], CASES[1]["response"]))
    assert full["answer_relevancy"] == pytest.approx(cosine(CASES[0]["response"], CASES[0]["question"]))
    assert full["context_recall"] == 1.0 and full["nv_accuracy"] == 1.0

    # --- honest failure: the broken judge reply and the out-of-range rating are errors, not scores
    broken, nan = rows["broken"], rows["nan"]
    assert broken["metrics"]["faithfulness"] is None
    assert "judge output unusable" in broken["metric_errors"]["faithfulness"]
    assert broken["metrics"]["context_recall"] == 1.0  # the case's other metrics stand
    assert nan["metrics"]["nv_accuracy"] is None
    assert nan["metric_errors"]["nv_accuracy"] == "the judge gave no usable score (NaN)"
    assert payload["error_count"] == 2
    summary = payload["summary"]
    assert summary["faithfulness"] == pytest.approx((1.0 + 0.5 + 1.0) / 3)  # means leave errors out

    run = MlflowClient(store_uri).get_run(payload["run_id"])
    assert run.data.metrics["judge.chat_calls"] == calls["chat"] > 0
    assert run.data.metrics["judge.embedding_calls"] == calls["embeddings"] > 0
    assert run.data.metrics["judge.prompt_tokens"] > 0 and run.data.metrics["judge.completion_tokens"] > 0
    judge_tag = run.data.tags["ragexp.judge"]
    assert judge_tag.startswith("openai:judge-model|embeddings=openai:embed-model|language=english|prompts=")
    assert judge_tag.endswith("|ragas=0.4.3") and "127.0.0.1" not in judge_tag
    assert calls["json_mode"] == calls["chat"]

    # --- the rerun is served by the cache, except what failed (failures are never cached)
    rerun = second.json()
    assert rerun["summary"] == summary
    rerun_metrics = MlflowClient(store_uri).get_run(rerun["run_id"]).data.metrics
    # A cached grade is used once the run has heard from each server that made it; the grades
    # asked again all failed, so one grade by the chat model and one using the embeddings are
    # asked afresh first.
    assert after_rerun["embeddings"] - calls["embeddings"] == rerun_metrics["judge.embedding_calls"] > 0
    # 20 case-metric pairs; the broken reply failed 3 of them (every prompt quoting the response), NaN 1.
    assert rerun_metrics["judge.cache_hits"] == 4 * 5 - 4 - 2
    assert rerun_metrics["judge.cache_refused"] == 0
    assert after_rerun["chat"] - calls["chat"] == rerun_metrics["judge.chat_calls"] > 0  # the two failures

    # --- repeats: repeat 0 comes from the cache, repeats 1 and 2 are new calls; spread is measured
    repeated_run = MlflowClient(store_uri).get_run(repeated.json()["run_id"])
    assert repeated_run.data.metrics["judge.cache_hits"] == 16
    assert after_repeats["embeddings"] > after_rerun["embeddings"]
    assert repeated_run.data.metrics["judge_spread.faithfulness"] == 0.0  # a deterministic judge
    assert repeated.json()["summary"]["faithfulness"] == pytest.approx(summary["faithfulness"])
    rows = rows_of(store_uri, repeated.json()["run_id"], tmp_path)
    assert rows["half"]["spread"]["faithfulness"] == 0.0
    assert rows["broken"]["metric_errors"]["faithfulness"].startswith("repeat ")
    assert repeated.json()["config_hash"] != payload["config_hash"]

    # --- the key never reaches the store
    everything = json.dumps([run.data.params, run.data.tags]) + first.stdout + first.stderr
    folder = Path(MlflowClient(store_uri).download_artifacts(payload["run_id"], "", str(tmp_path / "all")))
    everything += "".join(p.read_text(encoding="utf-8") for p in folder.rglob("*") if p.is_file())
    assert KEY not in everything


@pytest.mark.system
@pytest.mark.parametrize("where", ["sqlite", pytest.param("server", marks=needs_server)])
def test_a_rerun_served_by_the_cache_keeps_a_case_with_unusable_judge_output_as_that_case_error(
    store_uri: str, tmp_path: Path, where: str
) -> None:
    # Two `ragexp run` processes in a row sharing one state dir: beside the SQLite store, or the
    # user's cache folder for a tracking server (a fresh XDG_CACHE_HOME here). The rerun has
    # only the broken case left to judge (failures are never cached): the judge answers it with
    # something that is not JSON, which is that case's error, as on the first run.
    uri = SERVER if where == "server" and SERVER else store_uri
    data = write_jsonl(tmp_path / "cases.jsonl", CASES)
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache"), "RAGEXP_TEST_JUDGE_KEY": KEY}
    experiment = f"ragexp-test-judge-rerun-{os.getpid()}-{tmp_path.name}"

    def run(url: str) -> subprocess.CompletedProcess[str]:
        args = [f"dataset.path={data}", "metrics.names=[faithfulness,recall_at_k]", *judge_args(url)]
        args += [f"tracking.uri={uri}", f"experiment={experiment}", "--json"]
        command = [sys.executable, "-m", "ragexp.cli.app", "run", *args]
        return subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)

    with serve(JUDGE, "--api-key", KEY) as url:
        first = run(url)
        calls = stats(url)
        second = run(url)
        after = stats(url)
    assert first.returncode == 0, first.stderr
    assert second.returncode == 0, second.stderr  # it used to stop: "the judge failed 1 calls in a row"
    one, two = json.loads(first.stdout), json.loads(second.stdout)
    assert one["error_count"] == two["error_count"] == 1
    assert (
        one["summary"] == two["summary"] == {"faithfulness": pytest.approx((1.0 + 0.5 + 1.0) / 3), "recall_at_k": 1.0}
    )
    client = MlflowClient(uri)
    rerun = client.get_run(two["run_id"])
    assert rerun.info.status == "FINISHED"
    # Broken is asked again (one call and its re-ask); its failure says nothing of who serves the
    # judge, so full's cached grade is made afresh (two calls) before half's and nan's are used.
    assert rerun.data.metrics["judge.cache_hits"] == 2
    assert after["chat"] - calls["chat"] == rerun.data.metrics["judge.chat_calls"] == 2 + 2
    for run_id in (one["run_id"], two["run_id"]):
        rows = rows_of(uri, run_id, tmp_path)
        assert rows["broken"]["metrics"]["faithfulness"] is None
        assert rows["broken"]["metric_errors"]["faithfulness"].startswith("judge output unusable: ")
        assert "StatementGeneratorOutput (Invalid JSON" in rows["broken"]["metric_errors"]["faithfulness"]
        assert rows["half"]["metrics"]["faithfulness"] == 0.5


@pytest.mark.system
def test_mindie_kind_tei_embeddings_and_chinese_prompts(ragexp: Any, store_uri: str, tmp_path: Path, tls: Any) -> None:
    ca, cert, key = tls
    prompts = tmp_path / "prompts"
    with serve(JUDGE, "--tls-cert", str(cert), "--tls-key", str(key)) as url:
        base = [
            "provider=npu",
            "system=replay",  # the recorded outputs of the dataset (provider=npu alone: the sample system)
            "dataset=scifacts_columns",
            "metrics=core",
            f"provider.judge.base_url={url}",
            f"provider.judge.embeddings.url={url.removesuffix('/v1')}",
            f"provider.judge.ca_file={ca}",
            f"provider.judge.prompts_path={prompts}",
        ]
        first = ragexp("run", *base, "--json")
        adapted = stats(url)
        second = ragexp("run", *base, "provider.judge.cache=false", "--json")
        after = stats(url)
        noise = ragexp("run", *base, "metrics.names=[noise_sensitivity,faithfulness]", "--json")
        noise_again = ragexp("run", *base, "metrics.names=[noise_sensitivity,faithfulness]", "--json")
    assert first.code == 0, first.stderr
    assert first.json()["case_count"] == 3 and first.json()["error_count"] == 0
    assert adapted["translate"] > 0 and adapted["tei"] > 0 and adapted["embeddings"] == 0
    assert adapted["json_mode"] == 0  # MindIE gets no response_format
    saved = list(prompts.glob("chinese/judge-model/*.json"))
    assert {p.name.split("-")[0] for p in saved} >= {"faithfulness", "context_precision", "context_recall"}
    assert any("〔中文〕" in p.read_text(encoding="utf-8") for p in saved)
    tag = MlflowClient(store_uri).get_run(first.json()["run_id"]).data.tags["ragexp.judge"]
    assert tag.startswith("mindie:judge-model|embeddings=tei:bge-large-zh|language=chinese|prompts=")
    # Reused on the next run: no translation call, though the cache is off and every metric calls the judge.
    assert second.code == 0 and after["translate"] == adapted["translate"] and after["chat"] > adapted["chat"]
    assert second.json()["summary"] == first.json()["summary"]
    # NoiseSensitivity's prompts cannot be adapted: said once, clearly, and the run goes on.
    assert noise.code == 0, noise.stderr
    warning = [line for line in noise.stderr.splitlines() if "noise_sensitivity" in line]
    assert len(warning) == 1 and "cannot adapt its prompts to chinese" in warning[0]
    assert "English prompts are used" in warning[0]
    assert noise_again.code == 0 and "cannot adapt" in noise_again.stderr  # remembered, still said


@pytest.mark.system
def test_half_written_prompt_files_in_the_state_dir_are_made_again(ragexp: Any, tmp_path: Path) -> None:
    # The state dir is shared by all of a user's runs (any store but SQLite): a prompts file
    # left half-written (a process killed mid-write) is made again, never a crash.
    prompts = tmp_path / "prompts"
    with serve(JUDGE) as url:
        base = [
            "provider=npu",
            "dataset=scifacts_columns",
            "metrics.names=[faithfulness,context_recall]",
            f"provider.judge.base_url={url}",
            f"provider.judge.embeddings.url={url.removesuffix('/v1')}",
            f"provider.judge.prompts_path={prompts}",
            "provider.judge.cache=false",
            "--json",
        ]
        first = ragexp("run", *base)
        translated = stats(url)["translate"]
        files = sorted(prompts.rglob("*.json"))
        whole = {path: path.read_text(encoding="utf-8") for path in files}
        for path, text in whole.items():
            path.write_text(text[: len(text) // 2], encoding="utf-8")
        second = ragexp("run", *base)
        after = stats(url)["translate"]
    assert first.code == 0, first.stderr
    assert second.code == 0, second.stderr
    assert {path.name.split("-")[0] for path in files} == {"source", "faithfulness", "context_recall"}
    assert after == 2 * translated > 0  # adapted again, exactly as the first time
    assert second.json()["summary"] == first.json()["summary"]
    assert {path: path.read_text(encoding="utf-8") for path in files} == whole
    assert sorted(path for path in prompts.rglob("*") if path.is_file()) == files  # no temporary left


@pytest.mark.system  # a whole run: `make test`, not the edit loop
def test_requirements_and_limits_refused_before_any_call(
    ragexp: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAGEXP_TEST_JUDGE_KEY", KEY)
    no_reference = write_jsonl(
        tmp_path / "noref.jsonl", [{k: v for k, v in c.items() if k != "reference"} for c in CASES[:2]]
    )
    with serve(JUDGE) as url:
        missing = ragexp("run", f"dataset.path={no_reference}", "metrics=core", *judge_args(url))
        no_judge = ragexp("run", "metrics=core", "dataset=scifacts_zh", "provider=replay")
        repeated = ragexp("run", "dataset=scifacts_zh", "metrics.names=[faithfulness,faithfulness]", *judge_args(url))
        unset = ragexp(
            "run",
            "dataset=scifacts_zh",
            "metrics=core",
            *judge_args(url),
            "provider.judge.api_key_env=RAGEXP_UNSET_VARIABLE",
        )
        calls = stats(url)
    assert missing.code == 1 and "metric 'context_precision' needs field 'reference'" in missing.stderr
    assert no_judge.code == 1 and "needs an LLM judge" in no_judge.stderr
    assert repeated.code == 1 and "'faithfulness' repeats 'faithfulness'" in repeated.stderr
    assert unset.code == 1 and "environment variable RAGEXP_UNSET_VARIABLE is not set" in unset.stderr
    assert calls["chat"] == 0 and calls["embeddings"] == 0


def test_a_judge_that_fails_everything_stops_the_run(
    ragexp: Any, store_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAGEXP_TEST_JUDGE_KEY", KEY)
    with serve(JUDGE, "--fail-all") as url:
        result = ragexp("run", "dataset=scifacts_zh", "metrics=core", *judge_args(url))
    assert result.code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "the judge failed 8 calls in a row from the start: HTTP 503" in lines[0]
    client = MlflowClient(store_uri)
    run = client.search_runs([client.get_experiment_by_name("ragexp").experiment_id])[0]
    assert run.info.status == "FAILED" and run.data.tags["ragexp.status"] == "aborted"


def test_unreachable_judge_is_refused_before_the_run(ragexp: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAGEXP_TEST_JUDGE_KEY", KEY)
    with serve(JUDGE) as url:
        pass
    result = ragexp("run", "dataset=scifacts_zh", "metrics=core", *judge_args(url))
    assert result.code == 1 and "provider.judge.base_url: cannot connect to 127.0.0.1" in result.stderr


def test_embedding_vectors_are_unit_length() -> None:
    assert math.isclose(float(np.linalg.norm(embed("任意文本 any text"))), 1.0)
    assert os.path.exists(JUDGE)


@pytest.mark.system
def test_the_mission_command_judges_the_sample_system_with_mindie_and_tei(
    ragexp: Any, store_uri: str, tmp_path: Path, tls: Any
) -> None:
    """``ragexp run provider=npu metrics=core`` as the README types it, on the default dataset:
    the bundled sample system answers, MindIE (chat) and TEI (embeddings) judge, over TLS."""
    ca, cert, key = tls
    with serve(JUDGE, "--tls-cert", str(cert), "--tls-key", str(key)) as url:
        result = ragexp(
            "run",
            "provider=npu",
            "metrics=core",
            f"provider.judge.base_url={url}",
            f"provider.judge.embeddings.url={url.removesuffix('/v1')}",
            f"provider.judge.ca_file={ca}",
            f"provider.judge.prompts_path={tmp_path / 'prompts'}",
            "--json",
        )
        calls = stats(url)
    assert result.code == 0, result.stderr
    out = result.json()
    rows = rows_of(store_uri, out["run_id"], tmp_path)
    # Where the sample system refused with no context, the judge metrics that read the contexts
    # are errors for that case (counted, never 0); every other case is judged.
    refused = {case_id for case_id, row in rows.items() if not row["output"]["contexts"]}
    assert out["case_count"] == 35 and out["error_count"] == len(refused) and 0 < len(refused) < 10
    for case_id in refused:
        assert "faithfulness: retrieved_contexts is empty" in rows[case_id]["error"]
    assert all(row["error"] is None for case_id, row in rows.items() if case_id not in refused)
    assert set(out["summary"]) == {"faithfulness", "answer_relevancy", "context_precision", "context_recall"}
    assert all(0.0 <= value <= 1.0 for value in out["summary"].values())
    assert calls["tei"] > 0 and calls["embeddings"] == 0 and calls["chat"] > 0
    run = MlflowClient(store_uri).get_run(out["run_id"])
    assert run.data.tags["ragexp.provider"] == "npu" and run.data.tags["ragexp.dataset"] == "kb_zh"
    assert run.data.tags["ragexp.judge"].startswith("mindie:judge-model|embeddings=tei:bge-large-zh|language=chinese|")
    assert run.data.params["provider.system.kind"] == "sample"
    answers = [row["output"]["answer"] for row in rows.values()]
    assert len(answers) == 35 and all(isinstance(answer, str) and answer for answer in answers)


def test_the_mission_command_without_a_judge_stops_before_evaluating(ragexp: Any, store_uri: str) -> None:
    with socket.socket() as probe:  # a port nothing listens on once this closes
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"https://127.0.0.1:{port}/v1"
    result = ragexp("run", "provider=npu", "metrics=core", f"provider.judge.base_url={url}")
    assert result.code == 1
    assert result.stderr.strip().splitlines() == [
        f"ragexp: error: provider.judge.base_url: cannot connect to 127.0.0.1:{port} (Connection refused) at {url}; "
        "is the service running?"
    ]
    experiment = MlflowClient(store_uri).get_experiment_by_name("ragexp")
    assert experiment is None or not MlflowClient(store_uri).search_runs([experiment.experiment_id])
