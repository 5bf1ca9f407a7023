"""A team's own metrics (``metrics.custom``): a Python function or a rubric the judge scores,
first-class wherever a built-in metric is: the run, MLflow, cases.jsonl, diff, gate, power, the
report, review queues and calibration. Real runs into a real SQLite store, the deterministic
judge of tests/servers on 127.0.0.1."""

from __future__ import annotations

import json
import math
import re
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from ragexp.config.compose import compose
from ragexp.metrics.custom import load_custom, read_values
from ragexp.metrics.custom_spec import custom_spec, definition_change, spec_from_json, spec_json
from ragexp.metrics.registry import METRICS
from ragexp.records import Case, CaseResult, SystemOutput
from ragexp.usercode.calls import TIMED_OUT, Raised, call_each
from tests.conftest import ROOT, write_jsonl
from tests.pipelines.rules import HOTLINE
from tests.servers.procs import serve, stats
from tests.test_traces import case_id, feedback, traces_of

JUDGE = ROOT / "tests/servers/judge.py"
HOTLINE_METRIC = "{name: hotline, kind: python, target: 'tests.pipelines.rules:hotline', needs: [answer]}"


def rows(refused_with_hotline: int = 4, *, bad: tuple[int, ...] = ()) -> list[dict[str, Any]]:
    """Six answered cases and four unanswerable ones; the first ``refused_with_hotline``
    refusals give the hotline number; case ids in ``bad`` carry "bad" (the rules fail on them)."""
    out = []
    for i in range(10):
        unanswerable = i >= 6
        refusal = "无法回答" + (f"，请致电 {HOTLINE}" if i - 6 < refused_with_hotline else "")
        out.append(
            {
                "id": f"{'bad' if i in bad else 'case'}-{i}",
                "question": f"question {i}?",
                "relevant_ids": [] if unanswerable else [f"d{i}"],
                "expected_facts": [] if unanswerable else [f"fact {i}"],
                "reference": "无法回答" if unanswerable else f"fact {i}.",
                "unanswerable": unanswerable,
                "response": refusal if unanswerable else f"fact {i}.",
                "retrieved_ids": [] if unanswerable else [f"d{i}"],
                "retrieved_contexts": [] if unanswerable else [f"fact {i} is in this text."],
                "citations": [] if unanswerable else [1],
                "latency_seconds": 0.5,
            }
        )
    return out


def run(ragexp: Any, data: Path, *overrides: str) -> Any:
    return ragexp("run", f"dataset.path={data}", "provider=replay", "k=3", *overrides, "--json")


def run_json(ragexp: Any, data: Path, *overrides: str) -> dict[str, Any]:
    result = run(ragexp, data, *overrides)
    assert result.code == 0, result.stderr
    payload: dict[str, Any] = result.json()
    return payload


def custom(*entries: str) -> str:
    return f"metrics.custom=[{', '.join(entries)}]"


def cases_of(store_uri: str, run_id: str, tmp_path: Path) -> dict[str, dict[str, Any]]:
    path = MlflowClient(store_uri).download_artifacts(run_id, "cases.jsonl", str(tmp_path / run_id))
    return {row["id"]: row for row in map(json.loads, Path(path).read_text(encoding="utf-8").splitlines())}


# --- a Python metric, end to end ----------------------------------------------------------------


@pytest.mark.system
def test_a_python_metric_is_scored_logged_diffed_and_gated(ragexp: Any, store_uri: str, tmp_path: Path) -> None:
    base = run_json(ragexp, write_jsonl(tmp_path / "base.jsonl", rows(4)), custom(HOTLINE_METRIC))
    cand = run_json(ragexp, write_jsonl(tmp_path / "cand.jsonl", rows(2)), custom(HOTLINE_METRIC))
    # Scored beside the built-in metrics: every refusal with the number in the baseline, two of
    # four in the candidate.
    assert base["summary"]["hotline"] == 1.0 and cand["summary"]["hotline"] == pytest.approx(0.8)
    assert base["summary"]["answer_accuracy"] == 1.0 and cand["error_count"] == 0
    client = MlflowClient(store_uri)
    logged = client.get_run(cand["run_id"]).data
    assert logged.metrics["hotline"] == pytest.approx(0.8)
    assert logged.tags["ragexp.metrics"].split(",")[-1] == "hotline"
    # Per case in cases.jsonl and as a CODE assessment on the case's trace.
    scored = cases_of(store_uri, cand["run_id"], tmp_path)
    assert [scored[f"case-{i}"]["metrics"]["hotline"] for i in range(10)] == [1.0] * 8 + [0.0] * 2
    traces = {case_id(t): feedback(t) for t in traces_of(store_uri, cand["run_id"])}
    assert traces["case-9"]["hotline"].value == 0.0 and traces["case-9"]["hotline"].source.source_type == "CODE"
    assert np.mean([f["hotline"].value for f in traces.values()]) == pytest.approx(0.8)
    # The terminal table lists it.
    text = ragexp("run", f"dataset.path={tmp_path / 'cand.jsonl'}", "provider=replay", "k=3", custom(HOTLINE_METRIC))
    assert text.code == 0 and any(line.split()[:2] == ["hotline", "0.8000"] for line in text.stdout.splitlines())

    diff = ragexp("diff", base["run_id"], cand["run_id"], "--json")
    assert diff.code == 0, diff.stderr
    moved = {m["name"]: m for m in diff.json()["metrics"]}["hotline"]
    assert (moved["baseline"], moved["candidate"], moved["regressed"], moved["improved"]) == (1.0, 0.8, 2, 0)
    assert moved["delta"] == pytest.approx(-0.2) and "not_comparable" not in moved
    assert moved["ci_low"] is not None and moved["p_value"] is not None
    worst = {case["id"] for case in diff.json()["cases"]}
    assert worst == {"case-8", "case-9"}

    rule = "gates.rules.hotline.max_drop=0"
    failed = ragexp("gate", "--baseline", base["run_id"], "--candidate", cand["run_id"], rule, "--json")
    assert failed.code == 2, failed.stderr
    failures = failed.json()["failures"]
    assert [(f["metric"], f["rule"]) for f in failures] == [("hotline", "max_drop")]
    assert failures[0]["message"] == "hotline: 1.0000 -> 0.8000 on 10 of 10, worse by 0.2000 (allowed drop 0)"
    again = run_json(ragexp, tmp_path / "base.jsonl", custom(HOTLINE_METRIC), "run_name=again")
    passed = ragexp("gate", "--baseline", base["run_id"], "--candidate", again["run_id"], rule, "--json")
    assert passed.code == 0, passed.stdout
    assert {r["metric"] for r in passed.json()["rules"]} >= {"hotline"}

    power = ragexp("power", "--baseline", cand["run_id"], "--json")
    assert power.code == 0, power.stderr
    planned = {p["name"]: p for p in power.json()["metrics"]}
    values = np.array([1.0] * 8 + [0.0] * 2)
    assert planned["hotline"]["cases"] == 10
    assert planned["hotline"]["sd"] == pytest.approx(np.std(values, ddof=1) * math.sqrt(2))


@pytest.mark.system
def test_a_raising_a_wrong_and_an_out_of_range_value_are_errors_never_zero(
    ragexp: Any, store_uri: str, tmp_path: Path
) -> None:
    data = write_jsonl(tmp_path / "cases.jsonl", rows(bad=(1, 7)))
    entries = [
        f"{{name: {name}, kind: python, target: 'tests.pipelines.rules:{name}'}}"
        for name in ("raising", "out_of_range", "wrong_type", "not_a_number", "no_score")
    ]
    payload = run_json(ragexp, data, custom(*entries))
    summary = payload["summary"]
    # Means over the eight cases with a score: the failures are left out, not counted as zeros.
    assert summary["raising"] == 1.0 and summary["out_of_range"] == 0.25 and summary["wrong_type"] == 1.0
    assert summary["not_a_number"] == 0.0 and summary["no_score"] == 1.0
    assert payload["error_count"] == 2
    scored = cases_of(store_uri, payload["run_id"], tmp_path)
    bad = scored["bad-1"]
    assert [bad["metrics"][name] for name in bad["metric_errors"]] == [None] * 5
    assert bad["metrics"]["answer_accuracy"] == 1.0  # the case's other metrics stand
    assert bad["metric_errors"] == {
        "raising": "raised KeyError: 'no policy clause for bad-1'",
        "out_of_range": "returned 1.5, outside its range [0, 1]",
        "wrong_type": 'returned str, not a number, a bool or {"score", "rationale"}',
        "not_a_number": "returned NaN (no score)",
        "no_score": 'returned a dict without "score"',
    }
    assert bad["error"].startswith("raising: raised KeyError")
    assert "metric_errors" not in scored["case-2"]
    traces = {case_id(t): feedback(t) for t in traces_of(store_uri, payload["run_id"])}
    assert traces["bad-7"]["out_of_range"].value is None
    assert traces["bad-7"]["out_of_range"].error.error_message == "returned 1.5, outside its range [0, 1]"
    assert traces["case-2"]["out_of_range"].value == 0.25
    # The gate does not pass over an errored case.
    again = run_json(ragexp, data, custom(*entries), "run_name=again")
    gate = ragexp("gate", "--baseline", payload["run_id"], "--candidate", again["run_id"], "--json")
    assert gate.code == 2
    assert [(f["rule"], f["message"]) for f in gate.json()["failures"]] == [
        ("max_error_rate", "2 of 10 candidate cases errored (20.00% > 0.00%): their scores are missing, not zero")
    ]


def test_a_slow_call_times_out_prints_go_to_stderr_and_calls_run_on_worker_threads(
    ragexp: Any, store_uri: str, tmp_path: Path
) -> None:
    from tests.pipelines import rules

    data = write_jsonl(tmp_path / "cases.jsonl", rows(bad=(3,)))
    entries = [
        "{name: sleepy, kind: python, target: 'tests.pipelines.rules:sleepy', timeout_s: 0.3}",
        "{name: chatty, kind: python, target: 'tests.pipelines.rules:chatty'}",
        HOTLINE_METRIC,
    ]
    run_json(ragexp, data, custom(HOTLINE_METRIC))  # the store is made (its migrations take seconds)
    started = time.perf_counter()
    result = run(ragexp, data, custom(*entries))
    assert result.code == 0, result.stderr
    assert time.perf_counter() - started < 4  # the 5 s call was abandoned, not waited for
    payload = json.loads(result.stdout)  # stdout holds the one JSON object: the prints went to stderr
    assert "checking case-0" in result.stderr and "checking" not in result.stdout
    scored = cases_of(store_uri, payload["run_id"], tmp_path)
    assert scored["bad-3"]["metric_errors"] == {"sleepy": "timed out after 0.3 s (metrics.custom[0].timeout_s)"}
    assert scored["case-4"]["metrics"]["sleepy"] == 1.0 and payload["summary"]["sleepy"] == 1.0
    assert set(rules.SEEN.values()) == {"ragexp-metric"}
    assert threading.current_thread().name not in rules.SEEN.values()


def test_a_rationale_is_recorded_in_cases_and_on_the_trace(ragexp: Any, store_uri: str, tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "cases.jsonl", rows(2))
    payload = run_json(ragexp, data, custom("{name: graded, kind: python, target: 'tests.pipelines.rules:graded'}"))
    scored = cases_of(store_uri, payload["run_id"], tmp_path)
    assert scored["case-0"]["rationale"]["graded"] == "quotes 1 of 1 facts"
    assert scored["case-9"]["metrics"]["graded"] == 0.0
    assert scored["case-9"]["rationale"]["graded"] == "quotes 0 of 1 facts"
    traces = {case_id(t): feedback(t) for t in traces_of(store_uri, payload["run_id"])}
    assert traces["case-0"]["graded"].rationale == "quotes 1 of 1 facts"


def test_an_mlflow_scorer_is_called_as_mlflow_calls_it(ragexp: Any, store_uri: str, tmp_path: Path) -> None:
    from tests.pipelines import mlflow_rules

    answers = rows()
    answers[2]["response"] = "stupid question"
    data = write_jsonl(tmp_path / "cases.jsonl", answers)
    entries = [
        "{name: facts, kind: python, target: 'tests.pipelines.mlflow_rules:mentions_reference'}",
        "{name: polite, kind: python, target: 'tests.pipelines.mlflow_rules:polite'}",
    ]
    payload = run_json(ragexp, data, custom(*entries))
    assert payload["summary"]["facts"] == pytest.approx(0.9) and payload["summary"]["polite"] == pytest.approx(0.9)
    call = next(c for c in mlflow_rules.CALLS if c["outputs"] == "fact 0.")
    assert call["expectations"] == {
        "expected_facts": ["fact 0"],
        "expected_response": "fact 0.",
        "relevant_ids": ["d0"],
        "unanswerable": False,
    }
    scored = cases_of(store_uri, payload["run_id"], tmp_path)
    assert scored["case-2"]["rationale"]["facts"] == "missing fact 2"
    trace = "{name: t, kind: python, target: 'tests.pipelines.mlflow_rules:over_the_trace'}"
    refused = run(ragexp, data, custom(trace))
    assert refused.code == 1
    assert refused.stderr.strip() == (
        "ragexp: error: metrics.custom[0].target: the MLflow scorer 'tests.pipelines.mlflow_rules:over_the_trace' "
        "takes 'trace', which ragexp does not pass (it passes inputs, outputs, expectations)"
    )


# --- refused before the run -----------------------------------------------------------------------


REFUSALS = [
    (
        "{name: h, kind: python, target: 'no_such_rules:hotline'}",
        "metrics.custom[0].target: no module named 'no_such_rules' in the working directory, "
        "metrics.custom[0].path or the installed packages",
    ),
    (
        "{name: h, kind: python, target: 'tests.pipelines.rules:nothing'}",
        "metrics.custom[0].target: 'tests.pipelines.rules' has no attribute 'nothing'",
    ),
    (
        "{name: h, kind: python, target: 'tests.pipelines.rules:one_argument'}",
        "metrics.custom[0].target: cannot call 'tests.pipelines.rules:one_argument(case: 'Case')' as (case, "
        "output): a metric function takes the case and the system's output",
    ),
    (
        "{name: h, kind: python, target: 'tests.pipelines.rules:asynchronous'}",
        "metrics.custom[0].target: 'tests.pipelines.rules:asynchronous' is async; a metric function is called "
        "as def f(case, output)",
    ),
    (
        "{name: h, kind: python, target: 'tests.pipelines.rules:NOT_CALLABLE'}",
        "metrics.custom[0].target: 'tests.pipelines.rules:NOT_CALLABLE' is int, not a function (case, output)",
    ),
    ("{name: h, kind: judge, rubric: '  '}", "metrics.custom[0].rubric: empty; write what the judge should check"),
    (
        "{name: h, kind: judge, rubric: polite, scale: likert}",
        "metrics.custom[0].scale: expected pass_fail or [low, high], integers from 0 to 10 with low < high, "
        "got 'likert'",
    ),
    (
        "{name: h, kind: judge, rubric: polite, scale: [1, 50]}",
        "metrics.custom[0].scale: expected pass_fail or [low, high], integers from 0 to 10 with low < high, "
        "got [1, 50]",
    ),
    (
        "{name: h, kind: judge, rubric: polite, needs: [citations]}",
        "metrics.custom[0].needs: a rubric shows the judge question, answer, contexts, reference; not "
        "'citations' (a Python metric can read it)",
    ),
    (
        "{name: mrr, kind: python, target: 'tests.pipelines.rules:hotline'}",
        "metrics.custom[0].name: 'mrr' is a built-in metric (metrics.names takes it); give yours another name",
    ),
    (
        "{name: answer_similarity, kind: python, target: 'tests.pipelines.rules:hotline'}",
        "metrics.custom[0].name: 'answer_similarity' is a built-in metric (metrics.names takes it); give yours "
        "another name",
    ),
    (
        "{name: case_count, kind: python, target: 'tests.pipelines.rules:hotline'}",
        "metrics.custom[0].name: 'case_count' is a figure every run logs; give your metric another name",
    ),
    (
        "{name: 'judge.cost', kind: python, target: 'tests.pipelines.rules:hotline'}",
        "metrics.custom[0].name: 'judge.cost' holds '.'; a metric of your own is one word of letters, digits, _ and -",
    ),
    (
        "{name: 'a,b', kind: python, target: 'tests.pipelines.rules:hotline'}",
        "metrics.custom[0].name: 'a,b' contains ','; an MLflow metric name may only hold letters, digits, '_', "
        "'-', '.', ' ', ':' and '/'",
    ),
    (
        "{name: h, kind: python, target: 'tests.pipelines.rules:hotline', direction: up}",
        "config: metrics.custom[0].direction: Input should be 'higher' or 'lower' (got 'up')",
    ),
    (
        "{name: h, kind: python, target: 'tests.pipelines.rules:hotline', range: [1, 0]}",
        "metrics.custom[0].range: expected finite [low, high] with low < high, got [1.0, 0.0]",
    ),
    (
        "{name: h, kind: judge, rubric: polite, range: [0, null]}",
        "metrics.custom[0].range: a judge's scale is mapped onto the range, which needs a high end",
    ),
    (
        "{name: h, kind: python, target: 'tests.pipelines.rules:hotline', needs: [answr]}",
        "metrics.custom[0].needs: unknown field 'answr' (known: question, answer, contexts, ranked_ids, citations, "
        "reference, expected_facts, relevant_ids)",
    ),
    (
        "{name: h, kind: python, target: 'tests.pipelines.rules:hotline', rubric: polite}",
        "config: metrics.custom[0].rubric: unknown key for kind 'python'",
    ),
    ("{name: h, kind: rule}", "config: metrics.custom[0].kind: unknown metric kind 'rule' (known: judge, python)"),
    ("{name: h, target: x}", "config: metrics.custom[0].kind: required (one of judge, python)"),
    (
        "{name: h, kind: judge, rubric: polite}",
        "metrics.custom[0]: the rubric 'h' needs an LLM judge, and provider replay has none (use provider=npu, "
        "provider=replay_judge or provider=http_judge, or set provider.judge)",
    ),
]


@pytest.mark.parametrize(("entry", "message"), REFUSALS)
def test_a_bad_custom_metric_is_one_line_naming_its_key_and_nothing_runs(
    ragexp: Any, store_uri: str, tmp_path: Path, entry: str, message: str
) -> None:
    data = write_jsonl(tmp_path / "cases.jsonl", rows())
    result = run(ragexp, data, custom(entry))
    assert result.code == 1
    assert result.stderr.strip().splitlines() == [f"ragexp: error: {message}"]
    assert result.stdout == ""
    database = Path(store_uri.removeprefix("sqlite:///"))
    assert not database.exists() or MlflowClient(store_uri).search_runs(["0"]) == []


def test_needs_the_system_or_dataset_cannot_give_and_a_repeated_name_are_refused(
    ragexp: Any, store_uri: str, tmp_path: Path
) -> None:
    no_answers = [{key: value for key, value in row.items() if key != "response"} for row in rows()]
    data = write_jsonl(tmp_path / "no_answers.jsonl", no_answers)
    result = run(ragexp, data, "metrics=retrieval", custom(HOTLINE_METRIC))
    assert result.code == 1
    assert result.stderr.strip() == (
        "ragexp: error: metrics.custom[0].needs: metric 'hotline' needs output field 'answer', which provider "
        "replay does not give for every case of no_answers; "
        "leave metrics.custom[0] out of metrics.custom for this system"
    )
    twice = run(ragexp, write_jsonl(tmp_path / "cases.jsonl", rows()), custom(HOTLINE_METRIC, HOTLINE_METRIC))
    assert twice.stderr.strip() == "ragexp: error: metrics.custom[1].name: 'hotline' is already a metric of this run"


# --- a rubric the judge scores ---------------------------------------------------------------------


RUBRIC = "{name: gives_hotline, kind: judge, rubric: '拒答时必须给出「400-820-8820」', needs: [question, answer]}"


def judged(url: str) -> list[str]:
    return [
        "provider=replay_judge",
        f"provider.judge.base_url={url}",
        "provider.judge.api_key_env=null",
        "provider.judge.max_retries=0",
        "metrics.names=[answer_accuracy]",
    ]


@pytest.mark.system
def test_a_rubric_is_judged_through_the_judge_client_cached_and_repeated(
    ragexp: Any, store_uri: str, tmp_path: Path
) -> None:
    answers = rows(2)
    answers[0]["question"] = "JUDGE-NAN question 0?"  # the judge answers off the rubric's scale
    data = write_jsonl(tmp_path / "cases.jsonl", answers)
    scale = "{name: covers, kind: judge, rubric: 'the answer covers the question', scale: [1, 5], range: [0, 10]}"
    clean = write_jsonl(tmp_path / "clean.jsonl", rows(2))
    with serve(JUDGE) as url:
        run_json(ragexp, clean, *judged(url), custom(RUBRIC))
        asked = stats(url)["chat"]
        run_json(ragexp, clean, *judged(url), custom(RUBRIC))
        again = stats(url)["chat"] - asked
        first = run_json(ragexp, data, *judged(url), custom(RUBRIC, scale))
        calls = stats(url)["chat"]
        second = run_json(ragexp, data, *judged(url), custom(RUBRIC, scale))
        after = stats(url)["chat"]
        repeated = run_json(ragexp, data, *judged(url), custom(RUBRIC), "provider.judge.repeats=2")
        changed = run_json(ragexp, data, *judged(url), custom(RUBRIC.replace("拒答时", "回答")))
        after_change = stats(url)["chat"]
        chinese = run_json(ragexp, data, *judged(url), custom(RUBRIC), "provider.judge.language=chinese")
    # Ten cases: ten calls, then one (every judgement cached; one is asked afresh to learn who
    # serves the judge before the others are used).
    assert (asked, again) == (10, 1)
    # The second metric is ten new judgements, the changed question of case-0 one more (the other
    # cases' gives_hotline come from the cache); case-0's two failed, and a failure is asked again:
    # failing, they say nothing of who serves, so one cached judgement is asked afresh too.
    assert calls - asked - again == 11 and after - calls == 2 + 1
    assert first["summary"] == second["summary"]
    # The rubric quotes the number: answered cases lack it (0), two of four refusals give it (1);
    # case-0's judgement is off the scale: an error for that metric, never a score.
    assert first["summary"]["gives_hotline"] == pytest.approx(2 / 9)
    assert first["error_count"] == 1
    scored = cases_of(store_uri, first["run_id"], tmp_path)
    assert scored["case-0"]["metric_errors"] == {
        "gives_hotline": "the judge gave 6, not 0 or 1 (the rubric's scale)",
        "covers": "the judge gave 10, not a score from 1 to 5 (the rubric's scale)",
    }
    assert scored["case-6"]["metrics"]["gives_hotline"] == 1.0
    assert scored["case-6"]["rationale"]["gives_hotline"] == "has 400-820-8820"
    assert scored["case-9"]["rationale"]["gives_hotline"] == "missing 400-820-8820"
    # [1, 5] mapped onto [0, 10]: "fact 1." covers half of "question 1?" (3 of 5), a refusal none (1).
    assert scored["case-1"]["metrics"]["covers"] == 5.0 and scored["case-7"]["metrics"]["covers"] == 0.0
    # Cached with its rationale: the second run's cases say the same.
    assert cases_of(store_uri, second["run_id"], tmp_path)["case-9"]["rationale"] == scored["case-9"]["rationale"]
    logged = MlflowClient(store_uri).get_run(first["run_id"]).data.metrics
    assert logged["judge.chat_calls"] == 11 and logged["judge.prompt_tokens"] > 0
    assert logged["judge.cache_hits"] == 9
    assert MlflowClient(store_uri).get_run(second["run_id"]).data.metrics["judge.cache_hits"] == 18 - 1
    # Repeats: a second repeat is a new call per case; the spread is logged.
    assert MlflowClient(store_uri).get_run(repeated["run_id"]).data.metrics["judge_spread.gives_hotline"] == 0.0
    # Another rubric text is another metric identity: asked again, another config hash.
    assert after_change > calls and changed["config_hash"] != first["config_hash"]
    # The judge's assessments carry the judge identity and the rationale.
    traces = {case_id(t): feedback(t) for t in traces_of(store_uri, first["run_id"])}
    mark = traces["case-6"]["gives_hotline"]
    assert mark.source.source_type == "LLM_JUDGE" and mark.rationale == "has 400-820-8820"
    assert chinese["summary"]["gives_hotline"] == first["summary"]["gives_hotline"]


@pytest.mark.system
def test_a_changed_rubric_or_function_is_not_comparable_for_that_metric(
    ragexp: Any, store_uri: str, tmp_path: Path
) -> None:
    rules = tmp_path / "team"
    rules.mkdir()
    module = rules / "team_rules_changed.py"
    module.write_text("def check(case, output):\n    return 1.0\n", encoding="utf-8")
    entry = f"{{name: team_check, kind: python, target: 'team_rules_changed:check', path: '{rules}'}}"
    data = write_jsonl(tmp_path / "cases.jsonl", rows())
    base = run_json(ragexp, data, custom(entry, HOTLINE_METRIC))
    module.write_text("def check(case, output):\n    return 0.5  # edited\n", encoding="utf-8")
    cand = run_json(ragexp, data, custom(entry, HOTLINE_METRIC))
    assert base["config_hash"] != cand["config_hash"]
    diff = ragexp("diff", base["run_id"], cand["run_id"], "--json")
    assert diff.code == 0, diff.stderr
    metrics = {m["name"]: m for m in diff.json()["metrics"]}
    said = metrics["team_check"]["not_comparable"]
    assert re.fullmatch(
        r"defined differently in the two runs: the code of team_rules_changed:check changed "
        r"\(sha256:[0-9a-f]{17}… vs sha256:[0-9a-f]{17}…\)",
        said,
    ), said
    assert metrics["team_check"]["delta"] is None and metrics["team_check"]["ci_low"] is None
    assert "not_comparable" not in metrics["hotline"] and metrics["hotline"]["delta"] == 0.0
    text = ragexp("diff", base["run_id"], cand["run_id"])
    assert any(line.startswith("team_check") and "not comparable" in line for line in text.stdout.splitlines())
    assert f"note: team_check is not compared: {said}" in text.stdout.splitlines()
    gate = ragexp(
        "gate", "--baseline", base["run_id"], "--candidate", cand["run_id"], "gates.rules.team_check.max_drop=0.1"
    )
    assert gate.code == 2
    assert "team_check: defined differently in the two runs" in gate.stdout
    assert "so 'max_drop' cannot be checked" in gate.stdout


# --- the report, review queues, calibration -------------------------------------------------------


@pytest.mark.system
def test_the_report_says_defined_by_you(ragexp: Any, store_uri: str, tmp_path: Path) -> None:
    base = run_json(ragexp, write_jsonl(tmp_path / "base.jsonl", rows(4)), custom(HOTLINE_METRIC))
    cand = run_json(ragexp, write_jsonl(tmp_path / "cand.jsonl", rows(2)), custom(HOTLINE_METRIC))
    said = [("en", "defined by you", "defined by this project", "Source"), ("zh", "由你定义", "本项目定义", "出处")]
    for language, yours, project, header in said:
        out = tmp_path / f"report-{language}"
        made = ragexp("report", cand["run_id"], "--baseline", base["run_id"], "--out", str(out), "--language", language)
        assert made.code == 0, made.stderr
        text = (out / "report.md").read_text(encoding="utf-8")
        lines = text.splitlines()
        start = next(i for i, line in enumerate(lines) if line.startswith("|") and f"| {header} |" in line)
        table = [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[start:]]
        table = table[: next(i for i, row in enumerate(table) if row == [""])] if [""] in table else table
        columns, body = table[0], table[2:]
        source = columns.index(header)
        by_metric = {row[0].strip("`"): row for row in body}
        assert by_metric["hotline"][source] == yours
        assert by_metric["answer_accuracy"][source] == project
        assert "tests.pipelines.rules:hotline" in by_metric["hotline"][1]  # no description: the target
    assert "metrics.custom" in (tmp_path / "report-en" / "report.md").read_text(encoding="utf-8")


# --- the pieces -------------------------------------------------------------------------------------


def test_values_are_read_as_scores_or_as_errors() -> None:
    spec = custom_spec(compose_entry("{name: m, kind: python, target: 'x:y', range: [0, 1]}"), 0, "python:x")
    raw = [True, 0, 0.5, np.float32(0.25), 1 + 1e-12, Raised(ValueError("no")), TIMED_OUT, None, "yes", "NO", "x"]
    raw += [{"score": 1, "rationale": "ok"}, {"score": 2}, float("inf"), math.nan, -0.5, [1, 2]]
    values, problems, rationales = read_values(raw, spec, 2.0)
    assert values[:5].tolist() == [1.0, 0.0, 0.5, 0.25, 1.0]
    assert values[8] == 1.0 and values[9] == 0.0 and values[11] == 1.0
    assert problems == {
        5: "raised ValueError: no",
        6: "timed out after 2 s (metrics.custom[0].timeout_s)",
        7: 'returned None (no score), not a number, a bool or {"score", "rationale"}',
        10: 'returned str, not a number, a bool or {"score", "rationale"}',
        12: "returned 2, outside its range [0, 1]",
        13: "returned inf, outside its range [0, 1]",
        14: "returned NaN (no score)",
        15: "returned -0.5, outside its range [0, 1]",
        16: 'returned list, not a number, a bool or {"score", "rationale"}',
    }
    assert np.isnan(values[list(problems)]).all()
    assert rationales == {11: "ok"}
    # The common cases, one array: numbers alone; bools and small integers alone (one C pass).
    plain, none, said = read_values([0.0, 1.0, 2.0], spec, 2.0)
    assert plain.tolist()[:2] == [0.0, 1.0] and none == {2: "returned 2, outside its range [0, 1]"} and said == {}
    flags, wrong, _ = read_values([True, False, 1, 7, -1], spec, 2.0)
    assert flags.tolist()[:3] == [1.0, 0.0, 1.0]
    assert wrong == {3: "returned 7, outside its range [0, 1]", 4: "returned -1, outside its range [0, 1]"}
    empty, nothing, _ = read_values([], spec, 2.0)
    assert empty.size == 0 and nothing == {}


def compose_entry(text: str) -> Any:
    return compose([f"metrics.custom=[{text}]"]).metrics.custom[0]


def test_call_each_keeps_order_raises_and_deadlines() -> None:
    n = 20_000
    values = call_each(lambda a, b: a * b, list(range(n)), [2] * n, workers=4, timeout_s=5)
    assert values == [2 * i for i in range(n)]
    raised = call_each(lambda a, b: 1 / a, [1, 0, 2], [None] * 3, workers=2, timeout_s=5)
    assert raised[0] == 1.0 and isinstance(raised[1], Raised) and raised[2] == 0.5
    assert isinstance(raised[1].error, ZeroDivisionError)
    release = threading.Event()

    def stuck(a: int, b: Any) -> int:
        if a % 3 == 0:
            release.wait(10)
        return a

    started = time.perf_counter()
    found = call_each(stuck, list(range(7)), [None] * 7, workers=2, timeout_s=0.2)
    release.set()
    assert time.perf_counter() - started < 5
    assert [value is TIMED_OUT for value in found] == [True, False, False, True, False, False, True]
    assert [v for v in found if v is not TIMED_OUT] == [1, 2, 4, 5]

    def slow(a: int, b: Any) -> str:
        time.sleep(0.01)
        return threading.current_thread().name + str(id(threading.current_thread()))

    threads = set(call_each(slow, list(range(200)), [None] * 200, workers=8, timeout_s=5))
    assert 2 <= len(threads) <= 8  # slow calls spread over more workers, never more than asked


@pytest.mark.system  # a whole run: `make test`, not the edit loop
def test_specs_round_trip_and_say_what_differs() -> None:
    python = custom_spec(compose_entry("{name: m, kind: python, target: 'x:y', needs: [answer]}"), 0, "python:x@1")
    rubric = custom_spec(compose_entry("{name: m, kind: judge, rubric: r, scale: [1, 5], direction: lower}"), 3)
    for spec in (python, rubric):
        assert spec_from_json(json.loads(json.dumps(spec_json(spec)))) == spec
        assert not spec.official and spec.source == "defined by you" and spec.human_labels
    assert rubric.judge and not rubric.pass_fail and rubric.ragas_args == ("user_input", "response")
    assert rubric.custom is not None and rubric.custom.key == "metrics.custom[3]"
    assert python.needs_output == frozenset({"response"}) and python.population == "all"
    assert definition_change(python, python) is None
    other = custom_spec(compose_entry("{name: m, kind: python, target: 'x:y', needs: [answer]}"), 0, "python:x@2")
    assert definition_change(python, other) == "the code of x:y changed (1 vs 2)"
    moved = custom_spec(compose_entry("{name: m, kind: python, target: 'x:z', needs: [answer]}"), 0, "python:x@2")
    assert definition_change(python, moved) == "target differs (x:y vs x:z)"
    lower = custom_spec(compose_entry("{name: m, kind: python, target: 'x:y', direction: lower}"), 0, "python:x@1")
    assert definition_change(python, lower) == "direction differs (higher vs lower)"
    wider = custom_spec(compose_entry("{name: m, kind: judge, rubric: r, scale: [1, 4], direction: lower}"), 3)
    assert definition_change(rubric, wider).startswith("the rubric or its scale changed (judge:")  # type: ignore[union-attr]
    assert definition_change(python, rubric) == "kind differs (python vs judge)"
    assert definition_change(METRICS["mrr"], METRICS["mrr"]) is None


def test_the_registry_is_not_changed_by_a_run_of_custom_metrics(tmp_path: Path) -> None:
    before = dict(METRICS)
    loaded = load_custom(compose([custom(HOTLINE_METRIC)]).metrics.custom)
    assert [spec.name for spec in loaded.specs] == ["hotline"] and "hotline" not in METRICS
    assert before == METRICS
    assert loaded.identities()["hotline"].startswith("python:tests.pipelines.rules:hotline@sha256:")


def test_configs_without_custom_metrics_keep_their_hash() -> None:
    from ragexp.config.identity import config_hash, identity_view, run_params

    plain = compose(["provider=replay"])
    assert "custom" not in identity_view(plain)["metrics"] and "metrics.custom" not in run_params(plain)
    with_one = compose(["provider=replay", custom(HOTLINE_METRIC)])
    assert "metrics.custom" in run_params(with_one)
    assert config_hash(plain, "x") != config_hash(with_one, "x")
    assert config_hash(with_one, "x", metrics={"hotline": "a"}) != config_hash(with_one, "x", metrics={"hotline": "b"})


def test_scoring_skips_failed_cases_and_the_unanswerable_ones_of_an_answerable_metric() -> None:
    from ragexp.metrics.custom import score_python

    entry = compose_entry("{name: m, kind: python, target: 'tests.pipelines.rules:hotline', over: answerable}")
    loaded = load_custom([entry])
    cases = [Case(f"c{i}", "q", [], [], None, i == 2, i + 1) for i in range(3)]
    results = [CaseResult("c0", SystemOutput(answer="a")), CaseResult("c1", None, "refused")]
    results.append(CaseResult("c2", SystemOutput()))
    scores = score_python(loaded.python, cases, results, np.array([r.ok for r in results]), workers=2)
    assert scores["m"][0] == 1.0 and np.isnan(scores["m"][1:]).all()
    assert all(not result.metric_errors for result in results)


@pytest.mark.system
def test_a_rubric_is_labelled_in_a_review_queue_and_calibrated_against_people(
    ragexp: Any, store_uri: str, tmp_path: Path
) -> None:
    import mlflow
    from mlflow.genai import label_schemas

    from tests.test_label_queue import queue_traces, review, trace_cases

    data = write_jsonl(tmp_path / "cases.jsonl", rows(2))
    hotline = "{name: hotline, kind: python, target: 'tests.pipelines.rules:hotline'}"
    try:
        with serve(JUDGE) as url:
            first = run_json(ragexp, data, *judged(url), custom(RUBRIC, hotline))
            again = run_json(ragexp, data, "run_name=again", *judged(url), custom(RUBRIC, hotline))
        made = ragexp("label", first["run_id"], "--json")
        assert made.code == 0, made.stderr
        queue = made.json()
        assert list(queue["schemas"]) == ["answer_accuracy", "gives_hotline", "hotline"]
        mlflow.set_tracking_uri(store_uri)
        rubric = label_schemas.get_label_schema("gives_hotline", experiment_id=queue["experiment_id"])
        assert isinstance(rubric.input, label_schemas.InputPassFail)  # a pass/fail rubric, asked as such
        assert rubric.instruction == "拒答时必须给出「400-820-8820」"
        numeric = label_schemas.get_label_schema("hotline", experiment_id=queue["experiment_id"])
        assert isinstance(numeric.input, label_schemas.InputNumeric) and numeric.input.max_value == 1.0
        # People agree with the judge on every case but case-6, where they say it fails.
        cases = trace_cases(store_uri, queue_traces(store_uri, queue["queue_id"]))
        judge = {f"case-{i}": 1.0 if i in (6, 7) else 0.0 for i in range(10)}
        for trace, case in cases.items():
            review(store_uri, trace, "gives_hotline", bool(judge[case]) and case != "case-6")
        calibrated = ragexp("calibrate", first["run_id"], "--json")
        assert calibrated.code == 0, calibrated.stderr
        figures = calibrated.json()
        assert figures["labels"] == {"answer_accuracy": 0, "gives_hotline": 10, "hotline": 0}
        found = figures["calibration"]["gives_hotline"]
        assert found["n"] == 10 and found["bias"] == pytest.approx(0.1) and found["accuracy"] == pytest.approx(0.9)
        logged = MlflowClient(store_uri).get_run(first["run_id"]).data.metrics
        assert logged["calibration.gives_hotline.n"] == 10 and "ppi.gives_hotline.mean" in logged
        # A gate's calibration rule reads it like any judge metric's.
        rule = "gates.rules.gives_hotline.min_kappa=0.9"
        gate = ragexp("gate", "--baseline", again["run_id"], "--candidate", first["run_id"], rule, "--json")
        checked = {(r["metric"], r["rule"]): r for r in gate.json()["rules"]}[("gives_hotline", "min_kappa")]
        # κ of the pass/fail calls: 9 of 10 agree, chance agreement (2·1 + 8·9)/100: κ = 16/26.
        assert found["kappa"] == pytest.approx(16 / 26)
        assert checked["outcome"] == "failed"
        assert checked["message"] == "gives_hotline: judge not calibrated (κ 0.62 < 0.90 on 10 labelled cases)"
    finally:
        mlflow.set_tracking_uri(None)


def test_a_metric_that_changes_what_it_is_given_is_its_error_and_the_change_is_undone(
    ragexp: Any, store_uri: str, tmp_path: Path
) -> None:
    data = write_jsonl(tmp_path / "cases.jsonl", rows(bad=(1,)))
    entries = [
        "{name: meddling, kind: python, target: 'tests.pipelines.rules:meddling'}",
        "{name: reads_answer, kind: python, target: 'tests.pipelines.rules:reads_answer', over: answerable}",
    ]
    payload = run_json(ragexp, data, custom(*entries))
    assert payload["error_count"] == 1
    scored = cases_of(store_uri, payload["run_id"], tmp_path)
    bad = scored["bad-1"]
    assert bad["question"] == "question 1?" and bad["output"]["answer"] == "fact 1."
    assert bad["output"]["contexts"] == ["fact 1 is in this text."]
    assert bad["metrics"]["meddling"] is None and "changed the case or the output" in bad["metric_errors"]["meddling"]
    assert bad["metrics"]["reads_answer"] == 1.0  # the later metric read the case as the system answered it
    assert bad["metrics"]["answer_accuracy"] == 1.0
    assert scored["case-2"]["metrics"]["meddling"] == 1.0


def test_a_rubric_score_given_as_a_bool_or_a_string_is_an_error_and_a_refusal_says_why(
    ragexp: Any, store_uri: str, tmp_path: Path
) -> None:
    answers = rows(2)
    answers[1]["question"] = "JUDGE-BOOL question 1?"
    answers[2]["question"] = "JUDGE-TEXT question 2?"
    answers[4]["question"] = "JUDGE-REFUSE question 4?"
    data = write_jsonl(tmp_path / "cases.jsonl", answers)
    scale = "{name: covers, kind: judge, rubric: 'the answer covers the question', scale: [1, 5]}"
    with serve(JUDGE) as url:
        payload = run_json(ragexp, data, *judged(url), custom(scale))
    scored = cases_of(store_uri, payload["run_id"], tmp_path)
    for case in ("case-1", "case-2"):
        assert scored[case]["metrics"]["covers"] is None
        assert "RubricVerdict" in scored[case]["metric_errors"]["covers"], scored[case]
    assert scored["case-3"]["metrics"]["covers"] is not None
    # A refusal is an error that says what the judge said.
    assert scored["case-4"]["metric_errors"]["covers"].endswith("the judge refused: I cannot grade this content.")
    assert payload["error_count"] == 3


def test_a_rubric_verdict_takes_numbers_only() -> None:
    from pydantic import ValidationError

    from ragexp.metrics.judge.rubric import RubricVerdict

    assert RubricVerdict.model_validate_json('{"score": 3, "rationale": "r"}').score == 3.0
    for score in ("true", '"1"', "null"):
        with pytest.raises(ValidationError):
            RubricVerdict.model_validate_json(f'{{"score": {score}, "rationale": "r"}}')
