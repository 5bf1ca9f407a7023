"""Stage attribution (``diff --attribute``): the decomposition, generation from given contexts,
and the replay workflow end to end on real runs in a SQLite MLflow store."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from ragexp.stats.attribution import Cells, bootstrap_intervals, case_causes, decompose


def _cells(bb: list[float], cb: list[float], bc: list[float], cc: list[float]) -> Cells:
    return Cells(*(np.array(values, dtype=np.float64) for values in (bb, cb, bc, cc)))


def test_parts_add_up_to_the_total_for_every_case_and_on_average() -> None:
    rng = np.random.default_rng(3)
    cells = Cells(*(rng.random(200) for _ in range(4)))
    parts = cells.parts()
    assert np.allclose(parts["retrieval"] + parts["generation"] + parts["interaction"], parts["total"], atol=1e-12)
    found = decompose(cells, resamples=500, confidence=0.95, seed=0)
    assert found is not None and found.n == 200
    assert found.retrieval + found.generation + found.interaction == pytest.approx(found.total, abs=1e-12)
    assert found.total == pytest.approx(float((cells.cc - cells.bb).mean()))
    for low, high in (found.retrieval_ci, found.generation_ci, found.interaction_ci, found.total_ci):
        assert low < high


def test_known_interaction_of_a_2x2() -> None:
    # Either change alone keeps the answer right; both together break it: pure interaction.
    cells = _cells([1, 1, 0], [1, 0, 0], [1, 1, 1], [0, 0, 1])
    parts = cells.parts()
    assert parts["retrieval"].tolist() == [0, -1, 0]
    assert parts["generation"].tolist() == [0, 0, 1]
    assert parts["interaction"].tolist() == [-1, 0, 0]
    assert case_causes([cells]) == ["neither", "retrieval", "generation"]
    found = decompose(cells, resamples=200, confidence=0.9, seed=1)
    assert found is not None
    assert (found.total, found.retrieval, found.generation, found.interaction) == pytest.approx(
        (-1 / 3, -1 / 3, 1 / 3, -1 / 3)
    )


def test_a_part_that_is_zero_for_every_case_is_exactly_zero_with_a_zero_interval() -> None:
    cells = _cells([1, 0, 1, 1], [1, 0, 1, 1], [0, 1, 0, 1], [0, 1, 0, 1])
    found = decompose(cells, resamples=300, confidence=0.95, seed=0)
    assert found is not None
    assert found.retrieval == 0.0 and found.retrieval_ci == (0.0, 0.0)
    assert found.interaction == 0.0 and found.interaction_ci == (0.0, 0.0)
    assert found.generation == found.total == -0.25
    assert case_causes([cells]) == ["generation", "generation", "generation", None]


def test_a_missing_cell_leaves_its_case_out_never_zero() -> None:
    cells = _cells([1, 1], [np.nan, 1], [0, 1], [0, 0])
    found = decompose(cells, resamples=200, confidence=0.95, seed=0)
    assert found is not None and found.n == 1 and found.total == -1.0
    assert case_causes([cells]) == [None, "neither"]
    assert decompose(_cells([np.nan], [1], [1], [1]), resamples=200, confidence=0.95, seed=0) is None


def test_both_swaps_moving_a_case_is_both() -> None:
    assert case_causes([_cells([1], [0], [0], [0])]) == ["both"]


def test_bootstrap_is_paired_and_covers_the_mean() -> None:
    rng = np.random.default_rng(0)
    values = rng.normal(0.3, 1.0, size=400)
    rows = np.vstack([values, values * 2])
    (low_a, high_a), (low_b, high_b) = bootstrap_intervals(rows, resamples=2000, confidence=0.95, seed=5)
    assert low_a < values.mean() < high_a
    # The same case weights for both rows: the second interval is exactly twice the first.
    assert (low_b, high_b) == pytest.approx((2 * low_a, 2 * high_a))
    # The interval's width is that of the mean's standard error (about 2 x 1.96 x 1/sqrt(400)).
    assert 0.15 < high_a - low_a < 0.25
    again = bootstrap_intervals(rows, resamples=2000, confidence=0.95, seed=5)
    assert again[0] == (low_a, high_a)


# --- the workflow, on the sample system in a real SQLite store ---------------------------------


def _run(ragexp: Any, *overrides: str) -> str:
    found = ragexp("run", *overrides, "--json")
    assert found.code == 0, found.stderr
    return str(found.json()["run_id"])


def _attributed(ragexp: Any, base: str, cand: str) -> dict[str, Any]:
    found = ragexp("diff", base, cand, "--attribute", "--json", "--resamples", "500")
    assert found.code == 0, found.stderr
    return dict(found.json()["attribution"])


def _metric(found: dict[str, Any], name: str) -> dict[str, Any]:
    return next(row for row in found["metrics"] if row["name"] == name)


@pytest.mark.system  # a whole run: `make test`, not the edit loop
def test_sample_pair_only_the_generator_changed(ragexp: Any, store_uri: str, tmp_path: Path) -> None:
    base = _run(ragexp)
    cand = _run(ragexp, "provider.system.sample.citations=none")
    # The report measures the attribution when diff has not recorded one, and records it.
    out = tmp_path / "report"
    made = ragexp("report", cand, "--baseline", base, "--attribute", "--out", str(out), "--language", "en")
    assert made.code == 0, made.stderr
    text = (out / "report.md").read_text(encoding="utf-8")
    assert "### Attribution by replay" in text and "plots/attribution.svg" in text
    assert "| generation | " in text and (out / "plots" / "attribution.svg").is_file()
    page = (out / "report.html").read_text(encoding="utf-8")
    assert "Attribution by replay" in page and page.count("<svg") >= 2
    from mlflow.tracking import MlflowClient

    kept = MlflowClient(store_uri).download_artifacts(cand, f"comparisons/{base}/attribution.json", str(tmp_path))
    recorded = json.loads(Path(kept).read_text(encoding="utf-8"))
    assert _metric(recorded, "citation_precision")["retrieval"] == 0.0
    found = _attributed(ragexp, base, cand)
    assert found["replayed"] == 0  # the same retrieval in every case: the cells are the runs
    row = _metric(found, "citation_precision")
    assert row["total"] < 0 and row["retrieval"] == 0.0 and row["retrieval_ci"] == [0.0, 0.0]
    assert row["interaction"] == 0.0 and row["generation"] == row["total"]
    assert {case["cause"] for case in found["cases"]} == {"generation"}
    assert _metric(found, "recall_at_k")["total"] == 0.0


def test_sample_pair_only_retrieval_changed_the_demo_chunking_pair(ragexp: Any, store_uri: str) -> None:
    from mlflow.tracking import MlflowClient

    from ragexp.workflows.demo import KNOB

    base = _run(ragexp)
    cand = _run(ragexp, KNOB)
    whole = ragexp("diff", base, cand, "--attribute", "--json", "--resamples", "500")
    assert whole.code == 0, whole.stderr
    found = whole.json()["attribution"]
    assert found["replayed"] > 0 and not found["errors"]
    # One verdict per metric: the attribution's total is the diff row's delta, with its interval.
    rows = {m["name"]: m for m in whole.json()["metrics"]}
    for row in found["metrics"]:
        if row["total"] is not None:
            compared = rows[row["name"]]
            assert row["cases"] == compared["pairing"]["pairs"], row["name"]
            assert row["total"] == pytest.approx(compared["delta"], abs=1e-12), row["name"]
            assert row["total_ci"] == [compared["ci_low"], compared["ci_high"]], row["name"]
    for name in ("answer_accuracy", "citation_precision"):
        row = _metric(found, name)
        assert row["generation"] == 0.0 and row["generation_ci"] == [0.0, 0.0] and row["interaction"] == 0.0
        assert row["retrieval"] == pytest.approx(row["total"], abs=1e-12)
    assert _metric(found, "answer_accuracy")["total"] != 0.0
    assert found["cases"] and {case["cause"] for case in found["cases"]} == {"retrieval"}
    recall = _metric(found, "recall_at_k")
    assert recall["by_definition"] and recall["retrieval"] == recall["total"] and recall["generation"] == 0.0
    # The swapped cells are runs of their own, tagged for the MLflow UI; the result is on the candidate.
    client = MlflowClient(store_uri)
    for cell, run_id in found["cells"].items():
        tags = client.get_run(run_id).data.tags
        assert tags["ragexp.attribution.of"] == cand and tags["ragexp.attribution.cell"] == cell
        # A cell holds the replayed cases alone, and its tags say so.
        assert tags["ragexp.case_count"] == str(found["replayed"])
        assert tags["ragexp.cases_hash"] != client.get_run(cand).data.tags["ragexp.cases_hash"]
    assert set(found["cells"]) == {"candidate/baseline", "baseline/candidate"}
    kept = client.download_artifacts(cand, f"comparisons/{base}/attribution.json")
    assert json.loads(Path(kept).read_text(encoding="utf-8"))["metrics"] == found["metrics"]
    text = ragexp("diff", base, cand, "--attribute", "--resamples", "500")
    assert text.code == 0, text.stderr
    assert "attribution by replay" in text.stdout and "cause retrieval" in text.stdout
    assert "likely stage (a heuristic, from the decision table" in text.stdout
    # The cells are newer than the candidate, but a gate never takes one for the candidate.
    gate = ragexp("gate", "--baseline", base, "--json")
    assert gate.code in (0, 2), gate.stderr
    assert gate.json()["candidate"] == cand


def test_a_system_that_cannot_generate_is_refused_in_one_line(ragexp: Any, store_uri: str) -> None:
    base = _run(ragexp, "provider=fake")
    cand = _run(ragexp, "provider=fake")
    found = ragexp("diff", base, cand, "--attribute")
    assert found.code == 1
    assert found.stderr.strip().count("\n") == 0
    assert "--attribute: the baseline's system" in found.stderr and "cannot answer from given contexts" in found.stderr
    plain = ragexp("diff", base, cand)
    assert plain.code == 0 and "attribution" not in plain.stdout


def test_conversations_are_refused_in_one_line_before_any_replay(ragexp: Any, store_uri: str) -> None:
    from mlflow.tracking import MlflowClient

    base = _run(ragexp, "dataset=kb_zh_chat")
    cand = _run(ragexp, "dataset=kb_zh_chat", "provider.system.sample.chunking=sentence")
    found = ragexp("diff", base, cand, "--attribute")
    assert found.code == 1
    assert found.stderr.strip().splitlines() == [
        f"ragexp: error: --attribute: the baseline run {base} holds conversations (16): a turn cannot be replayed "
        "without the turns before it; compare them without --attribute"
    ]
    client = MlflowClient(store_uri)
    runs = client.search_runs([client.get_experiment_by_name("ragexp").experiment_id])
    assert {run.info.run_id for run in runs} == {base, cand}  # no cell run
    assert ragexp("diff", base, cand).code == 0


# --- a Python pair and an HTTP pair with a known interaction ---------------------------------


@pytest.fixture
def corpus_cases(tmp_path: Path) -> Path:
    from tests.conftest import write_jsonl
    from tests.pipelines.corpus import CASES

    return write_jsonl(tmp_path / "cases.jsonl", CASES)


KNOWN = {"total": -2 / 3, "retrieval": -2 / 3, "generation": -1 / 3, "interaction": 1 / 3}
CAUSES_KNOWN = {"password": "retrieval", "shipping": "generation"}


def _check_known(found: dict[str, Any]) -> None:
    row = _metric(found, "answer_accuracy")
    assert row["cases"] == 3
    for part, value in KNOWN.items():
        assert row[part] == pytest.approx(value, abs=1e-12)
    assert row["retrieval"] + row["generation"] + row["interaction"] == pytest.approx(row["total"], abs=1e-12)
    assert {case["id"]: case["cause"] for case in found["cases"]} == CAUSES_KNOWN
    assert [case["cause"] for case in found["cases"]] == ["retrieval", "generation"]  # grouped by cause
    refund = _metric(found, "answer_accuracy")
    assert refund["interaction_ci"][0] <= 1 / 3 <= refund["interaction_ci"][1]
    assert found["replayed"] == 2 and not found["errors"]  # refund and password: shipping kept its retrieval


@pytest.mark.parametrize("generate", ["generate_candidate", "generate_candidate_async"])
def test_python_pair_with_a_known_interaction(ragexp: Any, store_uri: str, corpus_cases: Path, generate: str) -> None:
    common = ("system=python", "metrics=offline", f"dataset.path={corpus_cases}", "k=2")
    base = _run(
        ragexp,
        *common,
        "provider.system.target=tests.pipelines.attribution:baseline",
        "provider.system.generate=tests.pipelines.attribution:generate_baseline",
    )
    cand = _run(
        ragexp,
        *common,
        "provider.system.target=tests.pipelines.attribution:candidate",
        f"provider.system.generate=tests.pipelines.attribution:{generate}",
    )
    _check_known(_attributed(ragexp, base, cand))


def test_python_system_without_generate_is_refused_naming_the_key(
    ragexp: Any, store_uri: str, corpus_cases: Path
) -> None:
    common = ("system=python", "metrics=offline", f"dataset.path={corpus_cases}", "k=2")
    base = _run(ragexp, *common, "provider.system.target=tests.pipelines.attribution:baseline")
    cand = _run(ragexp, *common, "provider.system.target=tests.pipelines.attribution:candidate")
    found = ragexp("diff", base, cand, "--attribute")
    assert found.code == 1 and "provider.system.generate is not set" in found.stderr
    assert found.stderr.strip().count("\n") == 0


def test_http_pair_with_a_generate_endpoint(ragexp: Any, store_uri: str, corpus_cases: Path) -> None:
    from tests.servers.attribution import Handler, serving

    with serving() as url:
        runs = []
        for version in ("baseline", "candidate"):
            runs.append(
                _run(
                    ragexp,
                    "system=http",
                    "metrics=offline",
                    f"dataset.path={corpus_cases}",
                    "k=2",
                    f"provider.system.url={url}/{version}/query",
                    f"+provider.system.generate.url={url}/{version}/generate",
                    "+provider.system.generate.response.answer=result.text",
                    "+provider.system.generate.response.citations=result.cites",
                )
            )
        _check_known(_attributed(ragexp, *runs))
    assert Handler.calls["/baseline/generate"] == 2 and Handler.calls["/candidate/generate"] == 2


def test_a_failed_replay_is_an_error_for_its_case_never_zero(ragexp: Any, store_uri: str, corpus_cases: Path) -> None:
    common = ("system=python", "metrics=offline", f"dataset.path={corpus_cases}", "k=2")
    base = _run(
        ragexp,
        *common,
        "provider.system.target=tests.pipelines.attribution:baseline",
        "provider.system.generate=tests.pipelines.attribution:generate_baseline",
    )
    cand = _run(
        ragexp,
        *common,
        "provider.system.target=tests.pipelines.attribution:candidate",
        "provider.system.generate=tests.pipelines.attribution:generate_candidate_failing",
    )
    found = _attributed(ragexp, base, cand)
    assert [error["id"] for error in found["errors"]] == ["password"]
    assert "baseline/candidate" in found["errors"][0]["error"] and "the model is down" in found["errors"][0]["error"]
    row = _metric(found, "answer_accuracy")
    # refund (0 = -1 + 1) and shipping (-1, generation) remain; password is left out, not scored 0.
    assert row["cases"] == 2
    assert (row["total"], row["retrieval"], row["generation"], row["interaction"]) == pytest.approx(
        (-0.5, -0.5, -0.5, 0.5)
    )
    assert {case["id"]: case["cause"] for case in found["cases"]} == {"shipping": "generation"}
    text = ragexp("diff", base, cand, "--attribute", "--resamples", "200")
    assert "error password: replay of cell baseline/candidate failed" in text.stdout


@pytest.mark.system  # a whole run: `make test`, not the edit loop
def test_a_cell_whose_every_replay_failed_says_why(ragexp: Any, store_uri: str, corpus_cases: Path) -> None:
    common = ("system=python", "metrics=offline", f"dataset.path={corpus_cases}", "k=2")
    base = _run(
        ragexp,
        *common,
        "provider.system.target=tests.pipelines.attribution:baseline",
        "provider.system.generate=tests.pipelines.attribution:generate_baseline",
    )
    cand = _run(
        ragexp,
        *common,
        "provider.system.target=tests.pipelines.attribution:candidate",
        "provider.system.generate=tests.pipelines.attribution:generate_candidate_down",
    )
    found = _attributed(ragexp, base, cand)
    assert found["replayed"] == 2 and len(found["errors"]) == 2
    for error in found["errors"]:
        assert error["error"].startswith("every replay of cell baseline/candidate failed (run ")
        assert "every case errored (2 of 2; the first: " in error["error"]
        assert "the model is down (2 contexts)" in error["error"]


def test_report_attribute_needs_a_baseline(ragexp: Any, store_uri: str) -> None:
    run = _run(ragexp, "provider=fake")
    found = ragexp("report", run, "--attribute")
    assert found.code == 1 and "--attribute splits a comparison: add --baseline RUN_ID" in found.stderr


@pytest.mark.system  # a whole run: `make test`, not the edit loop
def test_a_judge_metric_is_attributed_and_the_replays_use_the_judge_cache(
    ragexp: Any, store_uri: str, corpus_cases: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow.tracking import MlflowClient

    from tests.servers.procs import ROOT, serve

    judge = ROOT / "tests/servers/judge.py"

    monkeypatch.setenv("RAGEXP_TEST_JUDGE_KEY", "judge-key")
    with serve(judge, "--api-key", "judge-key") as url:
        common = (
            "system=python",
            "judge=openai",
            "metrics.names=[answer_accuracy,faithfulness]",
            f"dataset.path={corpus_cases}",
            "k=2",
            f"provider.judge.base_url={url}",
            f"provider.judge.embeddings.url={url}",
            "provider.judge.api_key_env=RAGEXP_TEST_JUDGE_KEY",
        )
        base = _run(
            ragexp,
            *common,
            "provider.system.target=tests.pipelines.attribution:baseline",
            "provider.system.generate=tests.pipelines.attribution:generate_baseline",
        )
        cand = _run(
            ragexp,
            *common,
            "provider.system.target=tests.pipelines.attribution:candidate",
            "provider.system.generate=tests.pipelines.attribution:generate_candidate",
        )
        first = _attributed(ragexp, base, cand)
        again = _attributed(ragexp, base, cand)
    # Every answer is a context, so the judge finds it faithful, except the candidate's "unknown"
    # on shipping: the drop is the generator's alone.
    row = _metric(first, "faithfulness")
    assert not row["by_definition"] and row["cases"] == 3
    assert (row["total"], row["retrieval"], row["generation"], row["interaction"]) == pytest.approx(
        (-1 / 3, 0.0, -1 / 3, 0.0)
    )
    assert _metric(again, "faithfulness") == row
    # The second attribution reuses the finished cell runs: nothing is replayed or judged again.
    assert again["cells"] == first["cells"]
    client = MlflowClient(store_uri)
    for run_id in first["cells"].values():
        metrics = client.get_run(run_id).data.metrics
        assert metrics["judge.cache_hits"] > 0  # the replays' judge calls came from the judge cache


# --- a rerun of --attribute: its cell runs resumed or reused, as run --resume does -------------

GROUPS = 4
"""Copies of the three corpus cases (each question made distinct): 8 replayed, 4 kept."""


def _many_cases(tmp_path: Path) -> Path:
    from tests.conftest import write_jsonl
    from tests.pipelines.corpus import CASES

    rows = [
        {**case, "id": f"{case['id']}-{n}", "question": f"{case['question']} q{n}x"}
        for n in range(GROUPS)
        for case in CASES
    ]
    return write_jsonl(tmp_path / "many.jsonl", rows)


def _counted_pair(ragexp: Any, data: Path) -> tuple[str, str]:
    common = ("system=python", "metrics=offline", f"dataset.path={data}", "k=2", "concurrency=1")
    base = _run(
        ragexp,
        *common,
        "provider.system.target=tests.pipelines.attribution:baseline",
        "provider.system.generate=tests.pipelines.attribution:generate_baseline_counted",
    )
    cand = _run(
        ragexp,
        *common,
        "provider.system.target=tests.pipelines.attribution:candidate",
        "provider.system.generate=tests.pipelines.attribution:generate_candidate_counted",
    )
    return base, cand


def _cell_runs(store_uri: str, cand: str) -> list[Any]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(store_uri)
    experiment = client.get_experiment_by_name("ragexp")
    assert experiment is not None
    return list(client.search_runs([experiment.experiment_id], f"tags.`ragexp.attribution.of` = '{cand}'"))


def _asked(generator: str) -> dict[str, int]:
    from tests.pipelines import attribution as pipeline

    return {question: n for (name, question), n in pipeline.CALLS.items() if name == generator}


@pytest.mark.system  # whole runs: `make test`, not the edit loop
def test_an_interrupted_attribution_resumes_its_cell_runs_and_a_rerun_reuses_them(
    ragexp: Any, store_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.pipelines import attribution as pipeline

    data = _many_cases(tmp_path)
    replayed = {f"{q} q{n}x" for n in range(GROUPS) for q in ("when do refunds arrive", "how are passwords reset")}
    args = ("--attribute", "--json", "--resamples", "500")

    # The same pair in a store of its own, attributed without a stop: the figures to match.
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/whole/mlflow.db")
    whole_pair = _counted_pair(ragexp, data)
    pipeline.CALLS.clear()
    whole = ragexp("diff", *whole_pair, *args)
    assert whole.code == 0, whole.stderr
    assert _asked("baseline") == _asked("candidate") == dict.fromkeys(replayed, 1)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", store_uri)

    base, cand = _counted_pair(ragexp, data)
    pipeline.CALLS.clear()
    pipeline.STOPPED_AT.clear()
    pipeline.INTERRUPT_AFTER["candidate"] = 3  # a real SIGINT on the candidate generator's 4th replay
    cut = ragexp("diff", base, cand, *args)
    assert cut.code == 130, cut.stderr
    assert "attribution cell baseline/candidate: run " in cut.stderr
    assert "interrupted after 3 of 8 cases" in cut.stderr
    assert f"continue with: ragexp diff {base} {cand} --attribute" in cut.stderr
    assert _asked("baseline") == dict.fromkeys(replayed, 1)  # the first cell finished
    in_flight = pipeline.STOPPED_AT[0]
    done = set(_asked("candidate")) - {in_flight}
    assert len(done) == 3 and _asked("candidate")[in_flight] == 1
    stopped = {run.data.tags["ragexp.attribution.cell"]: run for run in _cell_runs(store_uri, cand)}
    assert {cell: run.info.status for cell, run in stopped.items()} == {
        "candidate/baseline": "FINISHED",
        "baseline/candidate": "KILLED",
    }

    pipeline.CALLS.clear()
    resumed = ragexp("diff", base, cand, *args)
    assert resumed.code == 0, resumed.stderr
    # The finished cell is reused without a call; the stopped one asks only what it lacked.
    assert _asked("baseline") == {}
    assert _asked("candidate") == dict.fromkeys(replayed - done, 1)
    first, second = stopped["candidate/baseline"].info.run_id, stopped["baseline/candidate"].info.run_id
    assert (
        f"cell candidate/baseline: run {first} replayed these 8 cases with the same inputs before: reused as it is "
        "(no replay calls)" in resumed.stderr
    )
    assert f"cell baseline/candidate: continuing run {second} (interrupted)" in resumed.stderr
    assert "resuming: 3 of 8 cases kept, 5 to evaluate" in resumed.stderr
    found = resumed.json()["attribution"]
    assert found["cells"] == {"candidate/baseline": first, "baseline/candidate": second}
    # One run per cell, both finished, each holding every replayed case.
    cells = _cell_runs(store_uri, cand)
    assert sorted(run.info.run_id for run in cells) == sorted([first, second])
    assert {run.info.status for run in cells} == {"FINISHED"}
    assert {run.data.tags["ragexp.case_count"] for run in cells} == {"8"}
    assert {run.data.tags["ragexp.attribution.baseline"] for run in cells} == {base}
    # The same figures as the attribution that never stopped.
    expected = whole.json()["attribution"]
    for key in ("definition", "confidence", "metrics", "cases", "errors", "replayed"):
        assert found[key] == expected[key], key
    row = _metric(found, "answer_accuracy")
    assert row["cases"] == 3 * GROUPS and found["replayed"] == 2 * GROUPS and not found["errors"]
    for part, value in KNOWN.items():
        assert row[part] == pytest.approx(value, abs=1e-12)

    # Once complete, another --attribute replays nothing and says the same.
    pipeline.CALLS.clear()
    again = ragexp("diff", base, cand, *args)
    assert again.code == 0, again.stderr
    assert dict(pipeline.CALLS) == {}
    assert again.json() == resumed.json()
    assert "no replay calls" in again.stderr and again.stderr.count("reused as it is") == 2
    assert len(_cell_runs(store_uri, cand)) == 2


@pytest.mark.system  # whole runs: `make test`, not the edit loop
def test_a_sigterm_stops_a_replay_in_its_own_process_and_the_rerun_asks_only_the_rest(
    ragexp: Any, store_uri: str, tmp_path: Path
) -> None:
    import os
    import signal
    import subprocess
    import sys
    import time

    from tests.pipelines import attribution as pipeline

    data = _many_cases(tmp_path)
    base, cand = _counted_pair(ragexp, data)
    marker = tmp_path / "hanging"
    env = {
        **os.environ,
        "MLFLOW_TRACKING_URI": store_uri,
        pipeline.HANG_AFTER_ENV: "5",
        pipeline.HANG_FILE_ENV: str(marker),
    }
    argv = [sys.executable, "-m", "ragexp.cli.app", "diff", base, cand, "--attribute", "--resamples", "200"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.time() + 120
    while not marker.exists() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert marker.exists(), proc.communicate(timeout=10)
    proc.send_signal(signal.SIGTERM)
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("ragexp: interrupted: attribution cell baseline/candidate: run "), err
    assert "interrupted after 5 of 8 cases" in last
    assert last.endswith(f"continue with: ragexp diff {base} {cand} --attribute")
    hung_on = marker.read_text(encoding="utf-8")

    pipeline.CALLS.clear()
    resumed = ragexp("diff", base, cand, "--attribute", "--json", "--resamples", "200")
    assert resumed.code == 0, resumed.stderr
    # Five answers were checkpointed by the stopped process: the rerun asks the other three alone.
    assert _asked("baseline") == {}
    asked = _asked("candidate")
    assert len(asked) == 3 and set(asked.values()) == {1} and hung_on in asked
    assert "resuming: 5 of 8 cases kept, 3 to evaluate" in resumed.stderr
    assert len(_cell_runs(store_uri, cand)) == 2
    row = _metric(resumed.json()["attribution"], "answer_accuracy")
    for part, value in KNOWN.items():
        assert row[part] == pytest.approx(value, abs=1e-12)


def test_runs_leaves_the_cells_out_unless_asked_and_marks_them_by_config_hash(
    ragexp: Any, store_uri: str, corpus_cases: Path
) -> None:
    common = ("system=python", "metrics=offline", f"dataset.path={corpus_cases}", "k=2")
    base = _run(
        ragexp,
        *common,
        "provider.system.target=tests.pipelines.attribution:baseline",
        "provider.system.generate=tests.pipelines.attribution:generate_baseline",
    )
    cand = _run(
        ragexp,
        *common,
        "provider.system.target=tests.pipelines.attribution:candidate",
        "provider.system.generate=tests.pipelines.attribution:generate_candidate",
    )
    _attributed(ragexp, base, cand)
    from mlflow.tracking import MlflowClient

    client = MlflowClient(store_uri)
    cells = {run.info.run_id: run.data.tags["ragexp.attribution.cell"] for run in _cell_runs(store_uri, cand)}
    assert sorted(cells.values()) == ["baseline/candidate", "candidate/baseline"]
    listed = ragexp("runs", "--json")
    assert listed.code == 0, listed.stderr
    assert [row["run_id"] for row in listed.json()["runs"]] == [cand, base]
    assert listed.json()["cells_left_out"] == 2
    assert all(row["role"] is None for row in listed.json()["runs"])
    terminal = ragexp("runs")
    assert "2 attribution cell run(s) of diff --attribute not listed (--cells lists them)" in terminal.stderr
    assert not any(cell in terminal.stdout for cell in cells)
    every = ragexp("runs", "--cells", "--json").json()
    roles = {row["run_id"]: row["role"] for row in every["runs"]}
    assert roles == {
        base: None,
        cand: None,
        **{run_id: {"kind": "attribution_cell", "of": cand, "cell": cell} for run_id, cell in cells.items()},
    }
    assert every["cells_left_out"] == 0
    # A cell replays its generator's config: it shares that run's config hash, and says it is a cell.
    base_hash = client.get_run(base).data.tags["ragexp.config_hash"]
    same = ragexp("runs", "--config-hash", base_hash[:12], "--json").json()["runs"]
    base_cell = next(run_id for run_id, cell in cells.items() if cell == "candidate/baseline")
    assert {row["run_id"]: row["role"] for row in same} == {
        base: None,
        base_cell: {"kind": "attribution_cell", "of": cand, "cell": "candidate/baseline"},
    }
    shown = ragexp("runs", "--config-hash", base_hash[:12])
    row = next(line for line in shown.stdout.splitlines() if line.startswith(base_cell))
    assert f"cell candidate/baseline of {cand}" in row
    assert next(line for line in shown.stdout.splitlines() if line.startswith(base)).split()[1] == "run"


GENERATE_MODULE = """
from tests.pipelines.attribution import generate_baseline, generate_candidate
"""


def test_a_generate_module_changed_since_the_runs_is_refused(
    ragexp: Any, store_uri: str, corpus_cases: Path, tmp_path: Path
) -> None:
    module = tmp_path / "answer_stage_46b.py"
    module.write_text(GENERATE_MODULE)
    where = f"provider.system.path={tmp_path}"
    common = ("system=python", "metrics=offline", f"dataset.path={corpus_cases}", "k=2", where)
    base = _run(
        ragexp,
        *common,
        "provider.system.target=tests.pipelines.attribution:baseline",
        "provider.system.generate=answer_stage_46b:generate_baseline",
    )
    cand = _run(
        ragexp,
        *common,
        "provider.system.target=tests.pipelines.attribution:candidate",
        "provider.system.generate=answer_stage_46b:generate_candidate",
    )
    module.write_text(GENERATE_MODULE + "\n# the answer stage was edited after the runs\n")
    found = ragexp("diff", base, cand, "--attribute")
    assert found.code == 1, found.stdout
    assert found.stderr.strip().count("\n") == 0
    assert "is not the one run" in found.stderr and "config hash" in found.stderr
