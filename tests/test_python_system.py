"""system=python: the team's own pipeline called in-process, through the CLI and load_target.

The pipelines are in tests/pipelines: plain and async functions, a real langchain_core retrieval
chain with create_retrieval_chain's output shape, and a query engine returning LlamaIndex's
Response / NodeWithScore / TextNode shapes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from mlflow.tracking import MlflowClient

from ragexp import secrets
from ragexp.errors import ProviderError
from ragexp.providers.python import load_target
from tests.conftest import ROOT, write_jsonl
from tests.pipelines import plain
from tests.pipelines.corpus import CASES, DOCS, retrieve

OFFLINE = "metrics=offline"
RETRIEVAL = "metrics=retrieval"


@pytest.fixture
def cases(tmp_path: Path) -> Path:
    rows = [{**row, "metadata": {"tenant": f"t-{row['id']}"}} for row in CASES]
    return write_jsonl(tmp_path / "cases.jsonl", rows)


def run(ragexp: Any, cases: Path, *overrides: str) -> Any:
    return ragexp("run", f"dataset.path={cases}", "k=2", *overrides, "--json")


def rows_of(store_uri: str, run_id: str, tmp_path: Path) -> dict[str, dict[str, Any]]:
    path = MlflowClient(store_uri).download_artifacts(run_id, "cases.jsonl", str(tmp_path / run_id))
    return {row["id"]: row for row in map(json.loads, Path(path).read_text().splitlines())}


def expected_output(question: str, k: int = 2) -> dict[str, Any]:
    ranked = retrieve(question, k)
    return {"ranked_ids": ranked, "contexts": [DOCS[d] for d in ranked], "answer": DOCS[ranked[0]]}


# --- calling rules ----------------------------------------------------------------------------


def test_keyword_function_gets_every_case_value_and_its_output_is_recorded(
    ragexp: Any, store_uri: str, cases: Path, tmp_path: Path
) -> None:
    result = run(ragexp, cases, "system=python", "provider.system.target=tests.pipelines.plain:contract", OFFLINE)
    assert result.code == 0, result.stderr
    payload = result.json()
    assert payload["error_count"] == 0
    assert payload["summary"]["recall_at_k"] == 1.0 and payload["summary"]["answer_accuracy"] == 1.0
    for row in CASES:
        assert plain.CALLS[row["id"]] == {
            "question": row["question"],
            "k": 2,
            "case_id": row["id"],
            "metadata": {"tenant": f"t-{row['id']}"},
        }
    recorded = rows_of(store_uri, payload["run_id"], tmp_path)
    for row in CASES:
        output = recorded[row["id"]]["output"]
        want = expected_output(row["question"])
        assert output == {
            **want,
            "answer": want["answer"] + " [1]",
            "citations": [1],
            "timings": {"retrieve": 0.001},
        }
        assert recorded[row["id"]]["metrics"]["citation_precision"] == 1.0
    metrics = MlflowClient(store_uri).get_run(payload["run_id"]).data.metrics
    assert metrics["timing.retrieve.p50_seconds"] == pytest.approx(0.001)


def test_one_positional_parameter_gets_the_question_and_a_dataclass_is_mapped(
    ragexp: Any, store_uri: str, cases: Path, tmp_path: Path
) -> None:
    result = run(
        ragexp,
        cases,
        "system=python",
        "provider.system.target=tests.pipelines.plain:positional",
        "provider.system.response={answer: text, ranked_ids: 'hits[].doc_id', contexts: 'hits[].text'}",
        RETRIEVAL,
    )
    assert result.code == 0, result.stderr
    recorded = rows_of(store_uri, result.json()["run_id"], tmp_path)
    for row in CASES:
        assert plain.CALLS[row["question"]] == {"query": row["question"]}
        assert recorded[row["id"]]["output"] == {**expected_output(row["question"]), "citations": []}
        assert recorded[row["id"]]["metrics"]["recall_at_k"] == 1.0


def test_input_template_is_the_one_argument(ragexp: Any, store_uri: str, cases: Path, tmp_path: Path) -> None:
    result = run(
        ragexp,
        cases,
        "system=python",
        "provider.system.target=tests.pipelines.plain:templated",
        "provider.system.input={query: '{question}', case: '{case_id}', n: '{k}', who: 'tenant {tenant}'}",
        "provider.system.response={answer: result.text, ranked_ids: 'result.sources[].id', "
        "contexts: 'result.sources[].body'}",
        RETRIEVAL,
    )
    assert result.code == 0, result.stderr
    recorded = rows_of(store_uri, result.json()["run_id"], tmp_path)
    for row in CASES:
        payload = {"query": row["question"], "case": row["id"], "n": 2, "who": f"tenant t-{row['id']}"}
        assert plain.CALLS[row["id"]] == {"payload": payload}
        assert recorded[row["id"]]["output"] == {**expected_output(row["question"]), "citations": []}


def test_async_function_returning_a_pydantic_model(ragexp: Any, store_uri: str, cases: Path, tmp_path: Path) -> None:
    result = run(
        ragexp,
        cases,
        "system=python",
        "provider.system.target=tests.pipelines.plain:asynchronous",
        "provider.system.response={answer: answer, ranked_ids: ids, contexts: passages}",
        RETRIEVAL,
    )
    assert result.code == 0, result.stderr
    payload = result.json()
    assert payload["error_count"] == 0 and payload["summary"]["mrr"] == 1.0
    recorded = rows_of(store_uri, payload["run_id"], tmp_path)
    for row in CASES:
        assert recorded[row["id"]]["output"] == {**expected_output(row["question"]), "citations": []}
        assert recorded[row["id"]]["latency_seconds"] >= 0.01  # the call's own await is measured


def test_langchain_retrieval_chain_through_its_preset(ragexp: Any, store_uri: str, cases: Path, tmp_path: Path) -> None:
    from tests.pipelines.chains import chain

    direct = chain.invoke({"input": CASES[0]["question"]})
    assert set(direct) == {"input", "context", "answer"} and direct["context"][0].id == "d1"
    result = run(ragexp, cases, "system=langchain", "provider.system.target=tests.pipelines.chains:chain", RETRIEVAL)
    assert result.code == 0, result.stderr
    payload = result.json()
    assert payload["error_count"] == 0 and payload["summary"]["recall_at_k"] == 1.0
    recorded = rows_of(store_uri, payload["run_id"], tmp_path)
    for row in CASES:
        got = chain.invoke({"input": row["question"]})
        assert recorded[row["id"]]["output"] == {
            "ranked_ids": [doc.id for doc in got["context"]],
            "contexts": [doc.page_content for doc in got["context"]],
            "answer": got["answer"],
            "citations": [],
            "doc_ids": [doc.metadata["source"] for doc in got["context"]],  # the preset's documents
        }


def test_langchain_preset_reads_ids_from_metadata_when_documents_have_none(tmp_path: Path) -> None:
    from langchain_core.documents import Document

    from ragexp.config.compose import compose
    from ragexp.providers.expressions import to_plain
    from ragexp.providers.mapping import compile_mapping

    config = compose(["system=langchain", "provider.system.target=a:b"])
    mapping = compile_mapping(config.provider.system.response, "provider.system.response")  # type: ignore[union-attr,arg-type]
    reply = {"input": "q", "answer": "A", "context": [Document("x", metadata={"id": "m1"}), Document("y", id="i2")]}
    output = mapping.extract(to_plain(reply), 0.1)
    assert (output.ranked_ids, output.contexts, output.answer) == (["m1", "i2"], ["x", "y"], "A")


def test_llamaindex_query_engine_through_its_preset(ragexp: Any, store_uri: str, cases: Path, tmp_path: Path) -> None:
    from tests.pipelines.llama import NodeRelationship, engine

    result = run(
        ragexp, cases, "system=llamaindex", "provider.system.target=tests.pipelines.llama:engine.query", RETRIEVAL
    )
    assert result.code == 0, result.stderr
    recorded = rows_of(store_uri, result.json()["run_id"], tmp_path)
    for row in CASES:
        response = engine.query(row["question"])
        ranked = [hit.node.node_id for hit in response.source_nodes]
        assert recorded[row["id"]]["output"] == {
            "ranked_ids": ranked,
            "contexts": [hit.node.text for hit in response.source_nodes],
            "answer": response.response,
            "citations": [],
            # Each NodeWithScore's score, shown on the retrieval span.
            "stages": {"retrieve": {"ids": ranked, "scores": [hit.score for hit in response.source_nodes]}},
            "doc_ids": [hit.node.relationships[NodeRelationship.SOURCE].node_id for hit in response.source_nodes],
        }
        assert recorded[row["id"]]["metrics"]["recall_at_k"] == 1.0


# --- failures are per case --------------------------------------------------------------------


def test_an_exception_is_an_error_for_its_case_with_secrets_masked(
    ragexp: Any, store_uri: str, cases: Path, tmp_path: Path
) -> None:
    secrets.register("sk-live-0123456789")
    result = run(ragexp, cases, "system=python", "provider.system.target=tests.pipelines.plain:failing", RETRIEVAL)
    assert result.code == 0, result.stderr
    payload = result.json()
    assert payload["error_count"] == 1 and payload["summary"]["error_rate"] == pytest.approx(1 / 3)
    recorded = rows_of(store_uri, payload["run_id"], tmp_path)
    error = recorded["password"]["error"]
    assert error == "PermissionError: upstream refused token *** for how are passwords reset"
    assert recorded["password"]["metrics"]["recall_at_k"] is None  # missing, never 0
    assert recorded["refund"]["error"] is None and recorded["refund"]["metrics"]["recall_at_k"] == 1.0


def test_a_field_of_the_wrong_type_is_an_error_naming_field_and_expression(
    ragexp: Any, store_uri: str, cases: Path, tmp_path: Path
) -> None:
    result = run(ragexp, cases, "system=python", "provider.system.target=tests.pipelines.plain:wrong_type", RETRIEVAL)
    assert result.code == 1  # every case errored
    assert "ranked_ids: 'ranked_ids' gave a string, not a list of strings" in result.stderr


def test_a_slow_call_times_out_and_the_run_goes_on(ragexp: Any, store_uri: str, cases: Path, tmp_path: Path) -> None:
    result = run(
        ragexp,
        cases,
        "system=python",
        "provider.system.target=tests.pipelines.plain:slow",
        "provider.system.timeout_s=0.3",
        "concurrency=1",
        RETRIEVAL,
    )
    assert result.code == 0, result.stderr
    run_id = result.json()["run_id"]
    recorded = rows_of(store_uri, run_id, tmp_path)
    assert recorded["password"]["error"] == "timed out after 0.3 s (provider.system.timeout_s)"
    # One worker: the case after the stuck one ran on a fresh thread, not after the 3 s sleep.
    assert recorded["shipping"]["error"] is None
    assert MlflowClient(store_uri).get_run(run_id).data.metrics["evaluation_seconds"] < 2.5


@pytest.mark.system
@pytest.mark.parametrize(
    ("system", "target", "timeout"),
    [
        ("python", "tests.pipelines.plain:forever", 0.5),
        ("python", "tests.pipelines.plain:forever_async", 0.5),
        # The timeout bounds the import too: importing LangChain takes a few seconds on a busy machine.
        ("langchain", "tests.pipelines.chains:hanging", 8),
    ],
)
def test_a_call_that_never_returns_lets_the_process_exit(
    tmp_path: Path, cases: Path, system: str, target: str, timeout: float
) -> None:
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlruns/mlflow.db"}
    started = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "ragexp.cli.app",
            "run",
            f"system={system}",
            f"provider.system.target={target}",
            f"provider.system.timeout_s={timeout:g}",
            f"dataset.path={cases}",
            "k=2",
            RETRIEVAL,
            "--json",
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    elapsed = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    payload = json.loads(done.stdout)
    assert payload["error_count"] == 1 and payload["case_count"] == 3
    assert "Task was destroyed" not in done.stderr
    assert elapsed < 60  # start-up and logging; a hang would run into the 120 s timeout
    recorded = rows_of(env["MLFLOW_TRACKING_URI"], payload["run_id"], tmp_path)
    assert recorded["password"]["error"] == f"timed out after {timeout:g} s (provider.system.timeout_s)"


@pytest.mark.system
def test_an_async_target_that_blocks_its_loop_ends_the_run(
    ragexp: Any, store_uri: str, cases: Path, tmp_path: Path
) -> None:
    result = run(
        ragexp,
        cases,
        "system=python",
        "provider.system.target=tests.pipelines.plain:blocking_async",
        "provider.system.timeout_s=0.3",
        "concurrency=1",
        RETRIEVAL,
    )
    assert result.code == 0, result.stderr
    recorded = rows_of(store_uri, result.json()["run_id"], tmp_path)
    assert recorded["refund"]["error"] is None
    assert recorded["password"]["error"] == "timed out after 0.3 s (provider.system.timeout_s)"
    assert recorded["shipping"]["error"] == (
        "not evaluated: a call blocked the event loop (an async target that does not await, e.g. time.sleep)"
    )


# --- bad targets are refused before any run ---------------------------------------------------


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("tests.pipelines.plain", "provider.system.target: 'tests.pipelines.plain' is not package.module:attr"),
        ("tests.pipelines.nothere:answer", "provider.system.target: no module named 'tests.pipelines.nothere'"),
        ("tests.pipelines.plain:nothere", "provider.system.target: 'tests.pipelines.plain' has no attribute 'nothere'"),
        (
            "tests.pipelines.llama:engine.ask",
            "provider.system.target: 'tests.pipelines.llama.engine' has no attribute 'ask'",
        ),
        ("tests.pipelines.plain:NOT_CALLABLE", "'tests.pipelines.plain:NOT_CALLABLE' is dict, not a function"),
        (
            "tests.pipelines.llama:engine",
            "'tests.pipelines.llama:engine' is QueryEngine, not a function or an object with invoke/ainvoke "
            "(its query method: tests.pipelines.llama:engine.query)",
        ),
        (
            "tests.pipelines.plain:two_required",
            "provider.system.target: cannot call 'tests.pipelines.plain:two_required(question, top_n, mode)': "
            "it takes 'top_n', 'mode'",
        ),
    ],
)
def test_a_bad_target_is_one_line_before_any_run(
    ragexp: Any, store_uri: str, cases: Path, target: str, message: str
) -> None:
    result = run(ragexp, cases, "system=python", f"provider.system.target={target}", RETRIEVAL)
    assert result.code == 1
    line = result.stderr.strip()
    assert "\n" not in line and message in line, line
    client = MlflowClient(store_uri)
    assert client.search_runs([e.experiment_id for e in client.search_experiments()]) == []


def test_a_target_that_fails_to_import_names_the_error(tmp_path: Path) -> None:
    (tmp_path / "broken_pipeline_mod.py").write_text("import json\nraise RuntimeError('no index at /data')\n")
    with pytest.raises(ProviderError, match=r"importing 'broken_pipeline_mod' failed: RuntimeError: no index at /data"):
        load_target("broken_pipeline_mod:answer", str(tmp_path))


def test_a_missing_target_is_asked_for(ragexp: Any, cases: Path) -> None:
    result = run(ragexp, cases, "system=python", RETRIEVAL)
    assert result.code == 1
    assert (
        result.stderr.strip()
        == "ragexp: error: provider.system.target: required: the function or object to call, as package.module:attr"
    )


def test_input_template_needs_a_one_argument_callable() -> None:
    with pytest.raises(ProviderError, match=r"provider.system.input: is passed as one positional argument"):
        load_target("tests.pipelines.plain:failing", has_input=True)


def test_runnables_prefer_ainvoke_and_functions_are_classified() -> None:
    chain = load_target("tests.pipelines.chains:chain")
    assert chain.is_async and chain.positional and chain.function.__name__ == "ainvoke"
    contract = load_target("tests.pipelines.plain:contract")
    assert not contract.is_async and contract.keywords == ("question", "k", "case_id", "metadata")
    assert load_target("tests.pipelines.plain:asynchronous").is_async
    engine = load_target("tests.pipelines.llama:engine.query")
    assert engine.positional and engine.keywords == ()


# --- the config hash --------------------------------------------------------------------------


def test_config_hash_follows_the_target_file(ragexp: Any, cases: Path, tmp_path: Path) -> None:
    code = tmp_path / "code"
    code.mkdir()
    module = code / "hash_probe_pipeline.py"
    body = "def answer(question):\n    return {'answer': 'x', 'ranked_ids': ['d1'], 'contexts': ['t']}\n"
    module.write_text(body)
    args = (
        "system=python",
        "provider.system.target=hash_probe_pipeline:answer",
        f"provider.system.path={code}",
        RETRIEVAL,
    )
    first, again = run(ragexp, cases, *args), run(ragexp, cases, *args)
    assert first.code == again.code == 0, first.stderr
    module.write_text(body + "# a prompt changed\n")
    changed = run(ragexp, cases, *args)
    assert changed.code == 0, changed.stderr
    assert first.json()["config_hash"] == again.json()["config_hash"] != changed.json()["config_hash"]


def test_an_installed_package_is_identified_by_its_version() -> None:
    import importlib.metadata

    from ragexp.usercode.imports import source_identity

    target = load_target("langchain_core.runnables:RunnableLambda")
    assert source_identity(target.module) == f"langchain-core=={importlib.metadata.version('langchain-core')}"


# --- validate --probe -------------------------------------------------------------------------


def test_probe_shows_the_return_value_and_what_each_expression_read(ragexp: Any, cases: Path) -> None:
    result = ragexp(
        "validate",
        f"dataset.path={cases}",
        "system=langchain",
        "provider.system.target=tests.pipelines.chains:chain",
        RETRIEVAL,
        "--probe",
    )
    assert result.code == 0, result.stderr
    out = result.stdout
    assert "probe: case refund: call tests.pipelines.chains:chain" in out
    assert '  sent: {"args": [{"input": "when do refunds arrive"}], "kwargs": {}}' in out
    assert '  |    "page_content": "Refunds arrive within 3 business days.",' in out
    assert """  ranked_ids ('context[].[id || metadata.id][]') -> ["d1", "d2"]""" in out
    want = expected_output(CASES[0]["question"])
    shown = {**want, "citations": [], "doc_ids": ["faq", "faq"]}  # the preset reads metadata["source"]
    assert f"  output: {json.dumps(shown, ensure_ascii=False)}" in out


def test_probe_of_a_failing_target_exits_1_with_its_error(ragexp: Any, tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "first.jsonl", [CASES[1]])
    result = ragexp(
        "validate",
        f"dataset.path={data}",
        "system=python",
        "provider.system.target=tests.pipelines.plain:failing",
        "--probe",
    )
    assert result.code == 1
    assert "  error: PermissionError: upstream refused token" in result.stdout


@pytest.mark.system
@pytest.mark.skipif(not os.environ.get("RAGEXP_TEST_MLFLOW_SERVER"), reason="RAGEXP_TEST_MLFLOW_SERVER not set")
def test_on_the_tracking_server(ragexp: Any, cases: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """PostgreSQL enforces the column lengths SQLite ignores: a long error and a long template."""
    server = os.environ["RAGEXP_TEST_MLFLOW_SERVER"]
    monkeypatch.setenv("MLFLOW_TRACKING_URI", server)
    experiment = f"ragexp-test-python-{os.getpid()}-{tmp_path.name}"
    secrets.register("sk-live-0123456789")
    result = run(
        ragexp,
        cases,
        "system=python",
        "provider.system.target=tests.pipelines.plain:failing",
        f"provider.system.input={{query: '{{question}}', note: '{'x' * 7000}'}}",
        f"experiment={experiment}",
        RETRIEVAL,
    )
    assert result.code == 1 and "provider.system.input: is passed as one positional argument" in result.stderr
    result = run(
        ragexp,
        cases,
        "system=python",
        "provider.system.target=tests.pipelines.plain:templated",
        f"provider.system.input={{query: '{{question}}', case: '{{case_id}}', n: '{{k}}', note: '{'x' * 7000}'}}",
        "provider.system.response={answer: result.text, ranked_ids: 'result.sources[].id'}",
        f"experiment={experiment}",
        RETRIEVAL,
    )
    assert result.code == 0, result.stderr
    payload = result.json()
    assert payload["error_count"] == 0 and payload["summary"]["recall_at_k"] == 1.0
    recorded = rows_of(server, payload["run_id"], tmp_path)
    assert recorded["refund"]["output"]["ranked_ids"] == retrieve(CASES[0]["question"], 2)
    failed = run(
        ragexp,
        cases,
        "system=python",
        "provider.system.target=tests.pipelines.plain:failing",
        f"experiment={experiment}",
        RETRIEVAL,
    )
    assert failed.code == 0, failed.stderr
    rows = rows_of(server, failed.json()["run_id"], tmp_path)
    assert rows["password"]["error"] == "PermissionError: upstream refused token *** for how are passwords reset"
    long = run(
        ragexp,
        cases,
        "system=python",
        "provider.system.target=tests.pipelines.plain:long_failure",
        f"experiment={experiment}",
        RETRIEVAL,
    )
    assert long.code == 0, long.stderr
    rows = rows_of(server, long.json()["run_id"], tmp_path)
    assert rows["password"]["error"].startswith("ValueError: upstream said: yyy")
    assert rows["refund"]["error"] is None
