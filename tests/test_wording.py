"""Rationales read in the reader's language (issue 45 §9, issue 51 "English"): each offline
rationale is kept as a code beside its text; ``report --language en`` and ``diff`` render the code
in their own language, so a run made in Chinese is read in English with the words an English run
would have written, while ``cases.jsonl`` and the trace keep the text in the run's language."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from mlflow.tracking import MlflowClient

from ragexp.datasets.loader import load_dataset
from ragexp.metrics.offline import build_inputs
from ragexp.metrics.reasons import LISTED, fill_rationales
from ragexp.metrics.registry import METRICS
from ragexp.metrics.summary import score_cases
from ragexp.metrics.wording import KEY, render, rendered
from ragexp.phrases import t
from ragexp.records import CaseResult
from tests.conftest import write_jsonl
from tests.test_reasons import OFFLINE, replay_cases
from tests.test_traces import rows_of

CJK = re.compile(r"[\u3000-\u303f\u4e00-\u9fff\uff00-\uffef]")
REFUSALS = ["没有足够证据", "无法回答", "证据不足", "cannot answer"]
QUOTED = re.compile(r'"[^"]*"|「[^」]*」')


def our_words(text: str) -> str:
    """A rationale less what it quotes from the data (expected facts, refusal phrases, spans)."""
    return QUOTED.sub("", text)


def every_branch() -> list[dict[str, Any]]:
    """Recorded outputs that reach every way a rationale is worded: ids found, missed and below K,
    more missed ids than a rationale lists, citations past the ranking, a missing fact, a refusal,
    an unanswerable case that answered, no citation, no expected facts, and evidence spans."""
    many = [f"m{i}" for i in range(LISTED + 3)]
    return [
        *replay_cases(),
        {
            "id": "many",
            "question": "q4",
            "relevant_ids": many,
            "expected_facts": [f"fact {i} " + "long " * 12 for i in range(LISTED + 2)],
            "response": "nothing [4]",
            "retrieved_ids": ["x1", "x2", "x3"],
            "retrieved_contexts": ["c1", "c2", "c3"],
            "citations": [4],
        },
        {
            "id": "answered",
            "question": "q5",
            "unanswerable": True,
            "response": "it is 42 [1]",
            "retrieved_ids": ["x9"],
            "retrieved_contexts": ["c9"],
            "citations": [1],
        },
        {
            "id": "bare",
            "question": "q6",
            "relevant_ids": ["d7"],
            "response": "no idea",
            "retrieved_ids": ["x1", "x2"],
            "retrieved_contexts": ["c1", "c2"],
            "citations": [],
        },
    ]


def spans_case() -> dict[str, Any]:
    return {
        "id": "spans",
        "question": "q",
        "relevant": [
            {"doc": "refund", "span": "退款在七个工作日内到账"},
            {"doc": "refund", "span": "原路退回支付账户"},
            {"doc": "invoice", "span": "电子发票在订单完成后开具"},
        ],
        "expected_facts": ["七个工作日"],
        "response": "退款在七个工作日内到账[1][2][7]",
        "retrieved_ids": ["c9", "c1"],
        "retrieved_contexts": ["无关的内容，说的是会员积分。", "规则：退款在七个工作日内到账，原路退回支付账户。"],
        "retrieved_doc_ids": ["member", "refund"],
        "citations": [1, 2, 7],
    }


def written(path: Path, language: str, k: int) -> list[CaseResult]:
    """What the scoring step writes for these recorded outputs in ``language``."""
    cases = load_dataset(path).cases
    results = [CaseResult(case.id, case.recorded) for case in cases]
    specs = [METRICS[name] for name in OFFLINE]
    inputs = build_inputs(cases, results, k, REFUSALS)
    scores = score_cases(specs, inputs)
    fill_rationales(specs, cases, results, scores, inputs, refusal_phrases=REFUSALS, language=language)
    return results


@pytest.mark.parametrize("rows", [every_branch(), [spans_case()]], ids=["ids", "evidence"])
def test_a_chinese_rationale_renders_as_the_english_run_wrote_it(tmp_path: Path, rows: list[dict[str, Any]]) -> None:
    path = write_jsonl(tmp_path / "cases.jsonl", rows)
    zh, en = written(path, "zh", 3), written(path, "en", 3)
    compared = 0
    for zh_result, en_result in zip(zh, en, strict=True):
        assert zh_result.rationale_codes is not None
        assert set(zh_result.rationale_codes) == set(zh_result.rationale) == set(en_result.rationale)
        for name, code in zh_result.rationale_codes.items():
            # The code is the same whatever the run's language, and JSON as cases.jsonl keeps it.
            code = json.loads(json.dumps(code))
            assert code == json.loads(json.dumps(en_result.rationale_codes[name]))  # type: ignore[index]
            assert render(code, "zh") == zh_result.rationale[name], (zh_result.case_id, name)
            assert render(code, "en") == en_result.rationale[name], (zh_result.case_id, name)
            compared += 1
    assert compared >= len(rows) * 4
    # The branches the dataset is there for were taken.
    said = {result.case_id: result.rationale for result in en}
    if "many" in said:
        assert "and 3 more" in said["many"]["recall_at_k"]
        assert "and 2 more" in said["many"]["answer_accuracy"]
        assert "no retrieved item there" in said["many"]["citation_precision"]
        assert said["answered"]["recall_at_k"].endswith(t("unanswerable_row", "en"))
        assert said["answered"]["answer_accuracy"] == t("reason_refusal_missing", "en")
        assert said["bare"]["citation_precision"] == t("reason_no_citation", "en")
    else:
        assert said["spans"]["recall_at_k"].startswith("2 of 3 evidence spans covered in the top 3")


def test_a_row_without_codes_is_shown_as_recorded() -> None:
    row = {"rationale": {"recall_at_k": "前 5 个结果命中 1 个相关 id 中的 1 个", "mine": "自定"}}
    assert rendered(row, "en") == (row["rationale"], ["recall_at_k", "mine"])
    coded = {**row, KEY: {"recall_at_k": [["reason_recall", 1, 1, 5]]}}
    assert rendered(coded, "en") == ({"recall_at_k": "1 of 1 relevant ids in the top 5", "mine": "自定"}, ["mine"])


@pytest.mark.system  # whole runs: `make test`, not the edit loop
def test_report_in_english_of_chinese_runs_and_diff(ragexp: Any, store_uri: str, tmp_path: Path) -> None:
    base = ragexp("run", "--json")
    cand = ragexp("run", "provider.system.sample.rerank=false", "provider.system.sample.chunking=sentence", "--json")
    assert base.code == 0 and cand.code == 0, base.stderr + cand.stderr
    base_id, cand_id = base.json()["run_id"], cand.json()["run_id"]
    cand_rows = rows_of(store_uri, cand_id, tmp_path / "c")
    # cases.jsonl keeps the run's words (what the trace shows), and the code beside them.
    assert all(CJK.search(text) for row in cand_rows.values() for text in row["rationale"].values())
    assert all(set(row[KEY]) == set(row["rationale"]) for row in cand_rows.values())

    # The English an English run of the same candidate writes, case by case.
    en = ragexp(
        "run",
        "provider.system.sample.rerank=false",
        "provider.system.sample.chunking=sentence",
        "report.language=en",
        "--json",
    )
    assert en.code == 0, en.stderr
    en_rows = rows_of(store_uri, en.json()["run_id"], tmp_path / "e")
    for case, row in cand_rows.items():
        assert rendered(row, "en")[0] == en_rows[case]["rationale"], case
        assert row["metrics"] == en_rows[case]["metrics"], case

    reports = {}
    for language in ("zh", "en"):
        out = tmp_path / f"report-{language}"
        made = ragexp("report", cand_id, "--baseline", base_id, "--out", str(out), "--language", language)
        assert made.code == 0, made.stderr
        reports[language] = (out / "report.md").read_text(encoding="utf-8")
    sections = re.split(r"^## ", reports["en"], flags=re.M)
    (changed,) = [section for section in sections[1:] if section.startswith(t("what_changed", "en"))]
    cells = [
        [cell.strip() for cell in re.split(r"(?<!\\)\|", line)] for line in changed.splitlines() if line[:1] == "|"
    ]
    headers = [row for row in cells if t("why", "en") in row]
    assert headers  # the table of changed cases has a Why column
    column = headers[0].index(t("why", "en"))
    why = [row[column] for row in cells if len(row) == len(headers[0]) and row not in headers and "---" not in row[1]]
    assert any(why)
    for cell in why:
        assert not CJK.search(our_words(cell)), cell
    # The numbers are the same whichever language the report is in.
    numbers = re.compile(r"[-+]?\d+\.\d{4}")
    assert numbers.findall(reports["en"]) == numbers.findall(reports["zh"])
    assert t("reasons_recorded", "en", runs="x")[20:] not in reports["en"]

    # diff is English: its per-case reasons are rendered from the codes, none in Chinese.
    diff = ragexp("diff", base_id, cand_id, "--json")
    assert diff.code == 0, diff.stderr
    cases = diff.json()["cases"]
    assert cases
    for entry in cases:
        side = entry["candidate"]
        assert side["rationale"] == en_rows[entry["id"]]["rationale"], entry["id"]
        assert side["rationale_recorded"] == []
    shown = ragexp("diff", base_id, cand_id)
    lines = shown.stdout.split("most regressed cases", 1)[1].splitlines()
    reasons = [line for line in lines if line.startswith("      ")]
    assert reasons  # rows of reasons are printed
    assert not any(CJK.search(our_words(line)) for line in reasons), reasons


@pytest.mark.system  # whole runs: `make test`, not the edit loop
def test_runs_without_codes_are_reported_as_recorded_once(ragexp: Any, store_uri: str, tmp_path: Path) -> None:
    """A run made before rationales kept their codes: its rationales are shown as recorded, and
    the report says so once; diff does not mix its Chinese reasons into its English output."""
    base = ragexp("run", "--json")
    cand = ragexp("run", "provider.system.sample.rerank=false", "provider.system.sample.chunking=sentence", "--json")
    assert base.code == 0 and cand.code == 0, base.stderr + cand.stderr
    base_id, cand_id = base.json()["run_id"], cand.json()["run_id"]
    strip_codes(store_uri, cand_id, tmp_path)

    out = tmp_path / "report"
    made = ragexp("report", cand_id, "--baseline", base_id, "--out", str(out), "--language", "en")
    assert made.code == 0, made.stderr
    md = (out / "report.md").read_text(encoding="utf-8")
    note = t("reasons_recorded", "en", runs=f"{cand_id} (zh)")
    assert md.count(note) == 1
    assert base_id not in note

    shown = ragexp("diff", base_id, cand_id)
    assert "reasons recorded in zh by runs made before reasons kept their codes are not shown" in shown.stdout
    lines = shown.stdout.split("most regressed cases", 1)[1].splitlines()
    assert not any(CJK.search(our_words(line)) for line in lines if line.startswith("      ")), lines


def strip_codes(store_uri: str, run_id: str, tmp_path: Path) -> None:
    """Rewrite a run's cases.jsonl as a run of an earlier version wrote it: text, no codes."""
    rows = rows_of(store_uri, run_id, tmp_path / "read")
    assert all(KEY in row for row in rows.values())
    path = tmp_path / "old" / "cases.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "".join(
            json.dumps({k: v for k, v in row.items() if k != KEY}, ensure_ascii=False) + "\n" for row in rows.values()
        ),
        encoding="utf-8",
    )
    MlflowClient(store_uri).log_artifact(run_id, str(path))
