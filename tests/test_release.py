"""Release checks where they run: baseline selectors, the default candidate, JUnit XML, the
Markdown summary, `--promote` under concurrent pipelines, and the CI templates' own steps."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import xmlschema
import yaml
from mlflow.tracking import MlflowClient

from ragexp.compare.diff import MetricDiff
from ragexp.compare.figures import fmt
from ragexp.compare.gate import check_rules
from ragexp.config.models import GateRule, GatesConfig
from tests.conftest import ROOT, write_jsonl
from tests.test_compare import replay_rows, run_replay

SCHEMAS = ROOT / "tests/schemas"
RAGEXP = [sys.executable, "-m", "ragexp.cli.app"]


def one_error_line(stderr: str) -> str:
    """The error line of a failed command; selection lines before it are informational."""
    errors = [line for line in stderr.strip().splitlines() if line.startswith("ragexp: error:")]
    assert len(errors) == 1, stderr
    return errors[0]


def cli(*args: str, uri: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*RAGEXP, *args],
        capture_output=True,
        text=True,
        cwd=cwd,
        env={**os.environ, "MLFLOW_TRACKING_URI": uri},
        timeout=600,
    )


# --- which runs are compared -----------------------------------------------------------------------


def test_default_candidate_is_the_newest_comparable_run_after_the_baseline(ragexp: Any, tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "a.jsonl", replay_rows([{"rank": 1}] * 8 + [{"rank": 2}] * 2))
    older = run_replay(ragexp, path)["run_id"]
    base = run_replay(ragexp, path)["run_id"]
    # Issue 11: with runs O then B, `gate --baseline B` picked O. Nothing was created after B.
    alone = ragexp("gate", "--baseline", base)
    assert alone.code == 1
    assert "no finished ragexp run created after the baseline in experiment 'ragexp'" in one_error_line(alone.stderr)
    assert older not in alone.stdout

    cand = run_replay(ragexp, path)["run_id"]
    other_k = ragexp("run", f"dataset.path={path}", "dataset.name=crafted", "provider=replay", "k=5", "--json")
    newest_incomparable = other_k.json()["run_id"]
    chosen = ragexp("gate", "--baseline", base, "--json")
    assert chosen.code == 0, chosen.stderr
    assert chosen.json()["candidate"] == cand
    line = next(x for x in chosen.stderr.splitlines() if x.startswith("candidate:"))
    assert cand in line and "the newest finished run created after the baseline" in line
    assert f"skipped 1 newer run(s) not comparable ({newest_incomparable}: K differs (3 vs 5))" in line
    assert chosen.json()["selection"]["candidate"] == line

    # After `cand` only a run with another K exists: say so, never fall back to an older run.
    none = ragexp("gate", "--baseline", cand)
    assert none.code == 1
    assert (
        f"none of the 1 finished run(s) created after the baseline in experiment 'ragexp' is comparable with {cand}"
        in (one_error_line(none.stderr))
    )
    same = ragexp("gate", "--baseline", base, "--candidate", base)
    assert same.code == 1 and "is the baseline itself" in one_error_line(same.stderr)


@pytest.mark.system
def test_baseline_selectors(ragexp: Any, store_uri: str, tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "a.jsonl", replay_rows([{"rank": 1}] * 10))
    prod = run_replay(ragexp, path)["run_id"]
    other_k = ragexp("run", f"dataset.path={path}", "dataset.name=crafted", "provider=replay", "k=5", "--json")
    prod_k5 = other_k.json()["run_id"]
    cand = run_replay(ragexp, path)["run_id"]
    client = MlflowClient(store_uri)
    client.set_tag(prod, "role", "production")

    picked = ragexp("gate", "--baseline", "tag:role=production", "--json")
    assert picked.code == 0, picked.stderr
    assert (picked.json()["baseline"], picked.json()["candidate"]) == (prod, cand)
    assert picked.stderr.startswith(f"baseline: tag:role=production -> run {prod}")

    # Two runs carry the tag and cannot be compared with one another: without a candidate that is
    # ambiguous (one line, exit 1); with one, the run comparable with it is chosen and named.
    client.set_tag(prod_k5, "role", "production")
    ambiguous = ragexp("gate", "--baseline", "tag:role=production")
    assert ambiguous.code == 1
    assert "2 finished runs carry that tag in any experiment and they are not comparable" in one_error_line(
        ambiguous.stderr
    )
    given = ragexp("gate", "--baseline", "tag:role=production", "--candidate", cand, "--json")
    assert given.code == 0 and given.json()["baseline"] == prod
    assert (
        f"skipped 1 newer run(s) not comparable ({prod_k5}: K differs (5 vs 3))"
        in given.json()["selection"]["baseline"]
    )

    latest = ragexp("diff", "latest:ragexp", cand, "--json")
    assert latest.code == 0, latest.stderr
    assert latest.json()["baseline"] == prod  # the newest comparable run of the experiment that is not the candidate
    for selector, message in [
        ("tag:role=staging", "--baseline tag:role=staging: no finished ragexp run carries that tag"),
        ("latest:nowhere", "--baseline latest:nowhere: no experiment named 'nowhere'"),
        ("tag:role", "--baseline 'tag:role': expected tag:KEY=VALUE"),
        ("tag:role=it's", "a value cannot contain '"),
    ]:
        result = ragexp("gate", "--baseline", selector)
        assert result.code == 1, (selector, result.stderr)
        assert message in one_error_line(result.stderr)
    nothing_comparable = ragexp("gate", "--baseline", "latest:ragexp", "--candidate", prod_k5)
    assert nothing_comparable.code == 1
    assert f"is comparable with {prod_k5}" in one_error_line(nothing_comparable.stderr)


@pytest.mark.system
def test_a_tag_baseline_is_found_in_another_experiment_when_the_candidates_has_none(
    ragexp: Any, store_uri: str, tmp_path: Path
) -> None:
    # docs/ci.md: with --candidate, the newest comparable tagged run in the candidate's
    # experiment, else in any experiment (a production baseline kept in an experiment of its own).
    path = write_jsonl(tmp_path / "a.jsonl", replay_rows([{"rank": 1}] * 10))
    prod = run_replay(ragexp, path, "experiment=production")["run_id"]
    cand = run_replay(ragexp, path, "experiment=feature-x")["run_id"]
    client = MlflowClient(store_uri)
    client.set_tag(prod, "role", "production")
    found = ragexp("gate", "--baseline", "tag:role=production", "--candidate", cand, "--json")
    assert found.code == 0, found.stderr
    assert found.json()["baseline"] == prod
    assert "the newest finished run in any other experiment comparable with" in found.json()["selection"]["baseline"]
    # A tagged run in the candidate's own experiment comes first, even if older.
    own = run_replay(ragexp, path, "experiment=feature-x")["run_id"]
    client.set_tag(own, "role", "production")
    assert ragexp("gate", "--baseline", "tag:role=production", "--candidate", cand, "--json").json()["baseline"] == own
    # Nothing comparable anywhere: one line that says where it looked.
    other_k = ragexp("run", f"dataset.path={path}", "dataset.name=crafted", "provider=replay", "k=5", "--json")
    lonely = other_k.json()["run_id"]
    missing = ragexp("gate", "--baseline", "tag:role=staging", "--candidate", lonely)
    assert missing.code == 1
    assert one_error_line(missing.stderr) == (
        "ragexp: error: --baseline tag:role=staging: no finished ragexp run in the candidate's experiment; "
        "no finished ragexp run in any other experiment"
    )


# --- figures that do not mislead ---------------------------------------------------------------------


def test_ratio_rule_on_a_near_zero_baseline_is_stated_plainly() -> None:
    gates = GatesConfig(name="t", rules={"p95_seconds": GateRule(max_increase_ratio=0.2)}, max_error_rate=None)
    tiny = MetricDiff("p95_seconds", "lower", 3.914e-06, 1.46, 1.46, None, None, None, 0, 10, 0, 10)
    failures, checked = check_rules(gates, {"p95_seconds": tiny}, errored=0, total=10)
    assert checked == 1 and len(failures) == 1
    message = failures[0].message
    assert message.startswith(f"p95_seconds: {fmt(3.914e-06)} -> {fmt(1.46)}: ") and fmt(3.914e-06) == "3.91e-06"
    assert "a baseline that is practically zero allows practically no rise; it rose by 1.4600" in message
    assert "%" not in message.replace("+20%", "")
    zero = MetricDiff("p95_seconds", "lower", 0.0, 0.5, 0.5, None, None, None, 0, 10, 0, 10)
    assert "on a zero baseline" in check_rules(gates, {"p95_seconds": zero}, 0, 10)[0][0].message
    # Two in-process runs measure microseconds of timer noise: no change that could be printed.
    noise = MetricDiff("p95_seconds", "lower", 4.2e-06, 9.8e-06, 5.6e-06, None, None, None, 0, 10, 0, 10)
    assert check_rules(gates, {"p95_seconds": noise}, 0, 10) == ([], 1)
    steep = MetricDiff("p95_seconds", "lower", 0.01, 1.46, 1.45, None, None, None, 0, 10, 0, 10)
    assert (
        "0.0100 -> 1.4600, 146.0x the baseline worse (allowed +20%)"
        in check_rules(gates, {"p95_seconds": steep}, 0, 10)[0][0].message
    )


def unanswerable_rows(count: int) -> list[dict[str, Any]]:
    """Unanswerable cases the system rightly refused, retrieving nothing (1.0 on their own rows)."""
    return [
        {
            "id": f"none-{i}",
            "question": f"unanswerable {i}?",
            "unanswerable": True,
            "response": "知识库中没有足够证据回答。",
            "retrieved_ids": [],
            "retrieved_contexts": [],
            "citations": [],
            "latency_seconds": 1.0,
        }
        for i in range(count)
    ]


def test_a_gate_reason_names_the_cases_its_mean_or_change_is_over(ragexp: Any, tmp_path: Path) -> None:
    """Issue 32 §3: a figure quoted in a rule's why text carries its population, the same words as
    the population column, in the terminal and in --json; a run-level figure carries none."""
    base_rows = replay_rows([{"rank": 1}] * 30) + unanswerable_rows(5)
    cand_rows = replay_rows([{"rank": 2, "correct": False}] * 7 + [{"rank": 1}] * 23) + unanswerable_rows(5)
    base = run_replay(ragexp, write_jsonl(tmp_path / "base.jsonl", base_rows))["run_id"]
    cand = run_replay(ragexp, write_jsonl(tmp_path / "cand.jsonl", cand_rows))["run_id"]
    rules = [
        "gates.rules.mrr.max_drop=0.01",
        "gates.rules.recall_at_k.min=0.9",
        "+gates.rules.ndcg_at_k.max_drop=0.01",
        "gates.rules.ndcg_at_k.statistical=true",
        "gates.rules.answer_accuracy.max_drop=0.01",
    ]
    gate = ragexp("gate", "--baseline", base, "--candidate", cand, *rules, "--json")
    assert gate.code == 2, gate.stderr
    checked = {(r["metric"], r["rule"]): r for r in gate.json()["rules"]}
    mrr = checked["mrr", "max_drop"]
    # 7 of the 30 answerable cases moved from rank 1 to rank 2; the 5 unanswerable are left out.
    assert mrr["message"] == (
        f"mrr: 1.0000 -> {fmt(1 - 3.5 / 30)} on 30 of 35 (answerable), worse by {fmt(3.5 / 30)} (allowed drop 0.01)"
    )
    assert checked["recall_at_k", "min"]["message"] == (
        "recall_at_k: the candidate's own mean 1.0000 on 30 of 35 (answerable) is at or above the floor 0.9"
    )
    ndcg = checked["ndcg_at_k", "max_drop"]["message"]
    assert ndcg.startswith("ndcg_at_k: paired difference interval [") and "] on 30 of 35 (answerable) " in ndcg
    # Answer accuracy covers every case: its population is all 35.
    accuracy = checked["answer_accuracy", "max_drop"]
    assert accuracy["message"] == f"answer_accuracy: 1.0000 -> {fmt(28 / 35)} on 35 of 35, worse by {fmt(7 / 35)} " + (
        "(allowed drop 0.01)"
    )
    for rule in (mrr, checked["recall_at_k", "min"], accuracy):  # the words of the population column
        assert rule["message"].count(f" on {rule['population']}") == 1
    p95 = checked["p95_seconds", "max_increase_ratio"]
    assert p95["population"] is None and " on " not in p95["message"]

    text = ragexp("gate", "--baseline", base, "--candidate", cand, *rules)
    assert text.code == 2
    assert "on 30 of 35 (answerable), worse by" in text.stdout
    assert "on 35 of 35, worse by" in text.stdout


# --- JUnit XML and the Markdown summary -------------------------------------------------------------


@pytest.fixture
def regressed_pair(ragexp: Any, tmp_path: Path) -> tuple[str, str]:
    """A candidate whose MRR and answer accuracy dropped on the same 7 of 30 cases."""
    base = run_replay(ragexp, write_jsonl(tmp_path / "base.jsonl", replay_rows([{"rank": 1}] * 30)))
    specs = [{"rank": 2, "correct": False}] * 7 + [{"rank": 1}] * 23
    cand = run_replay(ragexp, write_jsonl(tmp_path / "cand.jsonl", replay_rows(specs)))
    return base["run_id"], cand["run_id"]


def test_junit_report_validates_and_carries_every_rule(
    ragexp: Any, regressed_pair: tuple[str, str], store_uri: str, tmp_path: Path
) -> None:
    base, cand = regressed_pair
    report = tmp_path / "out/deep/gate.xml"
    # faithfulness is a rule on a score neither run has: it cannot be decided, which is an <error>.
    result = ragexp(
        "gate", "--baseline", base, "--candidate", cand, "--junit", str(report), "+gates.rules.faithfulness.min=0.5"
    )
    assert result.code == 2, result.stderr
    schema = xmlschema.XMLSchema(SCHEMAS / "junit-10.xsd")
    schema.validate(str(report))  # raises on any violation
    tree = ET.parse(report).getroot()
    suites = tree.findall("testsuite")
    assert tree.tag == "testsuites" and len(suites) == 1
    suite = suites[0]
    cases = suite.findall("testcase")
    assert [(c.get("classname"), c.get("name")) for c in cases] == [
        ("error_rate", "max_error_rate"),
        ("recall_at_k", "max_drop"),
        ("mrr", "max_drop"),
        ("citation_precision", "min"),
        ("answer_accuracy", "max_drop"),
        ("p95_seconds", "max_increase_ratio"),
        ("faithfulness", "min"),
    ]
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("7", "2", "1")
    failed = {c.get("classname"): c.find("failure") for c in cases if c.find("failure") is not None}
    assert set(failed) == {"mrr", "answer_accuracy"}
    mrr = failed["mrr"]
    assert mrr is not None
    # 7 of 30 cases moved from rank 1 to rank 2: MRR 1 -> 1 - 7 * 0.5 / 30.
    assert mrr.get("message") == (
        f"mrr: 1.0000 -> {fmt(1 - 3.5 / 30)} on 30 of 30, worse by {fmt(3.5 / 30)} (allowed drop 0.01)"
    )
    assert (mrr.text or "").splitlines()[:3] == [
        "baseline: 1.0000",
        f"candidate: {fmt(1 - 3.5 / 30)}",
        "threshold: 0.01",
    ]
    error = next(c.find("error") for c in cases if c.get("classname") == "faithfulness")
    assert error is not None and "has no score for it" in (error.get("message") or "")
    properties = {p.get("name"): p.get("value") for p in suite.iter("property")}
    tags = {r: MlflowClient(store_uri).get_run(r).data.tags for r in (base, cand)}
    assert properties["baseline.run_id"] == base and properties["candidate.run_id"] == cand
    assert properties["baseline.config_hash"] == tags[base]["ragexp.config_hash"]
    assert properties["candidate.config_hash"] == tags[cand]["ragexp.config_hash"]
    assert properties["dataset_hash"] == tags[base]["ragexp.dataset_hash"] == tags[cand]["ragexp.dataset_hash"]
    assert properties["ragexp.verdict"] == "failed"
    # The JSON agrees: undecided rules are failures of the gate and are listed with their outcome.
    verdict = ragexp("gate", "--baseline", base, "--candidate", cand, "+gates.rules.faithfulness.min=0.5", "--json")
    outcomes = {(r["metric"], r["rule"]): r["outcome"] for r in verdict.json()["rules"]}
    assert outcomes[("faithfulness", "min")] == "undecided" and outcomes[("recall_at_k", "max_drop")] == "passed"
    assert {f["metric"] for f in verdict.json()["failures"]} == {"mrr", "answer_accuracy", "faithfulness"}

    # A passing gate: every rule a test case without failure or error, and the file still validates.
    loose = tmp_path / "loose.xml"
    passing = ragexp(
        "gate",
        "--baseline",
        base,
        "--candidate",
        cand,
        "--junit",
        str(loose),
        "gates.rules.mrr.max_drop=0.5",
        "gates.rules.answer_accuracy.max_drop=0.5",
    )
    assert passing.code == 0, passing.stderr
    schema.validate(str(loose))
    root = ET.parse(loose).getroot()
    assert root.find("testsuite/testcase/failure") is None and root.find("testsuite/testcase/error") is None
    assert len(root.findall("testsuite/testcase")) == 6


def test_summary_of_gate_and_diff_in_both_languages(
    ragexp: Any, regressed_pair: tuple[str, str], tmp_path: Path
) -> None:
    base, cand = regressed_pair
    figures = ragexp("diff", base, cand, "--json", "--top", "10").json()
    mrr = next(m for m in figures["metrics"] if m["name"] == "mrr")
    worst = [case["id"] for case in figures["cases"][:5]]
    assert len(figures["cases"]) == 7 and len(worst) == 5

    en, zh = tmp_path / "en.md", tmp_path / "zh.md"
    for path, language in [(en, "en"), (zh, "zh")]:
        result = ragexp("gate", "--baseline", base, "--candidate", cand, "--summary", str(path), "--language", language)
        assert result.code == 2, result.stderr
    english, chinese = en.read_text(encoding="utf-8"), zh.read_text(encoding="utf-8")
    assert english.splitlines()[0] == "## ❌ Release gate `release`: FAILED"
    assert english.splitlines()[2] == "2 of 6 rules did not pass."
    assert chinese.splitlines()[0] == "## ❌ 发布门禁 `release`：未通过"
    row = (
        f"| `mrr` | higher | 1.0000 | {fmt(mrr['candidate'])} | {fmt(mrr['delta'])} | "
        f"[{fmt(mrr['ci_low'])}, {fmt(mrr['ci_high'])}] | {fmt(mrr['p_value'])} | 0/7/23 | 🔴 worse |"
    )
    assert row in english
    assert row.replace("higher", "越高越好").replace("worse", "变差") in chinese
    for text in (english, chinese):
        failed_section = text.split("###")[1]
        assert "`mrr` | `max_drop`" in failed_section and "`answer_accuracy` | `max_drop`" in failed_section
        listed = [line.split("`")[1] for line in text.split("###")[3].splitlines() if line.startswith("| `")]
        assert listed == worst
        assert "](" not in text  # a local SQLite store has no UI to link to
    # The verdict comes before anything else, the failed rules before the metric table.
    assert english.index("FAILED") < english.index("Rules that did not pass") < english.index("### Metrics")

    ui = tmp_path / "ui.md"
    linked = ragexp(
        "diff", base, cand, "--summary", str(ui), "--language", "en", "--ui-url", "http://alice:pw@mlflow.example:5000/"
    )
    assert linked.code == 0, linked.stderr
    text = ui.read_text(encoding="utf-8")
    assert text.startswith("## ⚠️ Candidate vs baseline: 0 better, 3 worse, 4 unchanged")
    experiment = MlflowClient().get_run(cand).info.experiment_id
    assert f"[`{cand}`](http://mlflow.example:5000/#/experiments/{experiment}/runs/{cand})" in text
    assert "alice" not in text and "pw@" not in text


def test_unwritable_outputs_are_refused_before_any_work(
    ragexp: Any, regressed_pair: tuple[str, str], store_uri: str, tmp_path: Path
) -> None:
    base, cand = regressed_pair
    a_file = tmp_path / "plain.txt"
    a_file.write_text("x")
    for option, path, why in [
        ("--junit", str(a_file / "gate.xml"), f"{a_file} is a file, not a folder"),
        ("--summary", str(tmp_path), "is a directory, not a file"),
        ("--junit", "/proc/version", "cannot write there"),
    ]:
        result = ragexp("gate", "--baseline", base, "--candidate", cand, option, path)
        assert result.code == 1, result.stderr
        assert result.stderr.startswith(f"ragexp: error: {option} {path}: ") and why in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1 and result.stdout == ""
    bad_diff = ragexp("diff", base, cand, "--summary", str(tmp_path))
    assert bad_diff.code == 1 and len(bad_diff.stderr.strip().splitlines()) == 1
    # Refused before any work: the gate never ran, so the candidate carries no verdict.
    assert "ragexp.gate.verdict" not in MlflowClient(store_uri).get_run(cand).data.tags


# --- --promote ---------------------------------------------------------------------------------------


def holders(uri: str, experiment_id: str) -> list[str]:
    runs = MlflowClient(uri).search_runs([experiment_id], filter_string="tags.`role` = 'production'")
    return sorted(run.info.run_id for run in runs)


def test_promote_moves_the_tag_only_when_the_gate_passes(
    ragexp: Any, regressed_pair: tuple[str, str], store_uri: str
) -> None:
    base, cand = regressed_pair
    client = MlflowClient(store_uri)
    client.set_tag(base, "role", "production")
    experiment = client.get_run(base).info.experiment_id
    refused = ragexp("gate", "--baseline", base, "--candidate", cand, "--promote")
    assert refused.code == 1 and "--promote needs a tag to move" in one_error_line(refused.stderr)
    failed = ragexp("gate", "--baseline", "tag:role=production", "--candidate", cand, "--promote")
    assert failed.code == 2 and "not promoted: the gate failed" in failed.stderr
    assert holders(store_uri, experiment) == [base]
    passed = ragexp(
        "gate",
        "--baseline",
        "tag:role=production",
        "--candidate",
        cand,
        "--promote",
        "gates.rules.mrr.max_drop=1",
        "gates.rules.answer_accuracy.max_drop=1",
        "--json",
    )
    assert passed.code == 0, passed.stderr
    assert passed.json()["promotion"] == {
        "tag": "role=production",
        "promoted": True,
        "previous": [base],
        "message": f"promoted: tag role=production moved to {cand} from {base}",
    }
    assert holders(store_uri, experiment) == [cand]
    assert client.get_run(cand).data.tags["ragexp.promoted.from"] == base


def paused_outside_a_write(proc: subprocess.Popen[str], db: Path) -> None:
    """A SQLite store is one file lock: a gate stopped inside its write transaction (it records
    its verdict right after naming its runs) would lock the other gate out for as long as it is
    stopped. Let it step on, a moment at a time, until it is stopped holding no write lock."""
    for _ in range(1000):
        while Path(f"/proc/{proc.pid}/stat").read_text().split(") ", 1)[1][0] not in "TZ":
            time.sleep(0.001)  # the stop is delivered asynchronously
        probe = sqlite3.connect(db, timeout=0)
        try:
            probe.execute("BEGIN IMMEDIATE")
            probe.execute("ROLLBACK")
            return
        except sqlite3.OperationalError:
            proc.send_signal(signal.SIGCONT)
            proc.send_signal(signal.SIGSTOP)
        finally:
            probe.close()
    raise AssertionError("the gate held the store's write lock at every pause")


@pytest.mark.system
@pytest.mark.parametrize("where", ["sqlite", "server"])
def test_two_concurrent_promotions_have_one_winner(where: str, server: str, tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path}/store/mlflow.db" if where == "sqlite" else server
    experiment = f"promote-{where}-{time.time_ns()}"
    rows = write_jsonl(tmp_path / "cases.jsonl", replay_rows([{"rank": 1}] * 20))
    ids = []
    for _ in range(3):
        done = cli(
            "run", f"dataset.path={rows}", "provider=replay", "k=3", f"experiment={experiment}", "--json", uri=uri
        )
        assert done.returncode == 0, done.stderr
        ids.append(json.loads(done.stdout)["run_id"])
    base, first, second = ids
    client = MlflowClient(uri)
    client.set_tag(base, "role", "production")
    experiment_id = client.get_run(base).info.experiment_id
    procs = []
    for cand in (first, second):
        proc = subprocess.Popen(
            [*RAGEXP, "gate", "--baseline", "tag:role=production", "--candidate", cand, "--promote", "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "MLFLOW_TRACKING_URI": uri},
        )
        procs.append(proc)
        # The gate names its runs once it has read who holds the tag; pausing it there makes sure
        # both pipelines start from the same production run, whatever the machine's load.
        assert proc.stderr is not None
        seen = proc.stderr.readline()
        assert seen.startswith(f"baseline: tag:role=production -> run {base}"), seen
        proc.send_signal(signal.SIGSTOP)
        if where == "sqlite":
            paused_outside_a_write(proc, tmp_path / "store/mlflow.db")
    for proc in procs:
        proc.send_signal(signal.SIGCONT)
    outcomes = [(proc.wait(timeout=300), *proc.communicate()) for proc in procs]
    codes = sorted(code for code, _, _ in outcomes)
    assert codes == [0, 1], "\n".join(f"{c}\n{o}\n{e}" for c, o, e in outcomes)
    winner = (first, second)[[code for code, _, _ in outcomes].index(0)]
    _, loser_out, loser_err = next(o for o in outcomes if o[0] == 1)
    assert loser_out, loser_err
    assert json.loads(loser_out)["passed"] is True and json.loads(loser_out)["promotion"]["promoted"] is False
    assert one_error_line(loser_err).startswith(f"ragexp: error: not promoted: tag role=production moved to {winner}")
    assert holders(uri, experiment_id) == [winner]
    # The lock lives only while a promotion runs.
    assert not [m.name for m in client.search_registered_models() if m.name.startswith("ragexp.promotion-lock.")]


# --- the CI templates -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("template", "schema"),
    [("github-actions.yml", "github-workflows.json"), ("gitlab-ci.yml", "gitlab-ci.json")],
)
def test_ci_templates_match_their_schemas(template: str, schema: str, tmp_path: Path) -> None:
    check = [sys.executable, "-m", "check_jsonschema", "--schemafile", str(SCHEMAS / schema)]
    good = subprocess.run([*check, str(ROOT / "examples/ci" / template)], capture_output=True, text=True)
    assert good.returncode == 0, good.stdout + good.stderr
    # The check can fail: the same file with its job's steps/script replaced by a string.
    doc = yaml.safe_load((ROOT / "examples/ci" / template).read_text())
    if "jobs" in doc:
        doc["jobs"]["rag-gate"]["steps"] = "make setup"
    else:
        doc["rag-gate"]["artifacts"]["when"] = "sometimes"
    broken = tmp_path / template
    broken.write_text(yaml.safe_dump(doc))
    bad = subprocess.run([*check, str(broken)], capture_output=True, text=True)
    assert bad.returncode == 1, bad.stdout


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    """A checkout as a CI runner sees it: the project's files (the set-up venv linked in)."""
    folder = tmp_path / "checkout"
    folder.mkdir()
    for name in ["Makefile", "pyproject.toml", "requirements.lock", "ragexp", "experiments", ".venv"]:
        (folder / name).symlink_to(ROOT / name)
    return folder


class Runner:
    """Runs a template's shell steps with bash, as the CI services do, and stops what they leave
    running (the background service) by process group afterwards."""

    def __init__(self, workspace: Path, env: dict[str, str]) -> None:
        self.workspace = workspace
        self.env = env
        self.groups: list[int] = []

    def bash(self, script: str) -> subprocess.CompletedProcess[str]:
        proc = subprocess.Popen(
            ["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", script],
            cwd=self.workspace,
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        self.groups.append(proc.pid)
        out, err = proc.communicate(timeout=600)
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    def stop(self) -> None:
        for group in self.groups:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(group, signal.SIGTERM)


@pytest.fixture
def runner(workspace: Path) -> Iterator[Runner]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "CI_", "RAGEXP_", "MLFLOW_"))}
    # The CI image's python is the project's interpreter here; `make setup` finds the venv ready.
    env["PATH"] = f"{Path(sys.executable).parent}:{env['PATH']}"
    made = Runner(workspace, env)
    try:
        yield made
    finally:
        made.stop()


def run_github_job(runner: Runner, job: dict[str, Any], env: dict[str, str]) -> list[subprocess.CompletedProcess[str]]:
    """Each `run:` step in its own shell, with GITHUB_ENV / GITHUB_PATH carried to the next step."""
    files = runner.workspace.parent / "github"
    files.mkdir(exist_ok=True)
    github_env, github_path = files / "env", files / "path"
    done = []
    for step in job["steps"]:
        if "run" not in step:
            continue  # `uses:` actions (checkout, setup-python, upload-artifact) are the service's part
        github_env.write_text("")
        github_path.write_text("")
        runner.env.update({**env, "GITHUB_ENV": str(github_env), "GITHUB_PATH": str(github_path)})
        result = runner.bash(step["run"])
        done.append(result)
        if result.returncode != 0:
            break
        for line in github_env.read_text().splitlines():
            key, _, value = line.partition("=")
            env[key] = value
        for line in github_path.read_text().splitlines():
            env["PATH"] = f"{line}:{env.get('PATH', runner.env['PATH'])}"
    return done


@pytest.mark.system
def test_ci_templates_run_their_steps_against_a_tracking_server(
    runner: Runner,
    server: str,
    tmp_path: Path,
) -> None:
    experiment = f"ci-{time.time_ns()}"
    # Once per project: a first evaluation tagged as the production baseline (docs/ci.md).
    with_service = [sys.executable, str(ROOT / "experiments/kb_zh/service.py"), "--port", "0"]
    service = subprocess.Popen(with_service, stdout=subprocess.PIPE, text=True)
    try:
        assert service.stdout is not None
        url = service.stdout.readline().split()[-1]
        first = cli(
            "run", "provider=http", f"provider.system.url={url}", f"experiment={experiment}", "--json", uri=server
        )
    finally:
        service.terminate()
        service.wait(timeout=10)
    assert first.returncode == 0, first.stderr
    baseline = json.loads(first.stdout)["run_id"]
    client = MlflowClient(server)
    client.set_tag(baseline, "role", "production")
    experiment_id = client.get_run(baseline).info.experiment_id
    # Live latency on a shared 2-core machine is noise, and the sample service cites below the
    # release gate's absolute floor; the rules against the baseline stay.
    common = {
        "MLFLOW_TRACKING_URI": server,
        "RAGEXP_EXPERIMENT": experiment,
        "RAGEXP_BASELINE": "tag:role=production",
        "RAGEXP_GATE_OVERRIDES": "gates.rules.p95_seconds.max_increase_ratio=1000 gates.rules.citation_precision.min=0",
    }

    # GitHub Actions, a push to main: gate, publish the summary, promote.
    workflow = yaml.safe_load((ROOT / "examples/ci/github-actions.yml").read_text())
    summary = tmp_path / "step_summary.md"
    env = {**common, "GITHUB_REF": "refs/heads/main", "GITHUB_STEP_SUMMARY": str(summary)}
    steps = run_github_job(runner, workflow["jobs"]["rag-gate"], env)
    assert [s.returncode for s in steps] == [0, 0, 0, 0], [s.stdout + s.stderr for s in steps]
    reports = runner.workspace / "reports"
    candidate = json.loads((reports / "run.json").read_text())["run_id"]
    assert summary.read_text(encoding="utf-8").startswith("## ✅ Release gate `release`: PASSED")
    assert f"/#/experiments/{experiment_id}/runs/{candidate}" in summary.read_text(encoding="utf-8")
    xmlschema.XMLSchema(SCHEMAS / "junit-10.xsd").validate(str(reports / "gate.xml"))
    assert f"promoted: tag role=production moved to {candidate} from {baseline}" in steps[-1].stderr
    assert holders(server, experiment_id) == [candidate]

    # GitLab CI, a merge request branch: gated against the run just promoted, nothing promoted.
    shutil.rmtree(reports)
    job = yaml.safe_load((ROOT / "examples/ci/gitlab-ci.yml").read_text())["rag-gate"]
    runner.env.update({**common, "CI_COMMIT_BRANCH": "feature", "CI_DEFAULT_BRANCH": "main"})
    for key, value in job["variables"].items():
        runner.env.setdefault(key, value)
    result = runner.bash("\n".join(job["script"]))
    assert result.returncode == 0, result.stderr
    second = json.loads((reports / "run.json").read_text())["run_id"]
    assert f"baseline: tag:role=production -> run {candidate}" in result.stderr
    xmlschema.XMLSchema(SCHEMAS / "junit-10.xsd").validate(str(reports / "gate.xml"))
    junit = ET.parse(reports / "gate.xml").getroot()
    properties = {p.get("name"): p.get("value") for p in junit.iter("property")}
    assert (properties["baseline.run_id"], properties["candidate.run_id"]) == (candidate, second)
    assert (reports / "gate.md").read_text(encoding="utf-8").startswith("## ✅")
    assert holders(server, experiment_id) == [candidate]
