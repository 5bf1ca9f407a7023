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

from ragexp.compare.figures import signed
from ragexp.config.models import DatasetConfig
from ragexp.stats.paired import paired
from ragexp.tracking.store import Store
from ragexp.workflows.traffic import (
    FocusedOrder,
    allocate,
    answer_of,
    documents_of,
    focused_order,
    interleave,
    load_traffic,
    question_of,
    stratified_order,
)
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
    # the first ten units (questions, or conversations whole) are one of each of the ten strata
    whole = load_traffic(config.model_copy(update={"sample": None}), store)
    order = stratified_order(whole, 0)
    assert sorted(order) == list(range(len(whole.dataset.cases)))
    firsts = [i for i in order if whole.dataset.cases[i].turn <= 1][:10]
    assert {whole.strata[whole.dataset.cases[i].id] for i in firsts} == set(pipeline.TOPICS)
    unknown = load_traffic(config.model_copy(update={"stratify_by": "tenant", "sample": None}), store)
    assert set(unknown.sampled()) == {"unknown"}


def test_focused_order_reaches_a_planted_stratum_before_the_proportional_order() -> None:
    """``shadow --until-decided`` asks a warm-up of every stratum, then each batch from the open
    stratum nearest to failing: a planted stratum gets most of the questions asked."""
    # four strata of 50 questions, each in its own shuffled order (positions 50k .. 50k + 49)
    shuffles = {name: np.random.default_rng(k).permutation(50) + 50 * k for k, name in enumerate("abcd")}
    units = {name: [[int(j)] for j in order] for name, order in shuffles.items()}
    focus = FocusedOrder(units, step=10)
    warm = focus.warmup()
    assert warm == [u[0] for name in "abcd" for u in units[name][:5]]  # 10% of each, in its own order
    margins = {"a": 0.05, "b": -0.01, "c": 0.04, "d": 0.05}
    asked = list(warm)
    for _ in range(3):
        chosen = focus.next(margins)
        assert chosen is not None and chosen[0] == "b"
        asked.extend(chosen[1])
    assert asked[20:] == [u[0] for u in units["b"][5:35]]  # the next 30 are b's, in b's order
    assert focus.asked("b") == 35 and focus.asked("a") == 5
    # the proportional order's first 50 cases hold about a quarter of b
    proportional = interleave(units, np.random.default_rng(0))
    in_b = sum(index in range(50, 100) for index in proportional[:50])
    assert in_b <= 13 and sum(index in range(50, 100) for index in asked[:50]) == 35
    # a stratum no longer open (decided) is never chosen; one whose units ran out neither
    assert focus.next({"a": 0.05, "c": 0.04}) == ("c", [u[0] for u in units["c"][5:15]])
    for _ in range(2):
        focus.next({"b": -0.02})
    assert focus.left("b") == 0
    assert focus.next({"b": -0.02}) is None
    assert focus.next({"b": -0.02, "d": 0.3}) == ("d", [u[0] for u in units["d"][5:15]])
    # a conversation is handed out whole, even past the batch
    chats = FocusedOrder({"x": [[0, 1, 2], [3], [4, 5]], "y": [[6], [7]]}, step=2, warmup=0.1)
    assert chats.warmup() == [0, 1, 2, 6]
    assert chats.next({"x": 0.0, "y": 1.0}) == ("x", [3, 4, 5])


def test_shadow_until_decided_asks_the_planted_stratum_after_the_warm_up(
    production: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over every stratum, ``shadow --until-decided`` asks 10% of each first, then the batches go to
    the planted stratum (the one nearest to failing) before any other, and each stratum is
    decided on its own cases at the gate's level over the strata."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", production)
    monkeypatch.chdir(ROOT)
    pipeline.ASKED.clear()
    result = invoke(
        "shadow",
        "dataset=traces",
        "dataset.experiment=prod",
        "dataset.stratify_by=route",
        "--experiment",
        "prod-focused",
        *CANDIDATE,
        GROUNDED,
        "gates.rules={grounded: {max_drop: 0.02}}",
        "sequential.batch=4",
        "--until-decided",
        "--json",
    )
    assert result.code == 0, result.stderr
    sequential = result.json()["sequential"]
    strata = {row["stratum"]: row for row in sequential["strata"]}
    assert set(pipeline.TOPICS) <= set(strata)
    asked = [pipeline.topic_of(question) for question in pipeline.ASKED]
    # the warm-up: 10% of each stratum (2 of 24), every stratum asked first
    assert sorted(asked[:20]) == sorted(2 * [topic for topic in pipeline.TOPICS])
    # two answers tell no stratum apart, so batches go round the strata; once the planted
    # stratum's interval leans toward failing, every batch is its own until it is asked whole,
    # while every other stratum has had at most 6 of its 24 questions asked
    last = max(i for i, topic in enumerate(asked) if topic == pipeline.PLANTED)
    assert asked[last - 17 : last + 1] == [pipeline.PLANTED] * 18
    before = {topic: asked[: last + 1].count(topic) for topic in pipeline.TOPICS}
    assert before.pop(pipeline.PLANTED) == 24 and max(before.values()) <= 6
    # each stratum decided on its own cases (a session counts in its first turn's stratum)
    assert strata[pipeline.PLANTED]["evaluated"] == 24
    assert sum(row["evaluated"] for row in strata.values()) == len(asked)
    assert {row["decision"] for row in strata.values()} == {"inconclusive"}  # 24 are few at 0.05 / 10 strata
    assert sequential["evaluated"] == len(asked) == result.json()["candidate"]["case_count"]


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


@pytest.mark.system
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


def test_ppi_by_stratum_equals_a_direct_computation() -> None:
    from ragexp.compare.shadow_pair import ppi_by_stratum, with_ppi
    from ragexp.stats.strata import by_stratum

    rng = np.random.default_rng(5)
    n = 90
    strata = np.array(["a"] * 40 + ["b"] * 35 + ["c"] * 15)
    judged = rng.normal(-0.05, 0.2, n)
    judged[3] = np.nan  # a case one run did not score: neither judged nor labelled
    human = np.where(rng.random(n) < 0.4, judged + rng.normal(-0.03, 0.1, n), np.nan)
    human[3] = 0.5
    overall, rows = ppi_by_stratum(judged, human, strata, confidence=0.9, width=1.0, min_labelled=5)
    z = 1.6448536269514722

    def direct(mask: np.ndarray) -> tuple[int, float, float, float]:
        j = judged[mask & np.isfinite(judged)]
        both = mask & np.isfinite(judged) & np.isfinite(human)
        r = human[both] - judged[both]
        mean = float(j.mean() + r.mean())
        half = z * float(np.sqrt(j.var() / j.size + r.var() / r.size))
        return int(both.sum()), mean, mean - half, mean + half

    for name, (count, estimate) in [("all", overall), *rows.items()]:
        mask = np.ones(n, dtype=bool) if name == "all" else strata == name
        labelled, mean, low, high = direct(mask)
        assert count == labelled
        if labelled < 5:
            assert estimate is None
            continue
        assert estimate is not None
        assert (estimate.mean, estimate.ci_low, estimate.ci_high) == pytest.approx((mean, low, high), abs=1e-12)
        assert estimate.judge_mean == pytest.approx(float(np.nanmean(judged[mask])), abs=1e-12)
    assert rows["c"][1] is None or rows["c"][0] >= 5
    # with_ppi carries them on by_stratum's rows, beside the judged delta
    base = rng.uniform(0.3, 0.7, n)
    judged_rows = by_stratum("m", "higher", base, base + judged, strata, resamples=500, confidence=0.9)
    found = with_ppi(judged_rows, judged, human, strata, confidence=0.9, width=1.0, min_labelled=5)
    assert [row.stats for row in found.strata] == [row.stats for row in judged_rows.strata]
    for row in [found.overall, *found.strata]:
        count, estimate = overall if row.stratum == "all" else rows[row.stratum]
        assert row.labelled == count
        if estimate is None:
            assert row.ppi is None and row.to_json()["ppi"] is None
        else:
            assert row.ppi is not None and row.ppi.mean == pytest.approx(estimate.mean, abs=1e-12)
            assert row.to_json()["ppi"]["ci_low"] == pytest.approx(estimate.ci_low, abs=1e-12)


def test_ppi_by_stratum_covers_the_true_delta_where_the_raw_judge_does_not() -> None:
    """A small coverage simulation: a judge biased by +0.05 for the candidate; 100 labelled pairs
    of 400 in each of two strata; the PPI interval covers each stratum's true delta about as often
    as its confidence says, the judged interval far less often."""
    from ragexp.compare.shadow_pair import ppi_by_stratum

    rng = np.random.default_rng(11)
    strata = np.array(["a"] * 400 + ["b"] * 400)
    truth = np.where(strata == "a", -0.05, 0.0)
    covered = raw_covered = total = 0
    for _ in range(200):
        human = truth + rng.normal(0, 0.15, strata.size)
        judged = human + 0.05 + rng.normal(0, 0.1, strata.size)
        shown = np.full(strata.size, np.nan)
        for name in ("a", "b"):
            pick = rng.choice(np.flatnonzero(strata == name), 100, replace=False)
            shown[pick] = human[pick]
        _, rows = ppi_by_stratum(judged, shown, strata, confidence=0.95, width=1.0)
        for name, (_, estimate) in rows.items():
            assert estimate is not None
            target = -0.05 if name == "a" else 0.0
            covered += estimate.ci_low <= target <= estimate.ci_high
            j = judged[strata == name]
            half = 1.96 * j.std() / np.sqrt(j.size)
            raw_covered += j.mean() - half <= target <= j.mean() + half
            total += 1
    assert covered / total >= 0.92
    assert raw_covered / total < 0.5


def test_label_queues_a_stratified_paired_subset_and_diff_corrects_each_stratum(
    production: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import mlflow
    from mlflow.entities import AssessmentSource
    from mlflow.genai import review_queues

    from ragexp.workflows.traffic import draw

    monkeypatch.setenv("MLFLOW_TRACKING_URI", production)
    monkeypatch.chdir(ROOT)
    args = ["dataset=traces", "dataset.experiment=prod", "dataset.stratify_by=route", "dataset.sample=150"]
    shadow = invoke("shadow", *args, *CANDIDATE, GROUNDED, "--experiment", "prod-labelled", "--json")
    assert shadow.code == 0, shadow.stderr
    prod_run, cand_run = shadow.json()["production"]["run_id"], shadow.json()["candidate"]["run_id"]

    # --- the candidate's traffic.json keeps each case's stratum
    client = MlflowClient(production)
    kept = json.loads(Path(client.download_artifacts(cand_run, "traffic.json", str(tmp_path / "t"))).read_text())
    strata: dict[str, str] = kept["strata"]
    assert len(strata) == 150
    route = {trace.info.trace_id: trace.info.tags.get("route") for trace in _traces(production, "prod")}
    assert all(strata[case] == route[case] for case in strata if "#" not in case)

    # --- ragexp label on the shadow's candidate: a stratified sample of pairs, both answers queued
    labelled = invoke("label", cand_run, "--metrics", "grounded", "--sample", "110", "--json")
    assert labelled.code == 0, labelled.stderr
    queued = labelled.json()
    members: dict[str, list[str]] = defaultdict(list)
    for case, stratum in strata.items():
        members[stratum].append(case)
    expected = draw(dict(members), 110, 0)
    counts: dict[str, int] = defaultdict(int)
    for case in expected:
        counts[strata[case]] += 1
    assert queued["pairs_by_stratum"] == dict(sorted(counts.items()))
    assert queued["traces"] == queued["production"]["traces"] == 110
    assert queued["production"]["queue_id"] == queued["queue_id"]
    mlflow.set_tracking_uri(production)
    items, token = [], None
    while True:
        page = review_queues.list_review_queue_items(queued["queue_id"], max_results=100, page_token=token)
        items += [item.item_id for item in page]
        token = page.token
        if not token or not page:
            break
    case_of = {tid: client.get_trace(tid).info.trace_metadata["ragexp.case_id"] for tid in items}
    run_of = {tid: client.get_trace(tid).info.request_metadata.get("mlflow.sourceRun") for tid in items}
    assert sorted(case_of.values()) == sorted([*expected, *expected])
    assert {run_of[tid] for tid in items} == {prod_run, cand_run}

    # --- people label both answers of each queued pair (as the Review page writes them)
    rng = np.random.default_rng(2)
    human: dict[tuple[str, str], float] = {}
    for tid in items:
        value = float(np.round(rng.uniform(0, 1), 3))
        human[(run_of[tid], case_of[tid])] = value
        mlflow.log_feedback(
            trace_id=tid, name="grounded", value=value, source=AssessmentSource(source_type="HUMAN", source_id="ann")
        )

    # --- diff of the pair: each stratum's judged delta and, beside it, the PPI-corrected one
    diff = invoke("diff", prod_run, cand_run, "--json")
    assert diff.code == 0, diff.stderr
    (metric,) = [m for m in diff.json()["strata"] if m["name"] == "grounded"]
    base, cand = _rows(production, prod_run, tmp_path), _rows(production, cand_run, tmp_path)
    z = 1.959963984540054
    checked = 0
    for row in [metric["overall"], *metric["strata"]]:
        cases = [c for c in base if row["stratum"] == "all" or strata[c] == row["stratum"]]
        judged = np.array([cand[c]["metrics"]["grounded"] - base[c]["metrics"]["grounded"] for c in cases])
        pairs = [i for i, c in enumerate(cases) if c in expected]
        rectifier = np.array([human[(cand_run, cases[i])] - human[(prod_run, cases[i])] - judged[i] for i in pairs])
        assert row["labelled_pairs"] == len(pairs)
        assert row["delta"] == pytest.approx(float(judged.mean()), abs=1e-12)
        if len(pairs) < 10:
            assert row["ppi"] is None
            continue
        mean = float(judged.mean() + rectifier.mean())
        half = z * float(np.sqrt(judged.var() / judged.size + rectifier.var() / rectifier.size))
        assert (row["ppi"]["delta"], row["ppi"]["ci_low"], row["ppi"]["ci_high"]) == pytest.approx(
            (mean, mean - half, mean + half), abs=1e-9
        )
        checked += 1
    assert checked >= 5
    terminal = invoke("diff", prod_run, cand_run)
    assert terminal.code == 0, terminal.stderr
    assert "shadow pair by stratum" in terminal.stdout and "PPI delta" in terminal.stdout
    assert signed(metric["overall"]["ppi"]["delta"]) in terminal.stdout

    # --- the report of the pair has the same table
    out = tmp_path / "report"
    report = invoke("report", cand_run, "--baseline", prod_run, "--out", str(out), "--language", "en")
    assert report.code == 0, report.stderr
    text = (out / "report.md").read_text()
    assert "By stratum" in text and "PPI delta" in text
    assert signed(metric["overall"]["ppi"]["delta"]) in text
    assert signed(metric["strata"][0]["ppi"]["delta"]) in text or metric["strata"][0]["ppi"] is None


def test_llama_index_traces_read_as_traffic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Traces written by real ``mlflow.llama_index.autolog()`` around a LlamaIndex query engine
    (tests/pipelines/llama_traffic.py): question, answer and documents read from them, and a
    shadow on them; LlamaIndex traces one retrieval as two nested RETRIEVER spans, read once."""
    from tests.pipelines import llama_traffic

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    topics = ["topic1", "topic3", "topic7"]
    asked = [pipeline.question(index, topic) for index in range(3) for topic in topics]
    llama_traffic.write_production(uri, "llama", asked)
    config = DatasetConfig.model_validate(
        {"name": "traces", "path": "mlflow-traces", "experiment": "llama", "stratify_by": "route"}
    )
    traffic = load_traffic(config, Store(uri, must_exist=True))
    assert traffic.read == len(asked) and not traffic.unreadable and traffic.own == 0
    assert sorted(case.question for case in traffic.dataset.cases) == sorted(asked)
    for case in traffic.dataset.cases:
        topic = pipeline.topic_of(case.question)
        assert traffic.strata[case.id] == topic
        recorded = case.recorded
        assert recorded is not None
        assert recorded.answer == pipeline.production_answer(case.question, pipeline.doc(topic))
        assert recorded.ranked_ids == [f"doc-{topic}"] and recorded.contexts == [pipeline.doc(topic)]

    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(ROOT)
    before = {trace.info.trace_id for trace in _traces(uri, "llama")}
    args = ["dataset=traces", "dataset.experiment=llama", "dataset.stratify_by=route", *CANDIDATE, GROUNDED]
    result = invoke("shadow", *args, "--json")
    assert result.code == 0, result.stderr
    out = result.json()
    assert out["production"]["case_count"] == out["candidate"]["case_count"] == len(asked)
    assert {row["stratum"] for row in out["metrics"][0]["strata"]} == set(topics)
    assert {trace.info.trace_id for trace in _traces(uri, "llama")} == before


def test_until_decided_on_traffic_keeps_a_conversations_turns_together(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A conversation is one unit of the stratified order: its turns asked together and in order,
    whatever the seed, and a batch of ``shadow --until-decided`` ends between conversations, so
    each later turn is answered after the candidate's own earlier answers."""
    from ragexp.compare.gate import looks_of
    from ragexp.workflows.sequential import unit_labels

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    sessions = {
        f"chat-{name}": [f"turn {n} about {topic}?" for n in range(1, 4)]
        for name, topic in [("a", "topic1"), ("b", "topic2"), ("c", "topic1"), ("d", "topic2")]
    }
    pipeline.write_production(uri, "talk", 3, ["topic1", "topic2"])
    pipeline.write_sessions(uri, "talk", sessions)
    config = DatasetConfig.model_validate(
        {"name": "traces", "path": "mlflow-traces", "experiment": "talk", "stratify_by": "route"}
    )
    traffic = load_traffic(config, Store(uri, must_exist=True))
    cases = traffic.dataset.cases
    for seed in range(20):
        order = stratified_order(traffic, seed)
        assert sorted(order) == list(range(len(cases)))
        asked = [cases[i] for i in order]
        for chat in sessions:
            where = [p for p, case in enumerate(asked) if case.conversation == chat]
            assert where == list(range(where[0], where[0] + 3))  # together
            assert [asked[p].turn for p in where] == [1, 2, 3]  # in order
        units = unit_labels(asked)
        for batch in (1, 2, 4, 5):
            for end in looks_of(len(asked), batch, units)[:-1]:
                assert asked[end].conversation is None or asked[end].turn == 1  # never inside one
        # the focused order (shadow --until-decided's): every batch holds whole conversations, in order
        focus = focused_order(traffic, seed, 2)
        batches = [focus.warmup()]
        while (chosen := focus.next(dict.fromkeys(focus.units, 0.0))) is not None:
            batches.append(chosen[1])
        assert sorted(i for b in batches for i in b) == list(range(len(cases)))
        for chosen_batch in batches:
            for chat in sessions:
                turns = [cases[i].turn for i in chosen_batch if cases[i].conversation == chat]
                assert turns in ([], [1, 2, 3])

    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.chdir(ROOT)
    pipeline.ASKED.clear()
    args = ["dataset=traces", "dataset.experiment=talk", "dataset.stratify_by=route", *CANDIDATE, GROUNDED]
    result = invoke(
        "shadow", *args, "gates.rules={grounded: {max_drop: 0.5}}", "sequential.batch=2", "--until-decided", "--json"
    )
    assert result.code == 0, result.stderr
    evaluated = result.json()["sequential"]["evaluated"]
    assert evaluated >= 1
    for chat, turns in sessions.items():
        for n, text in enumerate(turns):
            if text in pipeline.ASKED:
                # a turn asked after its own history: every earlier turn, with the candidate's answer
                history = pipeline.ASKED[text]
                assert [m["content"] for m in history if m["role"] == "user"] == turns[:n], chat
