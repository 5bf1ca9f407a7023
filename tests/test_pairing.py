"""Every comparison of two runs is over one paired population per metric: the cases both runs
scored. Two runs that score different cases (a sequential candidate that stopped early, a metric
of the user's that errors on some cases) are compared by diff, gate (``--json``, JUnit, the
summary), the report and the comparison recorded in MLflow, all with the paired means and delta
and the count of cases paired and left out, checked against a direct computation from the two
runs' ``cases.jsonl``."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from ragexp.compare.figures import fmt, signed
from tests.conftest import write_jsonl
from tests.test_compare import replay_rows

N = 200
FUSSY = "{name: fussy, kind: python, target: 'tests.pipelines.rules:fussy', needs: [answer]}"
GATE = [
    "~gates.rules",
    "+gates.rules={recall_at_k:{max_drop:0.05},fussy:{max_drop:0.9,max_increase_ratio:5},mrr:{min:0.1}}",
    "gates.max_error_rate=null",
]
ARGS = ["dataset.name=crafted", "provider=replay", "k=3", f"metrics.custom=[{FUSSY}]", *GATE]


def rows(*, ranked: Any, answer: Any) -> list[dict[str, Any]]:
    found = replay_rows([{"rank": ranked(i)} for i in range(N)])
    for i, row in enumerate(found):
        row["response"] = answer(i)
    return found


def cases(store_uri: str, run_id: str, tmp_path: Path) -> dict[str, dict[str, Any]]:
    path = MlflowClient(store_uri).download_artifacts(run_id, "cases.jsonl", str(tmp_path / run_id))
    return {row["id"]: row for row in map(json.loads, Path(path).read_text(encoding="utf-8").splitlines())}


def direct(base: dict[str, dict[str, Any]], cand: dict[str, dict[str, Any]], name: str) -> tuple[int, float, float]:
    """(pairs, baseline mean, candidate mean) over the cases both runs scored, from cases.jsonl."""
    pairs = [
        (base[i]["metrics"][name], cand[i]["metrics"][name])
        for i in base
        if i in cand and base[i]["metrics"].get(name) is not None and cand[i]["metrics"].get(name) is not None
    ]
    b, c = np.array(pairs).T
    return len(pairs), float(b.mean()), float(c.mean())


@pytest.mark.system  # whole runs, in-process: `make test`, not the edit loop
def test_diff_gate_report_and_mlflow_carry_the_paired_delta_of_runs_that_scored_different_cases(
    ragexp: Any, store_uri: str, tmp_path: Path
) -> None:
    # The baseline's good answers are the cases the candidate's metric errors on: its own mean
    # (0.2) is not its mean over the pairs (0).
    baseline_rows = rows(ranked=lambda i: 1, answer=lambda i: "good" if i % 5 == 0 else "plain")
    # Every other case loses its relevant chunk (recall 1.0 -> 0.5: the sequential run stops
    # early), every fifth answer makes the metric raise, every third is good.
    candidate_rows = rows(
        ranked=lambda i: None if i % 2 else 1,
        answer=lambda i: "boom" if i % 5 == 0 else "good" if i % 3 == 0 else "plain",
    )
    base_run = ragexp("run", f"dataset.path={write_jsonl(tmp_path / 'b.jsonl', baseline_rows)}", *ARGS, "--json")
    assert base_run.code == 0, base_run.stderr
    baseline = base_run.json()["run_id"]
    cand_path = write_jsonl(tmp_path / "c.jsonl", candidate_rows)
    cand_run = ragexp("run", f"dataset.path={cand_path}", *ARGS, "--baseline", baseline, "--until-decided", "--json")
    assert cand_run.code == 0, cand_run.stderr
    candidate = cand_run.json()["run_id"]
    evaluated = cand_run.json()["sequential"]["evaluated"]
    assert evaluated < N

    b_rows, c_rows = cases(store_uri, baseline, tmp_path), cases(store_uri, candidate, tmp_path)
    errored = sum(1 for row in c_rows.values() if row["metrics"].get("fussy") is None)
    assert 0 < errored < evaluated
    pairs, b_mean, c_mean = direct(b_rows, c_rows, "fussy")
    assert pairs == evaluated - errored
    c_own = float(np.mean([r["metrics"]["fussy"] for r in c_rows.values() if r["metrics"].get("fussy") is not None]))
    b_own = float(np.mean([r["metrics"]["fussy"] for r in b_rows.values()]))
    # The runs' own means differ from the paired ones: an unpaired delta would be another number.
    assert (b_own, b_mean) == (0.2, 0.0)
    left = {"errored_candidate": errored, "not_evaluated_candidate": N - evaluated}
    words = f"{pairs} of {N}; {N - pairs} left out: {errored} errored in the candidate, {N - evaluated} not evaluated"

    diff = ragexp("diff", baseline, candidate, "--json")
    assert diff.code == 0, diff.stderr
    fussy = {m["name"]: m for m in diff.json()["metrics"]}["fussy"]
    assert (fussy["baseline"], fussy["candidate"]) == pytest.approx((b_mean, c_mean))
    assert fussy["delta"] == pytest.approx(c_mean - b_mean)
    assert (fussy["baseline_own"], fussy["candidate_own"]) == pytest.approx((b_own, c_own))
    assert fussy["pairing"] == {"pairs": pairs, "left_out": N - pairs, "left_out_by_reason": left}
    assert fussy["improved"] + fussy["regressed"] + fussy["unchanged"] == pairs
    recall = {m["name"]: m for m in diff.json()["metrics"]}["recall_at_k"]
    r_pairs, r_base, r_cand = direct(b_rows, c_rows, "recall_at_k")
    assert recall["delta"] == pytest.approx(r_cand - r_base) and recall["pairing"]["pairs"] == r_pairs == evaluated
    text = ragexp("diff", baseline, candidate)
    assert text.code == 0, text.stderr
    row = next(line for line in text.stdout.splitlines() if line.startswith("fussy "))
    assert fmt(b_mean) in row and fmt(c_mean) in row and signed(c_mean - b_mean) in row and words in row
    assert f"each run's own value: baseline {fmt(b_own)}, candidate {fmt(c_own)}" in text.stdout

    junit, summary = tmp_path / "gate.xml", tmp_path / "summary.md"
    gate = ragexp(
        "gate", "--baseline", baseline, "--candidate", candidate, *ARGS, "--json", "--junit", str(junit),
        "--summary", str(summary), "--language", "en",
    )  # fmt: skip
    assert gate.code == 2, gate.stderr  # recall's drop
    rules = {(r["metric"], r["rule"]): r for r in gate.json()["rules"]}
    ratio = rules[("fussy", "max_increase_ratio")]
    assert (ratio["baseline"], ratio["candidate"]) == pytest.approx((b_mean, c_mean))
    assert words in ratio["population"] and words in ratio["message"]
    floor = rules[("mrr", "min")]
    # A floor reads the candidate's own mean (here on its anytime-valid interval), never the pairs'.
    assert "the candidate's mean" in floor["message"]
    assert floor["candidate"] == pytest.approx(np.mean([r["metrics"]["mrr"] for r in c_rows.values()]))
    suite = ET.parse(junit).getroot()
    case = next(c for c in suite.iter("testcase") if c.get("classname") == "recall_at_k")
    assert f"{r_pairs} of {N}" in case.find("failure").get("message", "")  # type: ignore[union-attr]
    summary_text = summary.read_text(encoding="utf-8")
    assert words in summary_text and signed(c_mean - b_mean) in summary_text

    report = ragexp("report", candidate, "--baseline", baseline, "--language", "en", "--out", str(tmp_path / "r"))
    assert report.code == 0, report.stderr
    page = (tmp_path / "r/report.md").read_text(encoding="utf-8")
    assert words in page and signed(c_mean - b_mean) in page

    client = MlflowClient(store_uri)
    recorded = Path(client.download_artifacts(candidate, f"comparisons/{baseline}", str(tmp_path / "mlflow")))
    kept = {m["name"]: m for m in json.loads((recorded / "diff.json").read_text())["metrics"]}["fussy"]
    assert kept["delta"] == pytest.approx(c_mean - b_mean) and kept["pairing"]["pairs"] == pairs
    gated = {(r["metric"], r["rule"]): r for r in json.loads((recorded / "gate.json").read_text())["rules"]}
    assert gated[("fussy", "max_increase_ratio")]["candidate"] == pytest.approx(c_mean)


def test_a_floor_reads_the_candidates_own_mean_and_a_drop_the_pairs() -> None:
    from ragexp.compare.diff import MetricDiff
    from ragexp.compare.gate import check_rules
    from ragexp.config.models import GateRule, GatesConfig
    from ragexp.metrics.population import Population

    # Paired: 0.80 -> 0.78 on 24 cases; the candidate's own mean over its 30 scored cases is 0.70.
    compared = MetricDiff(
        "recall_at_k", "higher", 0.80, 0.78, -0.02, None, None, None, 0, 0, 24, 24,
        population=Population(24, 30, 30, "all"), baseline_own=0.81, candidate_own=0.70,
        candidate_population=Population(30, 30, 30, "all"),
    )  # fmt: skip
    gates = GatesConfig(name="t", rules={"recall_at_k": GateRule(max_drop=0.05, min=0.75)})
    failures, checked = check_rules(gates, {"recall_at_k": compared}, errored=0, total=30)
    assert checked == 3  # the two rules and the error rate
    (floor,) = failures
    assert floor.rule == "min" and floor.candidate == 0.70
    assert floor.message == "recall_at_k: the candidate's own mean 0.7000 on 30 of 30 is below the floor 0.75"
    assert floor.population == "30 of 30"  # its own cases, not the 24 pairs
