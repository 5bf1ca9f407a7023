"""Words that match the numbers: the verdict a metric gets, figures at a precision people read,
one likely-stage text in `diff`, its summary, the report and the demo, and a demo that narrates
what its own steps printed; run names the MLflow UI tells apart."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from ragexp.compare.diff import MetricDiff
from ragexp.compare.figures import fmt, signed
from ragexp.metrics.registry import METRICS
from ragexp.phrases import t
from ragexp.stats.paired import paired_differences
from ragexp.workflows import demo
from ragexp.workflows.diff import compare_runs
from ragexp.workflows.gate import run_gate
from tests.conftest import write_jsonl
from tests.test_compare import replay_rows, run_replay

VERDICT = {
    "better": "better",
    "worse": "worse",
    "better_ns": "better, not significant",
    "worse_ns": "worse, not significant",
    "flat": "flat",
    "mixed": "flat on average",
    "none": "—",
}


def metric(data: dict[str, Any], name: str) -> dict[str, Any]:
    return next(m for m in data["metrics"] if m["name"] == name)


def diff_rows(stdout: str) -> dict[str, list[str]]:
    """The metric table of `ragexp diff`, as cells by metric name (its first lines so named)."""
    rows: dict[str, list[str]] = {}
    for line in stdout.splitlines():
        cells = re.split(r"\s{2,}", line.strip())
        if cells and cells[0] in METRICS and len(cells) >= 10:
            rows.setdefault(cells[0], cells)
    return rows


def dropped_pair(ragexp: Any, tmp_path: Path, lost: int = 3) -> tuple[str, str]:
    """30 answerable cases; the candidate loses the relevant id of ``lost`` cases and pushes one
    more to rank 2: every retrieval metric drops, no case goes up, nothing is significant."""
    base = run_replay(ragexp, write_jsonl(tmp_path / "a.jsonl", replay_rows([{"rank": 1}] * 30)))
    specs = [{"rank": None}] * lost + [{"rank": 2}] + [{"rank": 1}] * (29 - lost)
    cand = run_replay(ragexp, write_jsonl(tmp_path / "b.jsonl", replay_rows(specs)))
    return base["run_id"], cand["run_id"]


@pytest.mark.system  # a whole run: `make test`, not the edit loop
def test_a_drop_that_is_not_significant_reads_as_a_drop_with_its_p_value(ragexp: Any, tmp_path: Path) -> None:
    base, cand = dropped_pair(ragexp, tmp_path)
    data = ragexp("diff", base, cand, "--json").json()
    recall, mrr = metric(data, "recall_at_k"), metric(data, "mrr")
    assert recall["delta"] == pytest.approx(-0.1) and (recall["improved"], recall["regressed"]) == (0, 3)
    assert recall["p_value"] > 0.05 and recall["ci_low"] < 0
    # The interval's end is 0 (its tie slack used to print as +1.00e-09), and it still holds 0.
    assert recall["ci_high"] == 0.0

    shown = ragexp("diff", base, cand)
    assert shown.code == 0, shown.stderr
    rows = diff_rows(shown.stdout)
    assert rows["recall_at_k"][8] == "worse, not significant"
    assert rows["recall_at_k"][5] == f"[{signed(recall['ci_low'])}, +0.0000]"
    assert "e-09" not in shown.stdout and "e-10" not in shown.stdout
    # The decision table applies to the drops, significant or not, and says how sure each is.
    line = (
        "recall and MRR down: look at parsing, chunking and recall first "
        f"(recall_at_k -0.1000, p {fmt(recall['p_value'])}, not significant; "
        f"mrr {signed(mrr['delta'])}, p {fmt(mrr['p_value'])}" + ("" if mrr["p_value"] < 0.05 else ", not significant")
    )
    said, citation = data["diagnosis"]
    assert said.startswith(line)
    assert citation.startswith("citation precision down: the citation protocol or its validation (citation_precision")
    assert f"  - {said}" in shown.stdout.splitlines() and f"  - {citation}" in shown.stdout.splitlines()


@pytest.mark.system  # a whole run: `make test`, not the edit loop
def test_a_verdict_never_contradicts_the_delta_or_the_case_counts(ragexp: Any, tmp_path: Path) -> None:
    base, cand = dropped_pair(ragexp, tmp_path, lost=1)
    shown = ragexp("diff", base, cand)
    data = ragexp("diff", base, cand, "--json").json()
    for m in data["metrics"]:
        verdict = diff_rows(shown.stdout)[m["name"]][8]
        delta, spec = m["delta"], METRICS[m["name"]]
        went_up = delta is not None and delta > 1e-9
        went_down = delta is not None and delta < -1e-9
        good = went_up if spec.direction == "higher" else went_down
        bad = went_down if spec.direction == "higher" else went_up
        if good:
            assert verdict.startswith("better"), m
        elif bad:
            assert verdict.startswith("worse"), m
        else:
            assert verdict in ("flat", "flat on average"), m
        if verdict == "flat":
            assert m["improved"] == m["regressed"] == 0, m  # nothing moved
        if m["regressed"] and not m["improved"] and m["name"] != "p95_seconds":
            assert verdict.startswith("worse"), m
        significant = m["ci_low"] is not None and (m["ci_low"] > 0 or m["ci_high"] < 0)
        assert ("not significant" in verdict) == (m["ci_low"] is not None and (good or bad) and not significant)


def test_verdicts_by_delta_interval_and_moves() -> None:
    def made(delta: float | None, ci: tuple[float, float] | None, up: int = 0, down: int = 0) -> str:
        low, high = ci if ci is not None else (None, None)
        m = MetricDiff(
            "mrr", "higher", 0.5, None if delta is None else 0.5 + delta, delta, low, high, 0.3, up, down, 0, 30
        )
        return m.verdict()

    assert made(-0.1, (-0.2, 0.0), down=3) == "worse_ns"
    assert made(-0.1, (-0.2, -0.01), down=3) == "worse"
    assert made(0.1, (-0.01, 0.2), up=3) == "better_ns"
    assert made(0.1, (0.01, 0.2), up=3) == "better"
    assert made(0.0, (0.0, 0.0)) == "flat"
    assert made(0.0, (-0.1, 0.1), up=2, down=2) == "mixed"
    assert made(None, None) == "none"
    assert made(-0.1, None, down=1) == "worse"  # a run-level figure: no test, the delta's sign
    # A lower-is-better metric that rose got worse.
    p95 = MetricDiff("p95_seconds", "lower", 1.0, 1.5, 0.5, None, None, None, 0, 0, 0, 30)
    assert p95.verdict() == "worse" and p95.evidence() == "p95_seconds 1.0000 -> 1.5000 (+0.5000)"
    for key, word in VERDICT.items():
        assert t(f"moved_{key}", "en") == word


def test_interval_ends_are_zero_not_the_tie_slack() -> None:
    rng = np.random.default_rng(7)
    for i in range(200):
        n = int(rng.integers(5, 60))
        diffs = rng.choice([-1.0, -0.5, 0.0, 0.0, 0.0, 0.5, 1.0], size=n, p=[0.2, 0.1, 0.2, 0.2, 0.2, 0.05, 0.05])
        found = paired_differences(diffs, resamples=2000, confidence=0.95, seed=i)
        assert found is not None
        p_value, low, high = found
        for end in (low, high):
            assert end == 0.0 or abs(end) > 1e-6, (diffs.tolist(), end)
        assert (low > 0 or high < 0) == (p_value < 0.05)
    assert paired_differences(np.array([-1.0] * 3 + [0.0] * 27), resamples=10_000, confidence=0.95, seed=0) == (
        pytest.approx(0.2503, abs=0.02),
        pytest.approx(-0.2143, abs=0.05),
        0.0,
    )


@pytest.mark.system  # a whole run: `make test`, not the edit loop
def test_one_likely_stage_text_in_diff_its_summary_and_the_report(ragexp: Any, tmp_path: Path) -> None:
    base, cand = dropped_pair(ragexp, tmp_path)
    said = ragexp("diff", base, cand, "--json").json()["diagnosis"][0]
    summary = tmp_path / "summary.md"
    assert ragexp("diff", base, cand, "--summary", str(summary), "--language", "en").code == 0
    assert ragexp("report", cand, "--baseline", base, "--language", "en", "--out", str(tmp_path / "r")).code == 0
    from ragexp.escape import markdown

    assert f"- {markdown(said)}" in summary.read_text(encoding="utf-8").splitlines()
    report = (tmp_path / "r/report.md").read_text(encoding="utf-8")
    stage = report[report.index("### Likely stage") :]
    assert markdown(said) in stage.splitlines()
    # The Chinese report words the same row and the same figures.
    assert ragexp("report", cand, "--baseline", base, "--out", str(tmp_path / "zh")).code == 0
    chinese = (tmp_path / "zh/report.md").read_text(encoding="utf-8")
    assert (
        markdown(said.replace(t("stage_retrieval", "en"), t("stage_retrieval", "zh"))).replace(
            "not significant", t("not_significant", "zh")
        )
        in chinese.splitlines()
    )


@pytest.mark.system  # a whole run: `make test`, not the edit loop
def test_no_stage_line_without_a_move(ragexp: Any, tmp_path: Path) -> None:
    rows = write_jsonl(tmp_path / "a.jsonl", replay_rows([{"rank": 1}] * 20))
    base, cand = run_replay(ragexp, rows)["run_id"], run_replay(ragexp, rows, "k=3")["run_id"]
    data = ragexp("diff", base, cand, "--json").json()
    assert data["diagnosis"] == []
    assert all(diff_rows(ragexp("diff", base, cand).stdout)[m["name"]][8] != "worse" for m in data["metrics"])


@pytest.mark.system  # a whole run: `make test`, not the edit loop
def test_the_demo_narrates_what_its_steps_found(ragexp: Any, store_uri: str, tmp_path: Path) -> None:
    """The narration is made from the results it is given: another pair, other words."""
    base, cand = dropped_pair(ragexp, tmp_path)
    compared = compare_runs(base, cand, tracking_uri=store_uri)
    gated = run_gate(base, candidate=cand, tracking_uri=store_uri)
    lines = demo.narrate(compared, gated, 2)
    failed = ", ".join(f"{r.metric} {r.rule}" for r in gated.result.failures)
    assert all(f"{r.metric} {r.rule}" in lines[0] for r in gated.result.failures), (failed, lines[0])
    assert f"{len(gated.result.failures)} of {gated.result.checked} rules did not pass" in lines[0]
    lost = ["case-0000", "case-0001", "case-0002", "case-0003"]
    assert lines[1] == f"What changed: 4 cases got worse ({', '.join(lost)}) and 0 got better (none)."
    # These candidates still retrieve five ids (noise): no line says they retrieve nothing.
    assert not any("retrieve nothing" in line for line in lines)
    assert lines[2].startswith("diff: 4 metrics got worse, 4 of them not significantly with 30 cases (recall_at_k")
    assert compared.result.diagnosis
    for hint in compared.result.diagnosis:
        assert f"likely stage: {hint.text()}." in lines
    assert not any("rerank" in line for line in lines)
    passed = demo.narrate(compared, gated, 0)
    assert passed[0] == "exit 0: the demo expected the gate to fail (exit 2); the sample system has changed."


@pytest.mark.system  # a whole run: `make test`, not the edit loop
def test_default_run_names_differ_in_their_first_characters(ragexp: Any, store_uri: str) -> None:
    first = ragexp("run", "provider=fake", "k=3", "--json").json()
    second = ragexp("run", "provider=fake", "k=5", "--json").json()
    client = MlflowClient(store_uri)
    names = [client.get_run(r["run_id"]).info.run_name for r in (first, second)]
    assert names == [
        f"{first['config_hash'][:12]}-fake-kb_zh-k3",
        f"{second['config_hash'][:12]}-fake-kb_zh-k5",
    ]
    # The UI's run lists show about seven characters of a name.
    assert names[0][:6] != names[1][:6]
    assert demo.BASELINE_NAME[:6] != demo.CANDIDATE_NAME[:6]


@pytest.mark.system
def test_demo_pair_diff_words_what_changed_and_the_gate_that_ran(ragexp: Any, tmp_path: Path) -> None:
    """The demo's pair end to end: the words of diff, the report's "what changed" (every case
    that moved, with both runs' outputs), and a gate section equal to the gate that ran."""
    folder = tmp_path / "demo"
    result = ragexp("demo", "--store", str(folder))
    assert result.code == 0, result.stderr
    out = result.stdout
    uri = f"sqlite:///{folder.resolve()}/mlflow.db"
    ids = dict(
        line.split(" run: ") for line in out.splitlines() if line.startswith(("baseline run:", "candidate run:"))
    )
    base, cand = ids["baseline"], ids["candidate"]

    # diff's words: every quality metric went down, none significantly, and says so.
    data = ragexp("diff", base, cand, "--tracking-uri", uri, "--json").json()
    rows = diff_rows(out[out.index("── 3/") : out.index("── 4/")])
    for m in data["metrics"]:
        if m["p_value"] is not None and m["delta"] and m["delta"] < 0 and METRICS[m["name"]].direction == "higher":
            assert rows[m["name"]][8] == "worse, not significant", m
    assert "flat" not in rows["recall_at_k"][8] and "e-09" not in out
    (said,) = data["diagnosis"]
    assert said.startswith("recall and MRR down: look at parsing, chunking and recall first (")
    assert f"  - {said}" in out.splitlines() and f"likely stage: {said}." in out.splitlines()

    # The report leads with the gate's verdict, then what changed, case by case, as diff counts it.
    assert (
        ragexp(
            "report", cand, "--baseline", base, "--tracking-uri", uri, "--language", "en", "--out", str(tmp_path / "r")
        ).code
        == 0
    )
    report = (tmp_path / "r/report.md").read_text(encoding="utf-8")
    sections = re.findall(r"^## (.+)$", report, flags=re.M)
    assert sections[:2] == ["Verdict", "What changed"]
    changed = report[report.index("## What changed") : report.index("## Identity")]
    counts = {
        cells[0]: (int(cells[1]), int(cells[2]))
        for cells in (line.strip("|").split(" | ") for line in changed.splitlines() if line.startswith("| "))
        if cells[0].strip() in METRICS
    }
    for m in data["metrics"]:
        if m["name"] in counts:
            assert counts[m["name"]] == (m["regressed"], m["improved"]), m["name"]
    worse = changed[changed.index("### Cases that got worse") : changed.index("### Cases that got better")]
    better = changed[changed.index("### Cases that got better") :]
    cases = {row["id"]: row for row in _rows(uri, cand)}
    before = {row["id"]: row for row in _rows(uri, base)}
    listed_worse = [
        line.split(" | ")[0].strip("| ") for line in worse.splitlines() if line.startswith("| ") and "---" not in line
    ][1:]
    listed_better = [
        line.split(" | ")[0].strip("| ") for line in better.splitlines() if line.startswith("| ") and "---" not in line
    ][1:]
    assert sorted(listed_worse) == sorted(["refund-fresh", "ship-track", "service-hours", "ship-address"])
    assert listed_better == ["ship-xinjiang"]
    from ragexp.escape import markdown

    for case in listed_worse + listed_better:
        line = next(line for line in changed.splitlines() if line.startswith(f"| {case} |"))
        for row in (cases[case], before[case]):
            assert markdown(row["output"]["answer"][:200]) in line
            assert markdown(", ".join(row["output"]["ranked_ids"][:5]) or "—") in line

    # The gate section is the gate that ran: its rules, outcomes and rule set, nothing more.
    recorded = json.loads(
        Path(MlflowClient(uri).download_artifacts(cand, f"comparisons/{base}/gate.json", str(tmp_path))).read_text()
    )
    gate = report[report.index("### Release gate") : report.index("### Likely stage")]
    assert "The gate that ran on this pair" in gate
    rule_rows = [line for line in gate.splitlines() if line.startswith("| `")]
    assert [(r.split(" | ")[0].strip("| `"), r.split(" | ")[1].strip("`"), r.split(" | ")[2]) for r in rule_rows] == [
        (rule["metric"], rule["rule"], rule["outcome"]) for rule in recorded["rules"]
    ]
    assert len(rule_rows) == recorded["checked"] == 5 and "p95_seconds" not in gate
    assert f"release: FAILED ({len(recorded['failures'])} of 5 rules did not pass)" in gate
    assert markdown(said) in report[report.index("### Likely stage") :].splitlines()


def _rows(uri: str, run_id: str) -> list[dict[str, Any]]:
    from ragexp.compare.data import load_run
    from ragexp.tracking.store import Store

    run = load_run(Store(uri, must_exist=True), run_id)
    return [run.row(i) for i in range(len(run.case_ids))]
