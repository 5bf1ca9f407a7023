"""Tokens and cost: the system's usage as OpenAI-compatible and Dify replies report it, the
judge's, the ``cost`` metric a price table gives, and cost diffed, gated and reported."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from mlflow.tracking import MlflowClient

from tests.conftest import ROOT, write_jsonl
from tests.servers.procs import preset_standin, serve
from tests.servers.streaming import knowledge

SERVERS = ROOT / "tests/servers"
JUDGE_KEY = "judge-key-cost"
QUESTIONS = ["what about 1?", "and 2?", "tell me of 3?", "a very long 4?"]
OPENAI = ["system=openai_chat", "provider.system.request.model=standin-model"]
ANSWER_ONLY = "metrics.names=[answer_accuracy,p95_seconds,error_rate]"


def cases(*questions: str) -> list[dict[str, Any]]:
    return [
        {
            "id": f"c{i}",
            "question": q,
            "relevant_ids": [f"seg-{q.rstrip('?').split()[-1]}"],
            "expected_facts": [f"fact {q.rstrip('?').split()[-1]}"],
        }
        for i, q in enumerate(questions, start=1)
    ]


def metrics_of(store_uri: str, run_id: str) -> dict[str, float]:
    return dict(MlflowClient(store_uri).get_run(run_id).data.metrics)


def rows_of(store_uri: str, run_id: str, tmp_path: Path) -> dict[str, dict[str, Any]]:
    path = MlflowClient(store_uri).download_artifacts(run_id, "cases.jsonl", str(tmp_path / f"rows-{run_id}"))
    return {row["id"]: row for row in map(json.loads, Path(path).read_text().splitlines())}


def openai_usage(question: str) -> tuple[int, int]:
    """What the stand-in reports (its docstring): 20 + len(question) // 4, len(answer) // 4 + 1."""
    answer, _ = knowledge(question)
    return 20 + len(question) // 4, len(answer) // 4 + 1


@pytest.fixture
def openai_url(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("RAGEXP_OPENAI_AUTH", "Bearer sk-standin")
    with serve(SERVERS / "openai_chat.py") as url:
        yield f"{url}/v1/chat/completions"


def test_openai_usage_gives_tokens_and_priced_cost(
    ragexp: Any, store_uri: str, tmp_path: Path, openai_url: str
) -> None:
    # A streamed reply (the preset asks for usage in the last event) and one a gateway answers
    # whole ("blocking"); the "long" case is an error and reports nothing.
    questions = ["what about 1?", "blocking and 2?", "a very long 3?"]
    data = write_jsonl(tmp_path / "cases.jsonl", cases(*questions))
    prices = "cost.prices={system: {prompt: 2.5, completion: 10}}"
    base = [*OPENAI, f"provider.system.url={openai_url}", f"dataset.path={data}", ANSWER_ONLY]
    result = ragexp("run", *base, prices, "--json")
    assert result.code == 0, result.stderr
    run_id = result.json()["run_id"]
    metrics = metrics_of(store_uri, run_id)
    usage = [openai_usage(q) for q in questions[:2]]
    prompt, completion = sum(u[0] for u in usage), sum(u[1] for u in usage)
    assert metrics["system.prompt_tokens"] == prompt
    assert metrics["system.completion_tokens"] == completion
    assert metrics["system.usage_cases"] == 2
    assert metrics["cost"] == pytest.approx((prompt * 2.5 + completion * 10) / 1_000_000)
    rows = rows_of(store_uri, run_id, tmp_path)
    assert rows["c1"]["output"]["tokens"] == {"prompt": usage[0][0], "completion": usage[0][1]}
    assert rows["c2"]["output"]["tokens"] == {"prompt": usage[1][0], "completion": usage[1][1]}
    assert rows["c3"]["error"] and rows["c3"]["output"] is None
    assert "cost" in MlflowClient(store_uri).get_run(run_id).data.tags["ragexp.metrics"].split(",")


@pytest.mark.system  # a whole run: `make test`, not the edit loop
def test_without_prices_tokens_only_and_cost_alone_is_refused(
    ragexp: Any, store_uri: str, tmp_path: Path, openai_url: str
) -> None:
    data = write_jsonl(tmp_path / "cases.jsonl", cases("what about 1?"))
    base = [*OPENAI, f"provider.system.url={openai_url}", f"dataset.path={data}"]
    result = ragexp("run", *base, ANSWER_ONLY, "--json")
    assert result.code == 0, result.stderr
    metrics = metrics_of(store_uri, result.json()["run_id"])
    assert metrics["system.prompt_tokens"] == openai_usage("what about 1?")[0]
    assert "cost" not in metrics and "cost" not in result.json()["summary"]
    refused = ragexp("run", *base, "metrics.names=[answer_accuracy,cost]")
    assert refused.code == 1
    assert (
        refused.stderr.strip()
        .splitlines()[-1]
        .startswith("ragexp: error: metric 'cost' needs a price table (cost.prices")
    )


def test_dify_usage_fields_are_read(
    ragexp: Any, store_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = write_jsonl(tmp_path / "cases.jsonl", cases("what about 1?", "and 2?"))
    with preset_standin("dify", monkeypatch) as (_, dify):
        result = ragexp(
            "run",
            *dify,
            f"dataset.path={data}",
            ANSWER_ONLY,
            "cost.prices={system: {prompt: 1, completion: 3}}",
            "cost.currency=CNY",
            "--json",
        )
    assert result.code == 0, result.stderr
    payload = result.json()
    metrics = metrics_of(store_uri, payload["run_id"])
    # The stand-in's message_end reports 100 prompt and 10 completion tokens per reply.
    assert (metrics["system.prompt_tokens"], metrics["system.completion_tokens"]) == (200, 20)
    assert payload["summary"]["cost"] == pytest.approx((200 * 1 + 20 * 3) / 1_000_000)


@pytest.mark.system  # a whole run: `make test`, not the edit loop
def test_a_system_that_reports_no_usage_cannot_be_priced(
    ragexp: Any, store_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = write_jsonl(tmp_path / "cases.jsonl", cases("what about 1?"))
    with preset_standin("ragflow", monkeypatch) as (_, ragflow):
        base = [*ragflow, f"dataset.path={data}", ANSWER_ONLY]
        refused = ragexp("run", *base, "cost.prices={system: {prompt: 1, completion: 1}}")
        plain = ragexp("run", *base, "--json")
    assert refused.code == 1
    last = refused.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "ragexp: error: cost.prices.system: the system of provider ragflow+none reports no token usage"
    ), last
    assert plain.code == 0, plain.stderr
    assert not any(key.startswith("system.") for key in metrics_of(store_uri, plain.json()["run_id"]))
    # The sample system runs in-process and reports none either.
    sample = ragexp("run", "cost.prices={system: {prompt: 1, completion: 1}}")
    assert sample.code == 1 and "reports no token usage" in sample.stderr


def test_judge_tokens_are_priced(ragexp: Any, store_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAGEXP_TEST_JUDGE_KEY", JUDGE_KEY)
    rows = [
        {
            "id": f"c{i}",
            "question": "Who proposed relativity?",
            "relevant_ids": ["d1"],
            "reference": "Albert Einstein proposed relativity.",
            "response": answer,
            "retrieved_contexts": ["Albert Einstein proposed the theory of relativity."],
        }
        for i, answer in enumerate(["Albert Einstein proposed relativity.", "Einstein did. He lived on Mars."])
    ]
    data = write_jsonl(tmp_path / "cases.jsonl", rows)
    with serve(SERVERS / "judge.py", "--api-key", JUDGE_KEY) as url:
        result = ragexp(
            "run",
            "provider=replay_judge",
            f"provider.judge.base_url={url}",
            f"provider.judge.embeddings.url={url}",
            "provider.judge.api_key_env=RAGEXP_TEST_JUDGE_KEY",
            f"dataset.path={data}",
            "metrics.names=[faithfulness]",
            "cost.prices={judge: {prompt: 0.15, completion: 0.6}}",
            "--json",
        )
    assert result.code == 0, result.stderr
    payload = result.json()
    metrics = metrics_of(store_uri, payload["run_id"])
    assert metrics["judge.prompt_tokens"] > 0 and metrics["judge.completion_tokens"] > 0
    expected = (metrics["judge.prompt_tokens"] * 0.15 + metrics["judge.completion_tokens"] * 0.6) / 1_000_000
    assert metrics["cost"] == pytest.approx(expected)
    assert payload["summary"]["cost"] == pytest.approx(expected)


@pytest.mark.system  # a whole run: `make test`, not the edit loop
def test_cost_is_diffed_gated_and_reported(ragexp: Any, store_uri: str, tmp_path: Path, openai_url: str) -> None:
    data = write_jsonl(tmp_path / "cases.jsonl", cases("what about 1?", "and 2?"))
    base = [*OPENAI, f"provider.system.url={openai_url}", f"dataset.path={data}", ANSWER_ONLY]
    # Prices are no part of what a run measures: the same system at another price is comparable.
    cheap = ragexp("run", *base, "cost.prices={system: {prompt: 1, completion: 1}}", "--json")
    dear = ragexp("run", *base, "cost.prices={system: {prompt: 3, completion: 3}}", "--json")
    assert cheap.code == 0 and dear.code == 0, cheap.stderr + dear.stderr
    a, b = cheap.json()["run_id"], dear.json()["run_id"]
    tokens = sum(sum(openai_usage(q)) for q in ("what about 1?", "and 2?"))
    assert metrics_of(store_uri, b)["cost"] == pytest.approx(3 * metrics_of(store_uri, a)["cost"])

    diff = ragexp("diff", a, b, "--json")
    assert diff.code == 0, diff.stderr
    cost = next(m for m in diff.json()["metrics"] if m["name"] == "cost")
    assert cost["delta"] == pytest.approx(2 * tokens / 1_000_000)

    allowed = tokens / 1_000_000  # less than the rise of 2 * tokens / 1e6
    gate = ragexp("gate", "--baseline", a, "--candidate", b, f"+gates.rules.cost.max_increase={allowed}", "--json")
    assert gate.code == 2, gate.stdout + gate.stderr
    failure = next(f for f in gate.json()["failures"] if f["metric"] == "cost")
    assert failure["rule"] == "max_increase" and failure["threshold"] == pytest.approx(allowed)
    assert "allowed increase" in failure["message"]
    passes = ragexp(
        "gate", "--baseline", a, "--candidate", b, f"+gates.rules.cost.max_increase={3 * allowed}", "--json"
    )
    rule = next(r for r in passes.json()["rules"] if r["metric"] == "cost")
    assert rule["outcome"] == "passed", rule
    wrong_way = ragexp(
        "gate", "--baseline", a, "--candidate", b, "+gates.rules.answer_accuracy.max_increase=0", "--json"
    )
    undecided = next(r for r in wrong_way.json()["rules"] if r["rule"] == "max_increase")
    assert undecided["outcome"] == "undecided" and "bound it with max_drop" in undecided["message"]

    out = tmp_path / "report"
    report = ragexp("report", b, "--baseline", a, "--out", str(out))
    assert report.code == 0, report.stderr
    markdown = (out / "report.md").read_text(encoding="utf-8")
    assert "cost" in markdown


def test_a_priced_system_with_replies_missing_usage_logs_no_cost(
    ragexp: Any, store_uri: str, tmp_path: Path, openai_url: str
) -> None:
    # Usage asked of a stream that does not carry it (stream_options off): tokens unknown, not zero.
    data = write_jsonl(tmp_path / "cases.jsonl", cases("what about 1?"))
    result = ragexp(
        "run",
        *OPENAI,
        f"provider.system.url={openai_url}",
        f"dataset.path={data}",
        ANSWER_ONLY,
        "~provider.system.request.stream_options",
        "cost.prices={system: {prompt: 1, completion: 1}}",
        "--json",
    )
    assert result.code == 0, result.stderr
    assert "cost not logged: 1 of the 1 answered cases reported no token usage" in result.stderr
    assert "cost" not in metrics_of(store_uri, result.json()["run_id"])


@pytest.mark.parametrize(
    "usage",
    [
        {"prompt_tokens": -50, "completion_tokens": 3},
        {"prompt_tokens": "lots", "completion_tokens": 3},
        {"prompt_tokens": 40},
        {"prompt_tokens": 40, "completion_tokens": 1e300},
    ],
)
def test_judge_usage_that_cannot_be_read_keeps_the_verdict_and_logs_no_cost(
    ragexp: Any, store_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, usage: dict[str, Any]
) -> None:
    monkeypatch.setenv("RAGEXP_TEST_JUDGE_KEY", JUDGE_KEY)
    row = {
        "id": "c1",
        "question": "Who proposed relativity?",
        "relevant_ids": ["d1"],
        "reference": "Albert Einstein proposed relativity.",
        "response": "Albert Einstein proposed relativity.",
        "retrieved_contexts": ["Albert Einstein proposed the theory of relativity."],
    }
    data = write_jsonl(tmp_path / "cases.jsonl", [row])
    with serve(SERVERS / "judge.py", "--api-key", JUDGE_KEY, "--usage", json.dumps(usage)) as url:
        result = ragexp(
            "run",
            "provider=replay_judge",
            f"provider.judge.base_url={url}",
            f"provider.judge.embeddings.url={url}",
            "provider.judge.api_key_env=RAGEXP_TEST_JUDGE_KEY",
            f"dataset.path={data}",
            "metrics.names=[faithfulness]",
            "cost.prices={judge: {prompt: 0.15, completion: 0.6}}",
            "--json",
        )
    assert result.code == 0, result.stderr
    payload = result.json()
    assert payload["error_count"] == 0 and payload["summary"]["faithfulness"] == 1.0  # the verdict stands
    assert payload["summary"].get("cost") is None
    metrics = metrics_of(store_uri, payload["run_id"])
    assert "cost" not in metrics
    assert metrics["judge.unknown_usage_calls"] == metrics["judge.chat_calls"] > 0
    assert metrics["judge.prompt_tokens"] == 0 and metrics["judge.completion_tokens"] == 0
    assert "cost not logged: " in result.stderr and "judge calls reported no usable token usage" in result.stderr


def test_a_usage_mapping_alone_adds_to_the_contract_of_a_system_without_a_preset_mapping(
    ragexp: Any, store_uri: str, tmp_path: Path
) -> None:
    from ragexp.config.compose import compose
    from ragexp.providers.base import RunSettings, build_provider

    config = compose(["system=http", "+provider.system.response.prompt_tokens=usage.prompt_tokens"])
    settings = RunSettings(config.k, config.concurrency, config.dataset)
    http = build_provider(config.provider.system, settings)
    assert http.output_fields(None) >= {"retrieved_ids", "retrieved_contexts", "response", "citations"}  # type: ignore[arg-type]
    assert http.reports_usage()
    # A Python pipeline returning ragexp's contract plus its usage: retrieval is still scored.
    (tmp_path / "usage_target_46b.py").write_text(
        "def answer(question):\n"
        "    return {'ranked_ids': ['d1'], 'contexts': ['Refunds arrive in 3 days.'], 'answer': '3 days [1]',\n"
        "            'citations': [1], 'usage': {'prompt_tokens': 12, 'completion_tokens': 3}}\n"
    )
    data = write_jsonl(tmp_path / "cases.jsonl", cases("what about 1?"))
    result = ragexp(
        "run",
        "system=python",
        "provider.system.target=usage_target_46b:answer",
        f"provider.system.path={tmp_path}",
        "+provider.system.response.prompt_tokens=usage.prompt_tokens",
        "+provider.system.response.completion_tokens=usage.completion_tokens",
        f"dataset.path={data}",
        "metrics=offline",
        "--json",
    )
    assert result.code == 0, result.stderr
    payload = result.json()
    assert payload["error_count"] == 0 and payload["summary"]["recall_at_k"] == 0.0
    metrics = metrics_of(store_uri, payload["run_id"])
    assert (metrics["system.prompt_tokens"], metrics["system.completion_tokens"]) == (12, 3)


@pytest.mark.parametrize(
    ("prices", "said"),
    [
        ("{judge: {prompt: true, completion: 1}}", "cost.prices.judge.prompt: Input should be a valid number"),
        ("{judge: {prompt: 1, completion: 1e308}}", "cost.prices.judge.completion: Input should be less than"),
        ("{judge: {prompt: '2', completion: 1}}", "cost.prices.judge.prompt: Input should be a valid number"),
    ],
)
def test_a_price_that_is_not_a_bounded_number_is_refused(ragexp: Any, prices: str, said: str) -> None:
    result = ragexp("validate", f"cost.prices={prices}")
    assert result.code == 1
    assert said in result.stderr and result.stderr.count("\n") == 1
