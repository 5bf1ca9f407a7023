"""Dataset versions: the per-case content hash in cases.jsonl, `ragexp datasets diff` and
`--common-cases` on diff, gate and report, on an edited copy of kb_zh (two cases added, one
removed, one gold changed), in a real SQLite store with the sample system."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from mlflow.tracking import MlflowClient

from ragexp.paths import package_data
from tests.conftest import write_jsonl

REMOVED = "refund-deadline"
CHANGED = "refund-bankcard"
ADDED = ["refund-bankcard-again", "refund-arrival-again"]


@pytest.fixture
def versions(tmp_path: Path) -> tuple[Path, Path]:
    rows = [
        json.loads(line) for line in (package_data() / "kb_zh/cases.jsonl").read_text(encoding="utf-8").splitlines()
    ]
    old = write_jsonl(tmp_path / "old.jsonl", rows)
    new_rows = []
    for row in rows:
        if row["id"] == REMOVED:
            continue
        if row["id"] == CHANGED:
            row = {**row, "expected_facts": ["五个工作日"]}  # the gold moved: the answer no longer holds it
        new_rows.append(row)
    by_id = {row["id"]: row for row in rows}
    new_rows.append({**by_id["refund-bankcard"], "id": ADDED[0], "question": "银行卡退款几天能到？"})
    new_rows.append({**by_id["refund-arrival-time"], "id": ADDED[1], "question": "微信退款多久到账？"})
    return old, write_jsonl(tmp_path / "new.jsonl", new_rows)


def _run(ragexp: Any, dataset: Path, *extra: str) -> str:
    done = ragexp("run", f"dataset.path={dataset}", *extra, "--json")
    assert done.code == 0, done.stderr
    return str(done.json()["run_id"])


def _rows(store_uri: str, run_id: str, tmp_path: Path) -> dict[str, dict[str, Any]]:
    path = MlflowClient(store_uri).download_artifacts(run_id, "cases.jsonl", str(tmp_path / run_id))
    return {row["id"]: row for row in map(json.loads, Path(path).read_text(encoding="utf-8").splitlines())}


EXPECTED = {
    "added": 2,
    "removed": 1,
    "changed": 1,
    "unchanged": 33,
    "added_ids": ADDED,
    "removed_ids": [REMOVED],
    "changed_ids": {CHANGED: ["gold"]},
}


def test_datasets_diff_of_two_files_is_the_exact_ledger(ragexp: Any, versions: tuple[Path, Path]) -> None:
    old, new = versions
    found = ragexp("datasets", "diff", str(old), str(new), "--json")
    assert found.code == 0, found.stderr
    assert found.json() == {"old": f"file {old}", "new": f"file {new}", **EXPECTED}
    shown = ragexp("datasets", "diff", str(old), str(new))
    assert "2 added, 1 removed, 1 changed (gold 1), 33 unchanged" in shown.stdout.splitlines()
    assert f"  changed   {CHANGED}: gold" in shown.stdout.splitlines()
    # A question and a conversation's history are told apart from the gold.
    reworded = write_jsonl(
        old.parent / "reworded.jsonl",
        [
            {**row, "question": row["question"] + "？"} if row["id"] == CHANGED else row
            for row in map(json.loads, old.read_text(encoding="utf-8").splitlines())
        ],
    )
    assert ragexp("datasets", "diff", str(old), str(reworded), "--json").json()["changed_ids"] == {
        CHANGED: ["question"]
    }
    missing = ragexp("datasets", "diff", str(old), str(old.parent / "nope.jsonl"))
    assert missing.code == 1 and missing.stderr.strip().splitlines() == [
        f"ragexp: error: NEW {old.parent / 'nope.jsonl'}: no such file"
    ]


def test_common_cases_compare_exactly_the_unchanged_cases_in_every_output(
    ragexp: Any, store_uri: str, versions: tuple[Path, Path], tmp_path: Path
) -> None:
    old, new = versions
    base = _run(ragexp, old)
    cand = _run(ragexp, new, "provider.system.sample.citations=none")
    b_rows, c_rows = _rows(store_uri, base, tmp_path), _rows(store_uri, cand, tmp_path)
    assert set(b_rows[CHANGED]["content_hash"]) == {"case", "question", "history", "gold"}
    assert b_rows[CHANGED]["content_hash"]["gold"] != c_rows[CHANGED]["content_hash"]["gold"]
    assert b_rows[CHANGED]["content_hash"]["question"] == c_rows[CHANGED]["content_hash"]["question"]
    # The same ledger from the two runs as from the two files.
    by_runs = ragexp("datasets", "diff", base, cand, "--json")
    assert by_runs.code == 0, by_runs.stderr
    assert by_runs.json() == {"old": f"run {base}", "new": f"run {cand}", **EXPECTED}

    refused = ragexp("diff", base, cand)
    assert refused.code == 3
    [line] = refused.stderr.strip().splitlines()
    assert "dataset content hash differs" in line
    assert "the dataset changed: 2 added, 1 removed, 1 changed (gold 1), 33 unchanged" in line
    assert "--common-cases compares the 33 unchanged cases" in line
    assert ragexp("gate", "--baseline", base, "--candidate", cand).code == 3
    assert ragexp("report", cand, "--baseline", base, "--out", str(tmp_path / "r0")).code == 3

    unchanged = [case_id for case_id in b_rows if case_id in c_rows and case_id != CHANGED]
    assert len(unchanged) == 33
    diff = ragexp("diff", base, cand, "--common-cases", "--json")
    assert diff.code == 0, diff.stderr
    found = diff.json()
    assert found["comparable"] is True and found["differences"] == []
    ledger = {"added": 2, "removed": 1, "changed": 1, "unchanged": 33, "changed_by_part": {"gold": 1}}
    assert found["ledger"] == ledger
    for name in ("recall_at_k", "answer_accuracy", "citation_precision"):
        metric = next(m for m in found["metrics"] if m["name"] == name)
        pairs = [
            (b_rows[i]["metrics"][name], c_rows[i]["metrics"][name])
            for i in unchanged
            if not (name == "recall_at_k" and b_rows[i]["unanswerable"])
        ]
        assert metric["improved"] + metric["regressed"] + metric["unchanged"] == len(pairs)
        assert metric["baseline"] == pytest.approx(math.fsum(b for b, _ in pairs) / len(pairs), abs=1e-12)
        assert metric["candidate"] == pytest.approx(math.fsum(c for _, c in pairs) / len(pairs), abs=1e-12)
    # A run-level percentile too is taken over the unchanged cases (nearest rank of the answered ones).
    p95 = next(m for m in found["metrics"] if m["name"] == "p95_seconds")
    for side, rows in (("baseline", b_rows), ("candidate", c_rows)):
        latencies = sorted(rows[i]["latency_seconds"] for i in unchanged if rows[i]["latency_seconds"] is not None)
        assert p95[side] == latencies[math.ceil(len(latencies) * 0.95) - 1]
    assert {case["id"] for case in found["cases"]} <= set(unchanged)
    shown = ragexp("diff", base, cand, "--common-cases")
    assert (
        "Dataset versions differ (--common-cases): 2 added, 1 removed, 1 changed, 33 unchanged; compared on "
        "the 33 cases both versions hold unchanged"
    ) in shown.stdout.splitlines()

    junit, summary = tmp_path / "gate.xml", tmp_path / "summary.md"
    gate = ragexp(
        "gate",
        "--baseline",
        base,
        "--candidate",
        cand,
        "--common-cases",
        "--json",
        "--junit",
        str(junit),
        "--summary",
        str(summary),
        "--language",
        "en",
    )
    assert gate.code in (0, 2), gate.stderr
    assert gate.json()["ledger"] == ledger
    assert 'name="dataset.ledger" value="Dataset versions differ (--common-cases): 2 added' in junit.read_text()
    assert "2 added, 1 removed, 1 changed, 33 unchanged" in summary.read_text(encoding="utf-8")
    recorded = MlflowClient(store_uri).download_artifacts(cand, f"comparisons/{base}/gate.json", str(tmp_path))
    assert json.loads(Path(recorded).read_text(encoding="utf-8"))["ledger"] == ledger

    out = tmp_path / "report"
    report = ragexp("report", cand, "--baseline", base, "--common-cases", "--out", str(out), "--language", "en")
    assert report.code == 0, report.stderr
    assert "compared on the 33 cases both versions hold unchanged" in (out / "report.md").read_text(encoding="utf-8")


def test_the_dataset_input_names_the_version_each_run_used(
    ragexp: Any, store_uri: str, versions: tuple[Path, Path]
) -> None:
    old, new = versions
    client = MlflowClient(store_uri)
    for dataset in (old, new):
        run = client.get_run(_run(ragexp, dataset))
        [logged] = run.inputs.dataset_inputs
        assert logged.dataset.digest == run.data.tags["ragexp.dataset_hash"][:12]
        assert json.loads(logged.dataset.profile)["dataset_hash"] == run.data.tags["ragexp.dataset_hash"]
    digests = {run.inputs.dataset_inputs[0].dataset.digest for run in client.search_runs([run.info.experiment_id])}
    assert len(digests) == 2  # two versions, told apart in the UI's Datasets column


def test_a_run_without_case_hashes_uses_its_dataset_file_or_says_why_not(
    ragexp: Any, store_uri: str, versions: tuple[Path, Path], tmp_path: Path
) -> None:
    old, new = versions
    base = _run(ragexp, old)
    cand = _run(ragexp, new)
    # As a run of an older ragexp wrote it: no content_hash in its cases.jsonl.
    artifact_dir = Path(MlflowClient(store_uri).get_run(base).info.artifact_uri.removeprefix("file://"))
    cases = artifact_dir / "cases.jsonl"
    rows = [json.loads(line) for line in cases.read_text(encoding="utf-8").splitlines()]
    cases.write_text(
        "".join(json.dumps({k: v for k, v in row.items() if k != "content_hash"}) + "\n" for row in rows),
        encoding="utf-8",
    )
    # Its dataset file is still the version it ran on: the hashes are recomputed from it.
    again = ragexp("diff", base, cand, "--common-cases", "--json")
    assert again.code == 0, again.stderr
    assert again.json()["ledger"]["unchanged"] == 33
    # Once that file changed, the run has no ledger: refused in one line saying why.
    old.write_text(new.read_text(encoding="utf-8"), encoding="utf-8")
    refused = ragexp("diff", base, cand, "--common-cases")
    assert refused.code == 3
    assert refused.stderr.strip().splitlines() == [
        f"ragexp: error: run {base} was made before ragexp recorded each case's content hash in cases.jsonl, "
        f"and its dataset file {old} has changed since: it has no case ledger (run it again to compare it on "
        "common cases)"
    ]


def test_an_earlier_turn_that_changed_changes_the_history_of_the_turns_after_it(ragexp: Any, tmp_path: Path) -> None:
    rows = [json.loads(line) for line in (package_data() / "kb_zh/chat.jsonl").read_text(encoding="utf-8").splitlines()]
    old = write_jsonl(tmp_path / "old.jsonl", rows)
    first = rows[0]
    edited = {
        **first,
        "turns": [{**first["turns"][0], "question": "七天无理由退货需要什么条件？"}, *first["turns"][1:]],
    }
    new = write_jsonl(tmp_path / "new.jsonl", [edited, *rows[1:]])
    found = ragexp("datasets", "diff", str(old), str(new), "--json")
    assert found.code == 0, found.stderr
    turns = len(first["turns"])
    assert found.json()["changed_ids"] == {
        f"{first['id']}#1": ["question"],
        **{f"{first['id']}#{n}": ["history"] for n in range(2, turns + 1)},
    }
    assert found.json()["added"] == found.json()["removed"] == 0


def test_bundled_datasets_are_named_by_their_option(ragexp: Any) -> None:
    # kb_zh_spans holds kb_zh's cases with the answerable ones' gold anchored to spans instead of ids.
    found = ragexp("datasets", "diff", "kb_zh", "kb_zh_spans", "--json")
    assert found.code == 0, found.stderr
    ledger = found.json()
    assert ledger["old"].startswith("dataset=kb_zh (") and ledger["new"].startswith("dataset=kb_zh_spans (")
    assert (ledger["added"], ledger["removed"], ledger["changed"], ledger["unchanged"]) == (0, 0, 30, 5)
    assert set(map(tuple, ledger["changed_ids"].values())) == {("gold",)}
