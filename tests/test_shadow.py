"""Shadow replay of production traffic: ``dataset=traces`` reads an experiment's traces written by
real ``mlflow.langchain.autolog()`` around a LangChain chain (tests/pipelines/traffic.py), and
``ragexp shadow`` compares a candidate with production's own answers, by stratum."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from ragexp.config.models import DatasetConfig
from ragexp.stats.paired import paired
from ragexp.tracking.store import Store
from ragexp.workflows.traffic import allocate, answer_of, documents_of, load_traffic, question_of, stratified_order
from tests.conftest import ROOT, invoke
from tests.pipelines import traffic as pipeline
from tests.servers.procs import serve

PER_TOPIC = 24
SESSIONS = {"chat-a": ["how long for topic1?", "and for topic2 then?"], "chat-b": ["what about topic5?"]}
GROUNDED = "metrics.custom=[{name: grounded, kind: python, target: 'tests.pipelines.traffic:grounded'}]"
CANDIDATE = ["system=python", "provider.system.target=tests.pipelines.traffic:candidate", "metrics.names=[]"]


def _unreadable(uri: str, experiment: str) -> None:
    """Two traces a shadow cannot use: a root span without input, and a chain that failed."""
    import mlflow

    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment(experiment)
    with mlflow.start_span(name="health-check") as span:
        span.set_outputs({"status": "ok"})
    mlflow.langchain.autolog()
    try:
        failing = pipeline.RunnableLambda(pipeline._route) | pipeline.RunnableLambda(_boom)
        with pytest.raises(RuntimeError):
            failing.invoke({"question": "how long for topic4?", "route": "topic4"})
        mlflow.flush_trace_async_logging()
    finally:
        mlflow.langchain.autolog(disable=True)


def _boom(question: str) -> str:
    raise RuntimeError("model overloaded")


@pytest.fixture(scope="module")
def production(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A store whose experiment ``prod`` holds production traffic: PER_TOPIC questions in each of
    10 topics, two sessions, two unreadable traces."""
    folder = tmp_path_factory.mktemp("prod")
    uri = f"sqlite:///{folder}/mlruns/mlflow.db"
    (folder / "mlruns").mkdir()
    pipeline.write_production(uri, "prod", PER_TOPIC)
    pipeline.write_sessions(uri, "prod", SESSIONS)
    _unreadable(uri, "prod")
    return uri


def _traces(uri: str, experiment: str) -> list[Any]:
    client = MlflowClient(uri)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return []
    out: list[Any] = []
    token = None
    while True:
        page = client.search_traces(locations=[found.experiment_id], max_results=500, page_token=token)
        out.extend(page)
        token = page.token
        if not token:
            return out


def _rows(uri: str, run_id: str, folder: Path) -> dict[str, dict[str, Any]]:
    path = MlflowClient(uri).download_artifacts(run_id, "cases.jsonl", str(folder / run_id))
    return {row["id"]: row for row in map(json.loads, Path(path).read_text().splitlines())}


def test_shadow_names_the_planted_stratum_and_writes_nothing_to_production(
    production: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", production)
    monkeypatch.chdir(ROOT)
    before = {trace.info.trace_id for trace in _traces(production, "prod")}
    pipeline.ASKED.clear()
    args = ["dataset=traces", "dataset.experiment=prod", "dataset.stratify_by=route", *CANDIDATE, GROUNDED]
    result = invoke("shadow", *args, "--json")
    assert result.code == 0, result.stderr
    out = result.json()

    # --- production stays clean: no trace added there; both runs and their traces in prod-shadow
    after = {trace.info.trace_id for trace in _traces(production, "prod")}
    assert after == before
    assert out["experiment"] == "prod-shadow"
    client = MlflowClient(production)
    runs = {role: client.get_run(out[role]["run_id"]) for role in ("production", "candidate")}
    for role, run in runs.items():
        assert client.get_experiment(run.info.experiment_id).name == "prod-shadow"
        assert run.data.tags["ragexp.shadow"] == "prod"
        assert run.data.tags["ragexp.shadow.role"] == role
    assert runs["candidate"].data.tags["ragexp.shadow.production"] == out["production"]["run_id"]
    assert runs["candidate"].data.tags["ragexp.shadow.worst_stratum"] == pipeline.PLANTED
    shadow_traces = _traces(production, "prod-shadow")
    cases = PER_TOPIC * 10 + 3
    assert len(shadow_traces) == 2 * cases

    # --- the comparison is logged on the candidate as strict JSON, the same as --json prints
    logged = client.download_artifacts(out["candidate"]["run_id"], "shadow.json", str(tmp_path / "logged"))
    strict = json.loads(Path(logged).read_text(), parse_constant=lambda word: pytest.fail(f"non-strict JSON: {word}"))
    assert strict["metrics"] == out["metrics"] and strict["worst_stratum"] == out["worst_stratum"]

    # --- unreadable traces counted and listed with their reason, never cases
    traffic = out["traffic"]
    assert traffic["read"] == cases + 2 and traffic["unreadable_count"] == 2
    reasons = sorted(item["reason"] for item in traffic["unreadable"])
    assert reasons == [
        "no answer in the root span's output (trace state ERROR)",
        "no question in the root span's input",
    ]
    assert out["production"]["case_count"] == out["candidate"]["case_count"] == cases
    assert out["production"]["dataset_hash"] == out["candidate"]["dataset_hash"]

    # --- the planted stratum is named first, credibly regressed; the others are not
    (metric,) = out["metrics"]
    assert metric["name"] == "grounded" and out["worst_stratum"] == pipeline.PLANTED
    assert metric["strata"][0]["stratum"] == pipeline.PLANTED and metric["strata"][0]["regressed"]
    assert [row["stratum"] for row in metric["strata"] if row["regressed"]] == [pipeline.PLANTED]

    # --- each stratum's paired delta equals a direct computation from the two runs' cases.jsonl
    base = _rows(production, out["production"]["run_id"], tmp_path)
    cand = _rows(production, out["candidate"]["run_id"], tmp_path)
    route = {trace.info.trace_id: trace.info.tags.get("route") for trace in _traces(production, "prod")}
    by_stratum: dict[str, list[float]] = defaultdict(list)
    for case_id, row in base.items():
        if "#" in case_id:
            continue  # a session's turns: checked below
        by_stratum[route[case_id]].append(cand[case_id]["metrics"]["grounded"] - row["metrics"]["grounded"])
    for row in metric["strata"]:
        if row["stratum"] in by_stratum:
            diffs = by_stratum[row["stratum"]]
            assert row["n"] >= len(diffs)
            if row["stratum"] not in {"topic1", "topic5"}:  # strata holding a session's turns
                assert row["n"] == len(diffs) == PER_TOPIC
                assert row["delta"] == pytest.approx(float(np.mean(diffs)), abs=1e-12)
    planted = by_stratum[pipeline.PLANTED]
    direct = paired(np.zeros(len(planted)), np.array(planted), resamples=10_000, confidence=0.95, seed=0)
    assert direct is not None and metric["strata"][0]["p_value"] == pytest.approx(direct.p_value)

    # --- a conversation replayed turn by turn, each turn after its own history
    first, second = SESSIONS["chat-a"]
    assert pipeline.ASKED[first] == []
    assert pipeline.ASKED[second] == [
        {"role": "user", "content": first},
        {"role": "assistant", "content": cand["chat-a#1"]["output"]["answer"]},
    ]
    assert base["chat-a#2"]["question"] == second

    # --- diff works on the pair as on any pair: its delta is the shadow's overall delta
    diff = invoke("diff", out["production"]["run_id"], out["candidate"]["run_id"], "--json")
    assert diff.code == 0, diff.stderr
    (row,) = [m for m in diff.json()["metrics"] if m["name"] == "grounded"]
    assert row["delta"] == pytest.approx(metric["overall"]["delta"], abs=1e-12)

    # --- shadow --until-decided: the candidate asked in batches against production's replay of
    # the same sample, until the gate on the planted stratum is decided
    decided = invoke(
        "shadow",
        "dataset=traces",
        "dataset.experiment=prod",
        "dataset.stratify_by=route",
        'dataset.filter="tags.route = ' + f"'{pipeline.PLANTED}'" + '"',  # hydra: a value with spaces is quoted
        *CANDIDATE,
        GROUNDED,
        "gates.rules={grounded: {max_drop: 0.02}}",
        "sequential.batch=4",
        "--until-decided",
        "--json",
    )
    assert decided.code == 0, decided.stderr
    sequential = decided.json()["sequential"]
    # 24 cases are few for an anytime-valid bound: decided, on the last batch
    assert sequential["decision"] == "failed" and sequential["total"] == PER_TOPIC
    assert decided.json()["candidate"]["case_count"] == sequential["evaluated"]

    # --- the shadow experiment holds only ragexp's traces: read as traffic, every one is left out
    again = invoke("run", "dataset=traces", "dataset.experiment=prod-shadow", *CANDIDATE, GROUNDED)
    assert again.code == 1
    written = len(_traces(production, "prod-shadow"))
    assert written > 2 * cases and f"({written} read, 0 unreadable, {written} written by ragexp)" in again.stderr


def test_the_sample_is_its_identity(production: str) -> None:
    store = Store(production, must_exist=True)
    config = DatasetConfig.model_validate(
        {"name": "traces", "path": "mlflow-traces", "experiment": "prod", "sample": 40, "stratify_by": "route"}
    )
    first, again = load_traffic(config, store), load_traffic(config, store)
    assert [case.id for case in first.dataset.cases] == [case.id for case in again.dataset.cases]
    assert first.dataset.dataset_hash == again.dataset.dataset_hash
    other = load_traffic(config.model_copy(update={"seed": 1}), store)
    assert other.dataset.dataset_hash != first.dataset.dataset_hash
    # 40 of 243 units over 10 strata, in proportion: every stratum drawn, none over its share
    sampled = first.sampled()
    assert set(sampled) == set(pipeline.TOPICS)
    units = {case.conversation or case.id for case in first.dataset.cases}
    assert len(units) == 40
    # a window that ends before the first trace reads nothing
    empty = config.model_copy(update={"end": "2000-01-01T00:00:00Z"})
    with pytest.raises(Exception, match="no readable trace"):
        load_traffic(empty, store)
    # --until-decided asks traffic in an order whose every prefix is close to proportional:
    # the first ten cases are one of each of the ten strata
    whole = load_traffic(config.model_copy(update={"sample": None}), store)
    order = stratified_order(whole, 0)
    assert sorted(order) == list(range(len(whole.dataset.cases)))
    assert {whole.strata[whole.dataset.cases[i].id] for i in order[:10]} == set(pipeline.TOPICS)
    unknown = load_traffic(config.model_copy(update={"stratify_by": "tenant", "sample": None}), store)
    assert set(unknown.sampled()) == {"unknown"}


def test_allocation_is_proportional_with_one_per_stratum() -> None:
    assert allocate({"a": 90, "b": 9, "c": 1}, 10) == {"a": 8, "b": 1, "c": 1}
    assert allocate({"a": 50, "b": 50}, 10) == {"a": 5, "b": 5}
    assert allocate({"a": 3, "b": 2}, 100) == {"a": 3, "b": 2}
    assert sum(allocate({str(i): 7 + i for i in range(10)}, 33).values()) == 33


def test_question_answer_and_documents_from_framework_shapes() -> None:
    assert question_of({"question": "q1", "route": "r"}) == "q1"
    assert question_of("plain") == "plain"
    assert question_of({"str_or_query_bundle": "from llama"}) == "from llama"  # LlamaIndex query engine
    assert question_of({"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]}) == "u"
    assert question_of({"a": 1}) is None
    assert answer_of({"response": "r", "source_nodes": []}) == "r"
    assert answer_of({"choices": [{"message": {"role": "assistant", "content": "c"}}]}) == "c"
    assert answer_of(None) is None
    langchain = [[{"page_content": "t1", "id": "d1", "metadata": {}}]]
    llama = [[{"node": {"id_": "n1", "text": "t2", "metadata": {}}, "score": 0.5}]]
    assert documents_of(langchain) == (["d1"], ["t1"])
    assert documents_of(llama) == (["n1"], ["t2"])


def test_shadow_refuses_to_write_to_production_and_needs_traffic(production: str, monkeypatch: Any) -> None:
    monkeypatch.setenv("MLFLOW_TRACKING_URI", production)
    same = invoke("shadow", "dataset=traces", "dataset.experiment=prod", "--experiment", "prod", *CANDIDATE, GROUNDED)
    assert same.code == 1 and "is the production experiment" in same.stderr
    window = ["dataset.start=2026-05-08T00:00:00Z", "dataset.end=2026-05-01T00:00:00Z", "dataset.seed=1"]
    backwards = invoke("shadow", "dataset=traces", "dataset.experiment=prod", "dataset.sample=5", *window, *CANDIDATE)
    assert backwards.code == 1
    assert "dataset.start (2026-05-08T00:00:00Z) is not before dataset.end (2026-05-01T00:00:00Z)" in backwards.stderr
    no_traffic = invoke("shadow", *CANDIDATE, GROUNDED)
    assert no_traffic.code == 1 and "dataset=traces dataset.experiment=NAME" in no_traffic.stderr


@pytest.mark.system
def test_shadow_judged_by_a_no_gold_judge_metric(production: str, monkeypatch: Any, tmp_path: Path) -> None:
    """faithfulness by the deterministic judge stand-in, on a sample of 20."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", production)
    monkeypatch.chdir(ROOT)
    with serve(ROOT / "tests/servers/judge.py") as url:
        judge = [
            "judge=openai",
            f"provider.judge.base_url={url}",
            f"provider.judge.embeddings.url={url}",
            "provider.judge.api_key_env=null",
            "provider.judge.max_retries=0",
        ]
        args = ["dataset=traces", "dataset.experiment=prod", "dataset.sample=20", "dataset.stratify_by=route"]
        result = invoke("shadow", *args, *CANDIDATE[:2], "metrics.names=[faithfulness]", *judge, "--json")
    assert result.code == 0, result.stderr
    out = result.json()
    assert out["production"]["populations"]["faithfulness"]["scored"] == 20
    assert out["candidate"]["populations"]["faithfulness"]["scored"] == 20
    client = MlflowClient(production)
    tags = [client.get_run(out[role]["run_id"]).data.tags["ragexp.judge"] for role in ("production", "candidate")]
    assert tags[0] == tags[1]


@pytest.mark.timeout(3600)  # writing 2,000 autologged traces one by one takes minutes
def test_shadow_on_2000_questions_in_10_strata(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The issue's size: 2,000 autologged production questions in 10 strata, the regression
    planted in one; every stratum's delta equals a direct computation."""
    uri = f"sqlite:///{tmp_path}/mlruns/mlflow.db"
    (tmp_path / "mlruns").mkdir()
    pipeline.write_production(uri, "prod", 200)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(ROOT)
    before = len(_traces(uri, "prod"))
    result = invoke(
        "shadow",
        "dataset=traces",
        "dataset.experiment=prod",
        "dataset.stratify_by=route",
        *CANDIDATE,
        GROUNDED,
        "--json",
    )
    assert result.code == 0, result.stderr
    out = result.json()
    assert len(_traces(uri, "prod")) == before == 2000
    assert out["worst_stratum"] == pipeline.PLANTED
    (metric,) = out["metrics"]
    assert [row["stratum"] for row in metric["strata"] if row["regressed"]] == [pipeline.PLANTED]
    base = _rows(uri, out["production"]["run_id"], tmp_path)
    cand = _rows(uri, out["candidate"]["run_id"], tmp_path)
    route = {trace.info.trace_id: trace.info.tags["route"] for trace in _traces(uri, "prod")}
    diffs: dict[str, list[float]] = defaultdict(list)
    for case_id, row in base.items():
        diffs[route[case_id]].append(cand[case_id]["metrics"]["grounded"] - row["metrics"]["grounded"])
    for row in metric["strata"]:
        assert row["n"] == len(diffs[row["stratum"]]) == 200
        assert row["delta"] == pytest.approx(float(np.mean(diffs[row["stratum"]])), abs=1e-12)


def test_strata_holm_and_order_worst_first() -> None:
    from ragexp.stats.multiple import holm
    from ragexp.stats.strata import by_stratum

    rng = np.random.default_rng(3)
    base = rng.uniform(0.4, 0.6, 60)
    change = np.concatenate([np.full(20, -0.3), np.zeros(20), np.full(20, 0.3)]) + rng.normal(0, 0.01, 60)
    strata = ["a"] * 20 + ["b"] * 20 + ["c"] * 20
    higher = by_stratum("m", "higher", base, base + change, strata, resamples=2000)
    assert [row.stratum for row in higher.strata] == ["a", "b", "c"] and higher.worst == "a"
    assert [row.regressed for row in higher.strata] == [True, False, False]
    raw = {row.stratum: row.stats.p_value for row in higher.strata if row.stats}
    adjusted = dict(zip(sorted(raw), holm([raw[name] for name in sorted(raw)]), strict=True))
    assert {row.stratum: row.p_holm for row in higher.strata} == pytest.approx(adjusted)
    assert higher.overall.stats is not None
    assert higher.overall.stats.delta == pytest.approx(float(change.mean()))
    # for a metric where lower is better the same change makes "c" the regression
    lower = by_stratum("m", "lower", base, base + change, strata, resamples=2000)
    assert lower.worst == "c" and [row.regressed for row in lower.strata] == [True, False, False]
    # a stratum no case of which both runs scored has no delta, and is never a regression
    missing = np.where(np.array(strata) == "b", np.nan, base + change)
    holes = by_stratum("m", "higher", base, missing, strata, resamples=2000)
    (b,) = [row for row in holes.strata if row.stratum == "b"]
    assert b.stats is None and not b.regressed and b.cases == 20
