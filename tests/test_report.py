"""`ragexp report`: contents, languages, artifacts, and the HTML as a browser renders it."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from mlflow.tracking import MlflowClient

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--enable-logging=stderr",
    "--v=0",
]


def two_runs(ragexp: Any) -> tuple[str, str]:
    """Baseline: outputs built from the labels; candidate: the recorded, imperfect system."""
    base = ragexp("run", "dataset=scifacts_zh", "provider=fake", "--json").json()["run_id"]
    cand = ragexp("run", "dataset=scifacts_zh", "provider=replay", "--json").json()["run_id"]
    return base, cand


def test_report_contents_and_artifacts(ragexp: Any, store_uri: str, tmp_path: Path) -> None:
    base, cand = two_runs(ragexp)
    result = ragexp("report", cand, "--baseline", base, "--out", str(tmp_path / "zh"))
    assert result.code == 0, result.stderr
    md = (tmp_path / "zh/report.md").read_text(encoding="utf-8")
    page = (tmp_path / "zh/report.html").read_text(encoding="utf-8")
    # The two columns, kept apart, and the plain statement of what is self-defined.
    assert "第一栏" in md and "第二栏" in md
    assert md.index("第一栏") < md.index("第二栏")
    assert "合格线（门禁阈值）与评估数据集均为本项目自定" in md and "评估数据集共 25 条" in md
    assert "recall_at_k: max_drop=0.0" in md and "本项目定义" in md
    # Distributions, errors, directions, worst cases with question/answer/retrieved ids.
    assert "越低越好" in md and "p95_seconds" in md
    assert md.count("![") >= 5 and "plots/hist_recall_at_k.svg" in md
    assert "没有出错的样本" in md and "最差样本" in md and "sf-10" in md  # the replay's wrong answer
    # Comparison: per-metric table with CI and p-value, scatter, gate verdict and the stage.
    assert "与基线对比" in md and "95% 置信区间" in md and "发布门禁" in md
    # Recall: 5 of 22 answerable cases down, none up (p 0.06): its interval, consistent with that
    # p-value, holds 0, so recall counts as flat; MRR is down for sure (p < 0.001).
    assert "可能出问题的环节" in md and "recall flat but MRR down" in md
    assert "发布门禁" in md and "release: 未通过" in md
    assert page.count("<figure>") >= 7 and "<svg" in page
    assert re.search(r'(src|href)="(https?:)?//', page) is None and "<link" not in page  # self-contained
    logged = {item.path for item in MlflowClient(store_uri).list_artifacts(cand, "report")}
    assert {"report/report.md", "report/report.html", "report/plots"} <= logged

    english = ragexp("report", cand, "--out", str(tmp_path / "en"), "--language", "en")
    assert english.code == 0
    text = (tmp_path / "en/report.md").read_text(encoding="utf-8")
    assert "What this run does not prove" in text and "lower is better" in text and "Comparison" not in text
    bad = ragexp("report", cand, "--language", "fr")
    assert bad.code == 1 and "expected zh or en" in bad.stderr


def test_report_renders_in_headless_chromium(ragexp: Any, tmp_path: Path) -> None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "Debian's chromium package is needed (make test installs it)"
    base, cand = two_runs(ragexp)
    assert ragexp("report", cand, "--baseline", base, "--out", str(tmp_path / "r")).code == 0
    page = tmp_path / "r/report.html"
    done = subprocess.run(
        [chromium, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom", page.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    body = re.search(r"<body([^>]*)>", done.stdout)
    assert body is not None, done.stdout[:500]
    attributes = dict(re.findall(r'data-(\w+)="([^"]*)"', body.group(1)))
    assert attributes["ready"] == "1" and attributes["errors"] == "0"
    assert int(attributes["svgs"]) >= 7 and int(attributes["tables"]) >= 6
    assert "Uncaught" not in done.stderr
    shot = tmp_path / "shot.png"
    subprocess.run(
        [
            chromium,
            *CHROMIUM_FLAGS,
            f"--user-data-dir={tmp_path / 'profile2'}",
            f"--screenshot={shot}",
            "--window-size=1200,1600",
            page.as_uri(),
        ],
        capture_output=True,
        timeout=120,
        check=True,
    )
    assert shot.stat().st_size > 10_000


# --- One table model, one number formatter ----------------------------------------------------------


def test_one_number_formatter() -> None:
    from ragexp.compare.figures import fmt, signed

    figures = {
        0.0: ("0.0000", "+0.0000"),
        1.0: ("1.0000", "+1.0000"),
        0.5: ("0.5000", "+0.5000"),
        3.9e-06: ("3.90e-06", "+3.90e-06"),  # never 0.0000: three significant digits
        -3.9e-06: ("-3.90e-06", "-3.90e-06"),
        1234.5678: ("1,234.6", "+1,234.6"),
        -0.1167: ("-0.1167", "-0.1167"),
        -1234.5678: ("-1,234.6", "-1,234.6"),
        float("inf"): ("inf", "inf"),
        float("-inf"): ("-inf", "-inf"),
    }
    for value, (plain, with_sign) in figures.items():
        assert (fmt(value), signed(value)) == (plain, with_sign), value
    # No figure: a mean over no scored case is NaN, a missing value None.
    assert fmt(float("nan")) == fmt(None) == signed(float("nan")) == signed(None) == "—"
    assert fmt(0.123456, 2) == "0.12" and fmt(0.001, 2) == "1.00e-03" and fmt(0.005, 2) == "0.01"


def test_a_table_is_escaped_for_each_output() -> None:
    from ragexp.tables import Column, Table, to_html, to_markdown, to_terminal

    table = Table(
        [Column("id", kind="code"), Column("why"), Column("value", "right", "figure")],
        [
            ["a`b|c", "[link](http://evil.example/) <b>x</b>", "[+0.0100, -3.90e-06]"],
            ["中文\x1b[2J", "line\nbreak", "<img src=x>"],
        ],
    )
    terminal = to_terminal(table).splitlines()
    assert terminal[0].split() == ["id", "why", "value"] and set(terminal[1]) == {"-", " "}
    assert terminal[2].endswith("[+0.0100, -3.90e-06]") and terminal[3].endswith("<img src=x>")
    # East Asian wide characters take two columns: the second column starts at the same place.
    assert terminal[2].index("[link]") == len("a`b|c") + len("  ") + (len("中文\\x1b[2J") + 2 - len("a`b|c"))
    assert "\x1b" not in "".join(terminal) and "line\\nbreak" in terminal[3]
    markdown = to_markdown(table)
    assert markdown[:2] == ["| id | why | value |", "|---|---|---|"]
    # Data in code spans (| escaped: GitHub splits cells on it), words escaped, figures as written.
    assert markdown[2] == r"| ``a`b\|c`` | \[link\](http\://evil.example/) \<b>x\</b> | [+0.0100, -3.90e-06] |"
    assert markdown[3] == r"| `中文\x1b[2J` | line break | \<img src=x> |"
    page = to_html(table)
    assert "<td><code>a`b|c</code></td>" in page and "&lt;b&gt;x&lt;/b&gt;" in page
    assert "<td>&lt;img src=x&gt;</td>" in page and "<b>" not in page and "\x1b" not in page


def table_rows(lines: list[str], header: str) -> list[list[str]]:
    """The rows of the Markdown table whose header starts with ``header``, as cells."""
    start = next(n for n, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split(" | ")])
    return rows


def test_the_diff_table_says_the_same_in_the_terminal_the_summary_and_the_report(ragexp: Any, tmp_path: Path) -> None:
    from ragexp.compare.figures import fmt, signed

    base, cand = two_runs(ragexp)
    figures = ragexp("diff", base, cand, "--json").json()["metrics"]
    expected = {}
    for m in figures:
        ci = f"[{signed(m['ci_low'])}, {signed(m['ci_high'])}]" if m["ci_low"] is not None else "—"
        expected[m["name"]] = [
            m["direction"],
            fmt(m["baseline"]),
            fmt(m["candidate"]),
            signed(m["delta"]),
            ci,
            fmt(m["p_value"]),
            f"{m['improved']}/{m['regressed']}/{m['unchanged']}",
        ]
    # The fake system answers in microseconds: its P95 keeps its digits (the report printed 0.0000).
    p95 = next(m for m in figures if m["name"] == "p95_seconds")
    assert (
        0 < p95["baseline"] < 5e-05 and expected["p95_seconds"][1] != "0.0000" and "e-0" in expected["p95_seconds"][1]
    )

    summary = tmp_path / "summary.md"
    shown = ragexp("diff", base, cand, "--summary", str(summary), "--language", "en")
    assert shown.code == 0, shown.stderr
    report = ragexp("report", cand, "--baseline", base, "--language", "en", "--out", str(tmp_path / "r"))
    assert report.code == 0, report.stderr

    terminal = {}
    for line in shown.stdout.splitlines():
        cells = re.split(r"\s{2,}", line.strip())
        if cells[0] in expected:
            terminal[cells[0]] = cells
    assert {name: cells[1:8] for name, cells in terminal.items()} == expected

    summary_rows = table_rows(summary.read_text(encoding="utf-8").splitlines(), "| Metric | Better |")
    report_rows = table_rows((tmp_path / "r/report.md").read_text(encoding="utf-8").splitlines(), "| Metric | Better |")
    # The report and the summary render the one table alike; the terminal shows the same cells.
    assert report_rows == summary_rows and len(summary_rows) == len(expected)
    for cells in summary_rows:
        name = cells[0].strip("`")
        assert cells[1:8] == expected[name]
        assert cells[8].split()[-1] == terminal[name][8] and cells[9] == terminal[name][9]

    page = (tmp_path / "r/report.html").read_text(encoding="utf-8")
    for name, cells in expected.items():
        row = re.search(rf"<tr><td><code>{name}</code></td>(.*?)</tr>", page)
        assert row is not None, name
        assert re.findall(r"<td>(.*?)</td>", row.group(1))[:7] == cells
