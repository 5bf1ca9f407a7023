"""``ragexp sweep PARENT``: a sweep's points against a baseline with corrections for many
comparisons, their Pareto front over quality, p95 and cost, the recommendation, the plot."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from mlflow.tracking import MlflowClient

from ragexp.compare.figures import signed
from ragexp.stats.multiple import holm, simultaneous_level
from tests.conftest import ROOT, write_jsonl
from tests.servers.procs import serve

CHUNKING = "provider.system.sample.chunking"
QUALITY = "metrics.names=[recall_at_k,mrr,answer_accuracy,error_rate]"
"""The in-process sample system answers in microseconds of timer noise: its p95 is left out, so
the front is decided by what the test controls (a replayed sweep below has p95 on its front)."""


def test_holm_and_bonferroni_levels() -> None:
    # sorted 0.005, 0.01, 0.03, 0.04 -> x4, x3, x2, x1 = 0.02, 0.03, 0.06, 0.04 -> monotone 0.06
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])
    assert holm([]) == []
    assert simultaneous_level(0.95, 10) == pytest.approx(0.995)
    assert simultaneous_level(0.95, 0) == pytest.approx(0.95)


def delta_cell(delta: dict[str, Any]) -> str:
    mark = "*" if delta["significant"] else ""
    return f"{signed(delta['delta'])}{mark} [{signed(delta['ci_low'])}, {signed(delta['ci_high'])}]"


def sweep_of(ragexp: Any, *overrides: str) -> tuple[str, list[dict[str, Any]]]:
    done = ragexp("run", "-m", *overrides, "--json")
    assert done.code == 0, done.stderr
    payload = done.json()
    return payload["sweep"], payload["runs"]


@pytest.fixture
def three_points(ragexp: Any) -> tuple[str, list[dict[str, Any]]]:
    # On evidence gold, which windows can match (on chunk-id gold a window run is refused); windows
    # of 12 characters cut most answers apart.
    spans = ("dataset=kb_zh_spans", "provider.system.sample.chunk_chars=12")
    return sweep_of(ragexp, QUALITY, *spans, f"{CHUNKING}=doc,sentence,window")


@pytest.mark.system  # a whole run: `make test`, not the edit loop
def test_a_three_point_sample_sweep_lists_its_points_with_their_pareto_flags(
    ragexp: Any, store_uri: str, tmp_path: Path, three_points: tuple[str, list[dict[str, Any]]]
) -> None:
    parent, runs = three_points
    doc, sentence, window = (run["run_id"] for run in runs)
    result = ragexp("sweep", parent, "--json")
    assert result.code == 0, result.stderr
    found = result.json()
    assert found["baseline"] == doc and found["metric"] == "recall_at_k"
    assert [p["run_id"] for p in found["points"]] == [doc, sentence, window]
    assert [p["overrides"] for p in found["points"]] == [f"{CHUNKING}={v}" for v in ("doc", "sentence", "window")]
    by_id = {p["run_id"]: p for p in found["points"]}
    # doc: the best recall; 12-character windows find under half the evidence, significantly worse
    # than doc; sentence is worse than doc as measured, but its deficit is within the pairwise interval.
    assert found["objectives"] == ["recall_at_k"]
    assert set(found["left_out"]) == {"p95_seconds", "cost"}
    recalls = [by_id[r]["metrics"]["recall_at_k"] for r in (doc, sentence, window)]
    assert recalls == pytest.approx([53 / 60, 47 / 60, 28 / 60])
    assert (by_id[doc]["pareto"], by_id[doc]["dominated"], by_id[doc]["status"]) == (True, False, "front")
    assert by_id[window]["status"] == "dominated" and by_id[window]["dominated"] is True
    assert by_id[window]["dominated_by"] == doc and by_id[window]["pareto"] is False
    assert by_id[sentence]["status"] == "indistinguishable" and by_id[sentence]["dominated_by"] == doc
    assert (by_id[sentence]["pareto"], by_id[sentence]["dominated"]) == (False, False)
    assert found["front"] == [doc]

    # The deltas: what `diff` computes for each pair, at the simultaneous level, Holm-adjusted.
    family = found["family"]
    quality = ["recall_at_k", "mrr", "answer_accuracy"]
    assert family["tests"] == 2 * len(quality)
    assert family["level"] == pytest.approx(1 - 0.05 / family["tests"])
    assert by_id[doc]["deltas"] == {}
    raw = []
    for run_id in (sentence, window):
        diff = ragexp("diff", doc, run_id, "--confidence", str(family["level"]), "--allow-incomparable", "--json")
        metrics = {m["name"]: m for m in diff.json()["metrics"]}
        for name in quality:
            delta = by_id[run_id]["deltas"][name]
            assert delta["delta"] == pytest.approx(metrics[name]["delta"])
            assert (delta["ci_low"], delta["ci_high"]) == pytest.approx(
                (metrics[name]["ci_low"], metrics[name]["ci_high"])
            )
            assert delta["p_value"] == pytest.approx(metrics[name]["p_value"])
            raw.append(delta["p_value"])
    adjusted = [by_id[r]["deltas"][n]["p_holm"] for r in (sentence, window) for n in quality]
    assert adjusted == pytest.approx(holm(raw))
    assert by_id[window]["deltas"]["recall_at_k"]["significant"] is True
    assert by_id[window]["deltas"]["recall_at_k"]["delta"] == pytest.approx(28 / 60 - 53 / 60)

    # The recommendation: doc, and the sweep says its lead over sentence is not significant.
    recommendation = found["recommendation"]
    assert recommendation["run_id"] == doc and recommendation["metric"] == "recall_at_k"
    assert recommendation["runner_up"]["run_id"] == sentence
    assert recommendation["significant"] is False and sentence in recommendation["tied"]
    assert recommendation["runner_up"]["ci_low"] <= 0 < recommendation["runner_up"]["delta"]
    assert "is not significant" in recommendation["text"]

    # The table a person reads: every point, its flag, the recommendation.
    shown = ragexp("sweep", parent)
    assert shown.code == 0, shown.stderr
    rows = {line.split()[0]: line for line in shown.stdout.splitlines() if line[:1].isdigit()}
    assert "on the front" in rows["0"] and "dominated (with confidence)" in rows["2"]
    assert f"{CHUNKING}=sentence" in rows["1"] and "not distinguishable from the front" in rows["1"]
    assert "recommendation: point 0 [" in shown.stdout and "is not significant" in shown.stdout
    assert "Bonferroni" in shown.stdout and "Holm" in shown.stdout
    # Each difference from the baseline: * where significant, then its interval; the baseline's row says so.
    assert delta_cell(by_id[window]["deltas"]["recall_at_k"]) in rows["2"] and "baseline" in rows["0"]

    # Logged to the parent run: the analysis as --json prints it, and the plot of the front.
    client = MlflowClient(store_uri)
    logged = {a.path for a in client.list_artifacts(parent, "sweep")}
    assert logged == {"sweep/sweep.json", "sweep/front.png"}
    saved = json.loads(Path(client.download_artifacts(parent, "sweep/sweep.json", str(tmp_path))).read_text())
    assert saved == json.loads(shown_json(ragexp, parent))
    png = Path(client.download_artifacts(parent, "sweep/front.png", str(tmp_path)))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def shown_json(ragexp: Any, parent: str, *args: str) -> str:
    result = ragexp("sweep", parent, *args, "--json")
    assert result.code == 0, result.stderr
    return str(result.stdout)


@pytest.mark.system  # a whole run: `make test`, not the edit loop
def test_another_baseline_a_quality_axis_and_bad_input(
    ragexp: Any, three_points: tuple[str, list[dict[str, Any]]]
) -> None:
    parent, runs = three_points
    doc, _, window = (run["run_id"] for run in runs)
    found = json.loads(shown_json(ragexp, parent, "--baseline", window, "--metric", "mrr"))
    assert found["baseline"] == window and found["metric"] == "mrr"
    by_id = {p["run_id"]: p for p in found["points"]}
    assert by_id[window]["deltas"] == {} and by_id[doc]["deltas"]["mrr"]["significant"] is True
    assert by_id[doc]["deltas"]["mrr"]["ci_low"] > 0

    not_a_sweep = ragexp("sweep", doc)
    assert not_a_sweep.code == 1
    assert not_a_sweep.stderr.splitlines() == [
        f"ragexp: error: run {doc} is not the parent run of a sweep (`ragexp run -m`; no ragexp.sweep.role tag)"
    ]
    unknown = ragexp("sweep", parent, "--metric", "p95_seconds")
    assert unknown.code == 1 and len(unknown.stderr.splitlines()) == 1
    assert "--metric p95_seconds: not a per-case quality metric every point has" in unknown.stderr


@pytest.mark.system  # a whole run: `make test`, not the edit loop
def test_the_sweep_report(
    ragexp: Any, store_uri: str, tmp_path: Path, three_points: tuple[str, list[dict[str, Any]]]
) -> None:
    parent, runs = three_points
    doc, sentence, window = (run["run_id"] for run in runs)
    done = ragexp("report", "--sweep", parent, "--out", str(tmp_path / "en"), "--language", "en")
    assert done.code == 0, done.stderr
    assert f"logged to run {parent} under report/" in done.stdout
    text = (tmp_path / "en/report.md").read_text(encoding="utf-8")
    rows = {
        line.split("|")[3].strip(): line
        for line in text.splitlines()
        if line.startswith("| ") and "run" not in line[:40]
    }
    assert "on the front" in rows[doc] and "dominated (with confidence)" in rows[window]
    assert "not distinguishable from the front" in rows[sentence]
    window_recall = json.loads(shown_json(ragexp, parent))["points"][2]["deltas"]["recall_at_k"]
    plain = {run_id: row.replace("\\", "") for run_id, row in rows.items()}  # Markdown's escapes undone
    assert delta_cell(window_recall) in plain[window] and "| - | - |" in plain[doc]
    assert "## Recommendation" in text and "is not significant" in text
    svg = (tmp_path / "en/plots/front.svg").read_text(encoding="utf-8")
    assert svg.startswith("<svg") and "chunking=window" in svg
    assert "<svg" in (tmp_path / "en/report.html").read_text(encoding="utf-8")
    logged = {a.path for a in MlflowClient(store_uri).list_artifacts(parent, "report")}
    assert {"report/report.md", "report/report.html", "report/plots"} <= logged
    # Chinese by default (the baseline's report.language).
    zh = ragexp("report", "--sweep", parent, "--out", str(tmp_path / "zh"))
    assert zh.code == 0, zh.stderr
    assert "## 帕累托前沿" in (tmp_path / "zh/report.md").read_text(encoding="utf-8")
    for args in ([], [doc, "--sweep", parent]):
        refused = ragexp("report", *args)
        assert refused.code == 1 and refused.stderr.splitlines() == [
            "ragexp: error: ragexp report: give a run id, or --sweep PARENT_RUN (one of them)"
        ]


@pytest.mark.system  # a whole run: `make test`, not the edit loop
def test_a_significant_winner_is_said_to_be_one(ragexp: Any) -> None:
    spans = ("dataset=kb_zh_spans", "provider.system.sample.chunk_chars=12")
    parent, runs = sweep_of(ragexp, QUALITY, *spans, f"{CHUNKING}=window,doc")
    window, doc = (run["run_id"] for run in runs)
    found = json.loads(shown_json(ragexp, parent))
    recommendation = found["recommendation"]
    assert recommendation["run_id"] == doc and recommendation["significant"] is True
    assert recommendation["runner_up"]["run_id"] == window and recommendation["runner_up"]["ci_low"] > 0
    assert "the lead is significant" in recommendation["text"] and recommendation["tied"] == []


@pytest.mark.system  # a whole run: `make test`, not the edit loop
def test_cost_is_an_objective_of_the_front(ragexp: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAGEXP_OPENAI_AUTH", "Bearer sk-standin")
    rows = [
        {"id": f"c{n}", "question": f"what about {n}?", "relevant_ids": [f"seg-{n}"], "expected_facts": [f"fact {n}"]}
        for n in range(1, 5)
    ]
    data = write_jsonl(tmp_path / "cases.jsonl", rows)
    with serve(ROOT / "tests/servers/openai_chat.py") as url:
        parent, runs = sweep_of(
            ragexp,
            "system=openai_chat",
            f"provider.system.url={url}/v1/chat/completions",
            "provider.system.request.model=standin-model",
            f"dataset.path={data}",
            "metrics.names=[answer_accuracy,error_rate]",
            "cost.prices={system: {prompt: 1, completion: 1}}",
            "cost.prices.system.prompt=9,1",
        )
    dear, cheap = (run["run_id"] for run in runs)
    found = json.loads(shown_json(ragexp, parent))
    assert found["objectives"] == ["answer_accuracy", "cost"]
    by_id = {p["run_id"]: p for p in found["points"]}
    assert by_id[cheap]["metrics"]["cost"] < by_id[dear]["metrics"]["cost"]
    assert by_id[dear]["metrics"]["answer_accuracy"] == by_id[cheap]["metrics"]["answer_accuracy"] == 1.0
    # Dearer at the same quality: off the front as measured, but not dominated "with confidence"
    # (no quality difference to be confident about).
    assert by_id[dear]["status"] == "indistinguishable" and by_id[dear]["dominated_by"] == cheap
    assert found["front"] == [cheap] and by_id[dear]["dominated"] is False
    recommendation = found["recommendation"]
    assert recommendation["run_id"] == cheap and recommendation["significant"] is False
    assert recommendation["tied"] == [dear]


@pytest.mark.system  # a whole run: `make test`, not the edit loop
def test_p95_is_an_objective_of_a_replayed_sweep(ragexp: Any, tmp_path: Path) -> None:
    # Replayed outputs carry their recorded latency: the same p95 for every point, so only
    # recall decides; p95 is on the front's axes.
    rows = [
        {
            "id": f"q{n}",
            "question": f"question {n}",
            "relevant_ids": [f"d{n}"],
            "retrieved_ids": [f"x{n}", f"d{n}"],
            "response": "an answer",
            "latency_seconds": 0.1 * n,
        }
        for n in range(1, 9)
    ]
    data = write_jsonl(tmp_path / "replay.jsonl", rows)
    parent, runs = sweep_of(
        ragexp, "provider=replay", f"dataset.path={data}", "dataset.name=replayed", "metrics=retrieval", "k=1,2"
    )
    found = json.loads(shown_json(ragexp, parent))
    assert found["objectives"][1:] == ["p95_seconds"]
    k1, k2 = (run["run_id"] for run in runs)
    by_id = {p["run_id"]: p for p in found["points"]}
    assert by_id[k1]["metrics"]["p95_seconds"] == by_id[k2]["metrics"]["p95_seconds"] == pytest.approx(0.8)
    assert found["front"] == [k2] and by_id[k1]["status"] == "dominated"


@pytest.mark.system  # a whole run: `make test`, not the edit loop
def test_confirm_chooses_on_the_rest_and_gates_a_run_on_the_held_out_cases(
    ragexp: Any, store_uri: str, tmp_path: Path
) -> None:
    # The release gate without its latency and citation rules (the sample's p95 is timer noise,
    # and its citations sit below the .97 floor): the rules left bound recall, MRR and accuracy.
    parent, runs = sweep_of(
        ragexp, QUALITY, "~gates.rules.p95_seconds", "~gates.rules.citation_precision", f"{CHUNKING}=sentence,doc"
    )
    sentence, doc = (run["run_id"] for run in runs)
    done = ragexp("sweep", parent, "--confirm", "0.4", "--json")
    assert done.code in (0, 2), done.stderr
    found = done.json()
    confirm = found["confirm"]
    assert found["recommendation"]["run_id"] == doc and found["baseline"] == sentence
    assert (confirm["fraction"], confirm["chosen_on"], confirm["held_out"]) == (0.4, 21, 14)
    client = MlflowClient(store_uri)
    run = client.get_run(confirm["run_id"])
    assert run.data.tags["ragexp.sweep.confirm"] == parent and run.data.tags["ragexp.sweep.confirm_of"] == doc
    assert run.data.tags["mlflow.parentRunId"] == parent and "ragexp.sweep" not in run.data.tags
    held = set(rows_of(client, confirm["run_id"], tmp_path / "held"))
    assert len(held) == 14 and run.data.metrics["case_count"] == 14
    # The choice saw only the other 21 cases: each point's figures are theirs.
    doc_rows = rows_of(client, doc, tmp_path / "doc")
    chosen = [row for case_id, row in doc_rows.items() if case_id not in held]
    recall = [row["metrics"]["recall_at_k"] for row in chosen if not row["unanswerable"]]
    by_id = {p["run_id"]: p for p in found["points"]}
    assert by_id[doc]["metrics"]["recall_at_k"] == pytest.approx(sum(recall) / len(recall))
    assert by_id[doc]["cases"] == 21
    # Gated like any candidate: what `ragexp gate` says of the pair, recorded on the confirm run.
    gate = ragexp(
        "gate",
        "--baseline",
        sentence,
        "--candidate",
        confirm["run_id"],
        "--allow-incomparable",
        "~gates.rules.p95_seconds",
        "~gates.rules.citation_precision",
        "--json",
    )
    assert gate.json()["passed"] == confirm["passed"] and done.code == (0 if confirm["passed"] else 2)
    assert [r["outcome"] for r in gate.json()["rules"]] == [r["outcome"] for r in confirm["gate"]["rules"]]
    assert {r["metric"] for r in confirm["gate"]["rules"]} == {"error_rate", "recall_at_k", "mrr", "answer_accuracy"}
    assert client.get_run(confirm["run_id"]).data.tags["ragexp.gate.baseline"] == sentence
    # The confirm gate pairs the baseline's held-out cases with the confirm run's: its means and
    # change are over those 14 cases (the answerable ones, for recall), never the baseline's 35.
    base_rows, held_rows = (
        rows_of(client, sentence, tmp_path / "base"),
        rows_of(client, confirm["run_id"], tmp_path / "c"),
    )
    on_held = [case_id for case_id in held_rows if not held_rows[case_id]["unanswerable"]]
    rule = next(r for r in confirm["gate"]["rules"] if (r["metric"], r["rule"]) == ("recall_at_k", "max_drop"))
    b_held = sum(base_rows[c]["metrics"]["recall_at_k"] for c in on_held) / len(on_held)
    c_held = sum(held_rows[c]["metrics"]["recall_at_k"] for c in on_held) / len(on_held)
    assert (rule["baseline"], rule["candidate"]) == pytest.approx((b_held, c_held))
    assert f"{len(on_held)} of " in rule["population"] and "not in the candidate's cases" in rule["population"]
    # The confirm run is no point of the sweep.
    again = json.loads(shown_json(ragexp, parent))
    assert [p["run_id"] for p in again["points"]] == [sentence, doc] and again["confirm"] is None
    # A winner that is the baseline has nothing to be confirmed against.
    same = json.loads(shown_json(ragexp, parent, "--baseline", doc, "--confirm", "0.4"))
    assert same["confirm"]["run_id"] is None and "the winner is the baseline" in same["confirm"]["skipped"]
    for bad, said in (("1.5", "between 0 and 1"), ("0.01", "both parts need at least 2")):
        refused = ragexp("sweep", parent, "--confirm", bad)
        assert refused.code == 1 and said in refused.stderr and len(refused.stderr.splitlines()) == 1


def rows_of(client: MlflowClient, run_id: str, folder: Path) -> dict[str, dict[str, Any]]:
    path = Path(client.download_artifacts(run_id, "cases.jsonl", str(folder)))
    return {row["id"]: row for row in map(json.loads, path.read_text(encoding="utf-8").splitlines())}


@pytest.mark.system  # a whole run: `make test`, not the edit loop
def test_dataset_case_ids_runs_only_those_cases(ragexp: Any, store_uri: str) -> None:
    done = ragexp("run", "dataset.case_ids=[refund-deadline,refund-bankcard]", "--json")
    assert done.code == 0, done.stderr
    run = MlflowClient(store_uri).get_run(done.json()["run_id"])
    assert run.data.metrics["case_count"] == 2
    whole = ragexp("run", "--json")
    assert whole.json()["config_hash"] != done.json()["config_hash"]
    assert (
        run.data.tags["ragexp.dataset_hash"]
        != MlflowClient(store_uri).get_run(whole.json()["run_id"]).data.tags["ragexp.dataset_hash"]
    )
    refused = ragexp("run", "dataset.case_ids=[refund-deadline,nope]")
    assert refused.code == 1 and refused.stderr.splitlines() == [
        f"ragexp: error: config: dataset.case_ids: no case 'nope' in {ROOT / 'ragexp/data/kb_zh/cases.jsonl'}"
    ]


@pytest.mark.system  # a whole run: `make test`, not the edit loop
def test_confirm_holds_out_whole_conversations(ragexp: Any, store_uri: str, tmp_path: Path) -> None:
    parent, _ = sweep_of(
        ragexp,
        "dataset=kb_zh_chat",
        QUALITY,
        "~gates.rules.p95_seconds",
        "~gates.rules.citation_precision",
        "k=1,3",
    )
    done = ragexp("sweep", parent, "--confirm", "0.4", "--json")
    assert done.code in (0, 2), done.stderr
    confirm = done.json()["confirm"]
    assert confirm["run_id"] is not None, (confirm, done.json()["recommendation"])
    client = MlflowClient(store_uri)
    winner = rows_of(client, done.json()["recommendation"]["run_id"], tmp_path / "winner")
    held = rows_of(client, confirm["run_id"], tmp_path / "held")
    turns: dict[str, list[str]] = {}
    for key, row in winner.items():
        turns.setdefault(row["conversation"], []).append(key)
    held_chats = {row["conversation"] for row in held.values()}
    assert 2 <= len(held_chats) <= len(turns) - 2
    # Every held-out conversation whole, the others wholly among the cases the choice saw.
    assert sorted(held) == sorted(key for chat in held_chats for key in turns[chat])
    assert confirm["chosen_on"] + confirm["held_out"] == len(winner)
    # Asked as in the winner's own run (each turn after its earlier turns): the same scores.
    assert all(row["metrics"] == winner[key]["metrics"] for key, row in held.items())


@pytest.mark.system  # a whole run: `make test`, not the edit loop
def test_an_interrupted_confirm_says_how_to_continue_and_the_rerun_resumes_it(
    ragexp: Any, store_uri: str, tmp_path: Path
) -> None:
    from tests.pipelines import chat

    singles = [{"id": f"s-{doc}", "question": chat.DOCS[doc][:8], "relevant_ids": [doc]} for doc in chat.DOCS]
    talks = [
        {
            "id": f"c{n}",
            "turns": [
                {"question": "退货怎么办？", "relevant_ids": ["return-policy"]},
                {"question": "那运费呢？", "relevant_ids": ["return-fee"]},
            ],
        }
        for n in range(4)
    ]
    data = write_jsonl(tmp_path / "chats.jsonl", singles + talks)
    chat.INTERRUPT.clear()
    # Chosen: the pipeline that reads each follow-up after the questions before it.
    targets = "provider.system.target=tests.pipelines.chat:forgets,tests.pipelines.chat:remembers"
    system = ["system=python", targets, "concurrency=1", "k=1", "metrics.names=[recall_at_k,mrr]"]
    parent, _ = sweep_of(
        ragexp, f"dataset.path={data}", *system, "~gates.rules", "+gates.rules={recall_at_k:{max_drop:0.5}}"
    )
    chat.INTERRUPT.update(f"c{n}#2" for n in range(4))  # the first follow-up the confirm run asks
    before = dict(chat.CALLS)
    first = ragexp("sweep", parent, "--confirm", "0.4")
    chat.INTERRUPT.clear()
    assert first.code == 130, first.stderr
    (line,) = first.stderr.strip().splitlines()[-1:]
    assert line.endswith(
        f"; continue with: ragexp sweep {parent} --confidence 0.95 --resamples 10000 --seed 0 --confirm 0.4"
    )
    asked = {key: chat.CALLS[key] - before.get(key, 0) for key in chat.CALLS}
    (cut,) = [key for key in asked if key.endswith("#2") and asked[key]]
    answered = {key for key in asked if asked[key] and key.split("#")[0] != cut.split("#")[0]}
    assert answered  # some held-out cases were answered before the cut
    client = MlflowClient(store_uri)
    experiment = client.get_experiment_by_name("ragexp").experiment_id
    (stopped,) = client.search_runs([experiment], "tags.`ragexp.sweep.confirm` = '" + parent + "'")
    assert stopped.info.status == "KILLED"
    before = dict(chat.CALLS)
    again = ragexp("sweep", parent, "--confirm", "0.4", "--json")
    assert again.code in (0, 2), again.stderr
    assert again.json()["confirm"]["run_id"] == stopped.info.run_id
    assert f"continuing run {stopped.info.run_id}" in again.stderr
    repeated = {key: chat.CALLS[key] - before.get(key, 0) for key in chat.CALLS}
    assert all(repeated.get(key, 0) == 0 for key in answered)  # kept, not asked again
    held = rows_of(client, stopped.info.run_id, tmp_path / "resumed")
    assert answered < set(held) and cut in held and len(held) == again.json()["confirm"]["held_out"]
    # A third time: the finished confirm run is gated as it is, nothing asked.
    before = dict(chat.CALLS)
    third = ragexp("sweep", parent, "--confirm", "0.4", "--json")
    assert third.json()["confirm"]["run_id"] == stopped.info.run_id and dict(chat.CALLS) == before
