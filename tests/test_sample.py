"""provider=sample (the bundled system in-process), its shared code with the HTTP sample service,
and `ragexp demo` end to end against real SQLite stores in temporary folders."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from mlflow.tracking import MlflowClient

from ragexp.config.compose import compose
from ragexp.config.identity import identity_view
from ragexp.config.models import SampleConfig
from ragexp.sample import SampleSystem, Settings, load_docs
from ragexp.workflows.run_plan import plan_run
from tests.conftest import ROOT, write_jsonl
from tests.servers.procs import SAMPLE, serve

DOCS = ROOT / "ragexp/data/kb_zh/docs.jsonl"
REFUSED = {"ship-carrier", "invoice-vat-docs", "price-drop"}
"""Answerable cases the shipped sample refuses: their best BM25 score is below the threshold."""


def rows_of(store_uri: str, run_id: str, tmp_path: Path) -> dict[str, dict[str, Any]]:
    path = MlflowClient(store_uri).download_artifacts(run_id, "cases.jsonl", str(tmp_path / run_id))
    return {row["id"]: row for row in map(json.loads, Path(path).read_text(encoding="utf-8").splitlines())}


def test_default_run_is_the_sample_system_with_explainable_misses(ragexp: Any, store_uri: str, tmp_path: Path) -> None:
    text = ragexp("run")
    assert text.code == 0, text.stderr
    lines = text.stdout.splitlines()
    # Stage timings come after the summary table, in pipeline stages the system reported.
    summary_end = next(i for i, line in enumerate(lines) if line.startswith("error_rate"))
    stages = [line.split()[1] for line in lines[summary_end:] if line.startswith("stage ")]
    assert sorted(stages) == ["keyword", "model", "rerank"]
    assert "provider sample" in text.stdout

    payload = ragexp("run", "--json").json()
    summary = payload["summary"]
    # 30 answerable cases: three refused (recall 0), cancel-refund finds one of its two relevant ids.
    assert summary["recall_at_k"] == pytest.approx((26 + 0.5) / 30)
    assert summary["mrr"] == pytest.approx(27 / 30)
    # 35 cases: the three refusals and ship-xinjiang (right document, wrong sentence) miss.
    assert summary["answer_accuracy"] == pytest.approx(31 / 35)
    assert summary["citation_precision"] == pytest.approx(32 / 35)
    assert payload["error_count"] == 0

    rows = rows_of(store_uri, payload["run_id"], tmp_path)
    missed = {case for case, row in rows.items() if row["metrics"]["answer_accuracy"] == 0.0}
    assert missed == {*REFUSED, "ship-xinjiang"}
    for case in REFUSED:
        assert rows[case]["output"]["ranked_ids"] == [] and "没有足够证据" in rows[case]["output"]["answer"]
    xinjiang = rows["ship-xinjiang"]["output"]
    assert xinjiang["ranked_ids"][0] == "shipping-fee" and "10 元" not in xinjiang["answer"]
    assert all(row["metrics"]["answer_accuracy"] == 1.0 for row in rows.values() if row["unanswerable"])
    metrics = MlflowClient(store_uri).get_run(payload["run_id"]).data.metrics
    for stage in ("keyword", "rerank", "model"):
        assert metrics[f"timing.{stage}.p95_seconds"] >= metrics[f"timing.{stage}.p50_seconds"] > 0
        assert metrics[f"timing.{stage}.cases"] == 35
    assert all(row["latency_seconds"] > 0 for row in rows.values())


def test_deterministic_and_same_hash(ragexp: Any, store_uri: str, tmp_path: Path) -> None:
    first = ragexp("run", "--json").json()
    second = ragexp("run", "--json").json()
    assert first["config_hash"] == second["config_hash"] and first["summary"]["mrr"] == second["summary"]["mrr"]
    a, b = rows_of(store_uri, first["run_id"], tmp_path), rows_of(store_uri, second["run_id"], tmp_path)
    for case in a:
        for key in ("ranked_ids", "contexts", "answer", "citations"):
            assert a[case]["output"][key] == b[case]["output"][key]


def test_knobs_change_outputs_and_the_config_hash(ragexp: Any, store_uri: str, tmp_path: Path) -> None:
    base = ragexp("run", "--json").json()
    every = ragexp("run", "provider.system.sample.citations=all", "--json").json()
    none = ragexp("run", "provider.system.sample.citations=none", "--json").json()
    top1 = ragexp("run", "provider.system.sample.top_k=1", "--json").json()
    plain = ragexp("run", "provider.system.sample.rerank=false")
    assert plain.code == 0 and "stage rerank" not in plain.stdout and "stage keyword" in plain.stdout
    hashes = {r["config_hash"] for r in (base, every, none, top1)}
    assert len(hashes) == 4
    # Citing nothing: answerable cases score 0 on citation precision, unanswerable ones 1.
    assert none["summary"]["citation_precision"] == pytest.approx(5 / 35)
    assert none["summary"]["answer_accuracy"] == base["summary"]["answer_accuracy"]
    rows = rows_of(store_uri, every["run_id"], tmp_path)
    track = rows["ship-track"]["output"]
    assert track["citations"] == list(range(1, len(track["ranked_ids"]) + 1)) and len(track["citations"]) == 2
    assert track["answer"].endswith("[1][2]")
    assert every["summary"]["citation_precision"] < base["summary"]["citation_precision"]
    one = rows_of(store_uri, top1["run_id"], tmp_path)
    assert {len(row["output"]["ranked_ids"]) for row in one.values()} == {0, 1}
    assert top1["summary"]["recall_at_k"] == pytest.approx(26 / 30)  # cancel-refund's second id is gone


def test_docs_content_not_location_is_identity(tmp_path: Path) -> None:
    base = plan_run(compose([])).config_hash
    copy = tmp_path / "docs.jsonl"
    copy.write_text(DOCS.read_text(encoding="utf-8"), encoding="utf-8")
    assert plan_run(compose([f"provider.system.sample.docs={copy}"])).config_hash == base
    copy.write_text(DOCS.read_text(encoding="utf-8").replace("48 小时", "72 小时"), encoding="utf-8")
    assert plan_run(compose([f"provider.system.sample.docs={copy}"])).config_hash != base
    assert plan_run(compose(["provider.system.sample.threshold=2.5"])).config_hash != base
    # The block belongs to kind sample alone: other kinds neither have nor hash it.
    fake = compose(["provider=fake"])
    assert not hasattr(fake.provider.system, "sample")
    assert "sample" not in identity_view(fake)["provider"]["system"]
    assert identity_view(compose([]))["provider"]["system"]["sample"]["chunking"] == "doc"
    assert "docs" not in identity_view(compose([]))["provider"]["system"]["sample"]


def test_config_defaults_match_the_system_defaults() -> None:
    knobs, settings = SampleConfig(), Settings()
    for name in ("top_k", "rerank", "citations", "chunking", "threshold"):
        assert getattr(knobs, name) == getattr(settings, name), name
    assert compose([]).provider.system.sample == knobs


def test_bad_docs_and_foreign_dataset_are_refused_before_any_run(ragexp: Any, store_uri: str, tmp_path: Path) -> None:
    missing = ragexp("run", f"provider.system.sample.docs={tmp_path / 'nope.jsonl'}")
    assert missing.code == 1
    assert (
        missing.stderr.strip() == f"ragexp: error: provider.system.sample.docs: {tmp_path / 'nope.jsonl'}: no such file"
    )
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "text": "x"}\n{"id": "a", "text": "y"}\n', encoding="utf-8")
    dup = ragexp("run", f"provider.system.sample.docs={bad}")
    assert dup.code == 1 and f"{bad}:2: field 'id': duplicate id 'a' (first on line 1)" in dup.stderr
    foreign = ragexp("run", "dataset=scifacts_zh")
    assert foreign.code == 1 and "none of the 20 relevant ids of" in foreign.stderr
    assert "scifacts_zh/cases.jsonl is a document of" in foreign.stderr and "provider=replay" in foreign.stderr
    bad_knob = ragexp("run", "provider.system.sample.chunking=word")
    assert bad_knob.code == 1 and "provider.system.sample.chunking" in bad_knob.stderr
    assert len(bad_knob.stderr.strip().splitlines()) == 1
    assert MlflowClient(store_uri).get_experiment_by_name("ragexp") is None  # no run was created
    # Another dataset works once the system is pointed at its documents.
    data = write_jsonl(
        tmp_path / "cases.jsonl",
        [{"id": "q1", "question": "谁提出了相对论？", "relevant_ids": ["rel-1"], "expected_facts": ["爱因斯坦"]}],
    )
    corpus = ROOT / "ragexp/data/scifacts_zh/corpus.jsonl"
    own = ragexp("run", f"dataset.path={data}", f"provider.system.sample.docs={corpus}", "--json")
    assert own.code == 0, own.stderr
    assert own.json()["summary"]["recall_at_k"] == 1.0 and own.json()["summary"]["answer_accuracy"] == 1.0


@pytest.mark.parametrize(
    ("flags", "knobs"),
    [
        ([], []),
        (
            ["--chunking", "sentence", "--no-rerank", "--citations", "all", "--top-k", "3"],
            [
                "provider.system.sample.chunking=sentence",
                "provider.system.sample.rerank=false",
                "provider.system.sample.citations=all",
                "provider.system.sample.top_k=3",
            ],
        ),
    ],
)
def test_http_service_and_in_process_system_answer_alike(
    ragexp: Any, store_uri: str, tmp_path: Path, flags: list[str], knobs: list[str]
) -> None:
    with serve(SAMPLE, *flags) as url:
        served = ragexp("run", "provider=http", f"provider.system.url={url}", "--json").json()
    local = ragexp("run", *knobs, "--json").json()
    assert served["summary"] == pytest.approx({**local["summary"], "p95_seconds": served["summary"]["p95_seconds"]})
    a, b = rows_of(store_uri, served["run_id"], tmp_path), rows_of(store_uri, local["run_id"], tmp_path)
    for case in a:
        for key in ("ranked_ids", "contexts", "answer", "citations"):
            assert a[case]["output"][key] == b[case]["output"][key], (case, key)
        assert set(a[case]["output"]["timings"]) == set(b[case]["output"]["timings"])


def test_system_module_alone() -> None:
    system = SampleSystem(load_docs(DOCS))
    reply = system.answer("退款多久到账？", 5)
    assert reply["ranked_ids"][0] == "refund-arrival" and "1-3 个工作日" in reply["answer"]
    assert reply["citations"] == [1] and reply["answer"].endswith("[1]")
    with pytest.raises(ValueError, match="chunking"):
        Settings(chunking="word")


@pytest.mark.system
def test_demo_end_to_end(ragexp: Any, tmp_path: Path) -> None:
    folder = tmp_path / "demo"
    result = ragexp("demo", "--store", str(folder))
    assert result.code == 0, result.stderr
    out = result.stdout
    assert "exit 2: the gate FAILED, which is what this demo expects" in out
    assert "gate release: FAILED  (4 of 5 checks failed)" in out
    assert out.index("── 1/5") < out.index("── 2/5") < out.index("── 3/5") < out.index("── 4/5") < out.index("── 5/5")
    assert "mlflow ui --backend-store-uri sqlite:///" in out and "Compare" in out and "traces" in out
    assert out.splitlines()[-1].strip().endswith("report/report.html")

    uri = f"sqlite:///{folder.resolve()}/mlflow.db"
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("ragexp-demo")
    assert experiment is not None
    found = client.search_runs([experiment.experiment_id])
    runs = {r.info.run_name: r for r in found if "ragexp.attribution.of" not in r.data.tags}
    assert set(runs) == {"baseline: sample as shipped", "candidate: chunking=sentence"}
    base, cand = runs["baseline: sample as shipped"], runs["candidate: chunking=sentence"]
    # The diff step attributes the drop by replay: two swapped cells of the candidate, all retrieval's.
    cells = {r.data.tags["ragexp.attribution.cell"] for r in found if "ragexp.attribution.of" in r.data.tags}
    assert cells == {"candidate/baseline", "baseline/candidate"}
    assert "attribution by replay" in out and "cause retrieval" in out
    assert base.info.status == cand.info.status == "FINISHED"
    # Comparable: same dataset, K and metrics; the configs differ by the one knob alone.
    assert base.data.tags["ragexp.dataset_hash"] == cand.data.tags["ragexp.dataset_hash"]
    assert base.data.tags["ragexp.config_hash"] != cand.data.tags["ragexp.config_hash"]
    changed = {
        k
        for k in base.data.params.keys() | cand.data.params.keys()
        if base.data.params.get(k) != cand.data.params.get(k)
    }
    assert changed == {"provider.system.sample.chunking"}
    assert cand.data.tags["ragexp.gate.verdict"] == "failed"
    assert set(cand.data.tags["ragexp.gate.failures"].split(",")) == {
        "recall_at_k",
        "mrr",
        "citation_precision",
        "answer_accuracy",
    }
    diff = ragexp("diff", base.info.run_id, cand.info.run_id, "--tracking-uri", uri, "--json")
    assert diff.code == 0
    regressed = {c["id"] for c in diff.json()["cases"]}
    assert regressed == {"refund-fresh", "ship-track", "service-hours", "ship-address"}
    gate = ragexp("gate", "--baseline", base.info.run_id, "--candidate", cand.info.run_id, "--tracking-uri", uri)
    assert gate.code == 2
    assert (folder / "report/report.html").is_file()
    assert any(a.path == "report" for a in client.list_artifacts(cand.info.run_id))

    # A previous demo's folder is emptied and reused (in a new process, as a user would run it).
    script = Path(sys.executable).parent / "ragexp"
    again = subprocess.run([str(script), "demo", "--store", str(folder)], capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert "exit 2: the gate FAILED" in again.stdout
    ids = [
        line.split()[-1] for line in again.stdout.splitlines() if line.startswith(("baseline run:", "candidate run:"))
    ]
    assert len(ids) == 2 and not set(ids) & {base.info.run_id, cand.info.run_id}

    def runs(*flags: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(script), "runs", "--experiment", "ragexp-demo", "--tracking-uri", uri, *flags],
            capture_output=True,
            text=True,
            timeout=60,
        )

    # Only the new demo's runs: its two attribution cells are left out unless --cells, and counted.
    plain = runs("--json")
    assert plain.returncode == 0, plain.stderr
    assert {run["run_id"] for run in json.loads(plain.stdout)["runs"]} == set(ids)
    assert json.loads(plain.stdout)["cells_left_out"] == 2
    said = runs()
    assert said.returncode == 0, said.stderr
    assert "2 attribution cell run(s) of diff --attribute not listed (--cells lists them)" in said.stderr
    with_cells = json.loads(runs("--cells", "--json").stdout)
    listed = with_cells["runs"]
    cells = [run for run in listed if run["name"].startswith("attribution ")]
    assert {run["run_id"] for run in listed if run not in cells} == set(ids)
    assert len(listed) == 4 and len(cells) == 2 and with_cells["cells_left_out"] == 0
    other = tmp_path / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    refused = ragexp("demo", "--store", str(other))
    assert refused.code == 1 and "not made by ragexp demo" in refused.stderr
    assert (other / "notes.txt").read_text() == "keep me"
