"""`ragexp report`: contents, languages, artifacts, and the HTML as a browser renders it."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from mlflow.tracking import MlflowClient

pytestmark = pytest.mark.system  # end-to-end: left out by `make test-fast`

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
    # The two columns, kept apart by the registry's flag: every metric of this offline run is the
    # project's own, so there is no official column; and the plain statement of what is self-defined.
    assert "官方定义" not in md and "本项目自定：" in md and "本项目定义的指标" in md
    assert "合格线（门禁阈值）与评估数据集均为本项目自定" in md and "评估数据集共 25 条" in md
    assert "recall_at_k: max_drop=0.0" in md and "由本项目定义" in md
    # Distributions, errors, directions, worst cases with question/answer/retrieved ids.
    assert "越低越好" in md and "p95_seconds" in md
    assert md.count("![") >= 5 and "plots/hist_recall_at_k.svg" in md
    # No case errored: no section lists none (the results table's errored column says 0).
    assert "出错样本清单" not in md and "最差样本" in md and "sf-10" in md  # the replay's wrong answer
    # Comparison: per-metric table with CI and p-value, scatter, gate verdict and the stage.
    assert "与基线对比" in md and "95% 置信区间" in md and "发布门禁" in md
    # Recall: 5 of 22 answerable cases down, none up (p 0.06): a drop, not a significant one; MRR
    # is down for sure (p < 0.001): the decision table's first row, with each move's p-value.
    assert (
        "可能出问题的环节" in md
        and "召回与 MRR 同时下降：先查解析、分块与召回 (recall_at_k -0.1818, p 0.0606, 不显著;" in md
    )
    assert "发布门禁" in md and "release：未通过" in md and "这组运行没有执行过门禁" in md
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
    # The report and the summary render the one table alike (the summary, for GitHub, puts an
    # emoji before a verdict; the report, whose fonts have none, does not); the terminal shows the
    # same cells.
    assert len(summary_rows) == len(expected)
    for report_cells, cells in zip(report_rows, summary_rows, strict=True):
        name = cells[0].strip("`")
        assert cells[1:8] == expected[name]
        assert report_cells[:8] == cells[:8] and report_cells[9] == cells[9]
        assert report_cells[8] == terminal[name][8] and cells[8].endswith(terminal[name][8])
        assert cells[9] == terminal[name][9]

    page = (tmp_path / "r/report.html").read_text(encoding="utf-8")
    page = page[page.index(">Comparison with the baseline<") :]  # the verdict's failing rules come first
    for name, cells in expected.items():
        row = re.search(rf"<tr><td><code>{name}</code></td>(.*?)</tr>", page)
        assert row is not None, name
        assert re.findall(r"<td>(.*?)</td>", row.group(1))[:7] == cells


# --- What the report says: what changed, the gate that ran, the columns, glyphs, sections -------------------


def _section(md: str, heading: str, level: int = 2) -> str:
    """The text under ``heading`` up to the next heading of the same or a higher level."""
    start = md.index(f"\n{'#' * level} {heading}")
    following = re.search(rf"\n#{{1,{level}}} ", md[start + 1 :])
    return md[start : start + 1 + following.start()] if following else md[start:]


def _cells(section: str) -> list[list[str]]:
    """The body rows of every Markdown table in ``section``, as cells."""
    rows = []
    for line in section.splitlines():
        if line.startswith("| ") and not line.startswith("|---"):
            rows.append([cell.strip() for cell in line.strip().strip("|").split(" | ")])
    return rows


def test_report_gate_section_is_the_gate_that_ran_or_says_which_rule_set_it_applied(
    ragexp: Any, store_uri: str, tmp_path: Path
) -> None:
    import json

    base, cand = two_runs(ragexp)
    assert ragexp("report", cand, "--baseline", base, "--language", "en", "--out", str(tmp_path / "before")).code == 0
    before = (tmp_path / "before/report.md").read_text(encoding="utf-8")
    gate = _section(before, "Release gate", 3)
    assert f"No gate ran on this pair (nothing recorded on the candidate run as comparisons/{base}/gate.json)" in gate
    assert "the candidate's configured rule set release (6 rules)" in gate
    assert len(_cells(gate)) == 1 + 6  # header and one row per rule checked

    ran = ragexp(
        "gate", "--baseline", base, "--candidate", cand, "gates=release_stat", "~gates.rules.p95_seconds", "--json"
    )
    assert ran.code == 2, ran.stderr
    assert ragexp("report", cand, "--baseline", base, "--language", "en", "--out", str(tmp_path / "after")).code == 0
    after = (tmp_path / "after/report.md").read_text(encoding="utf-8")
    recorded = json.loads(
        Path(
            MlflowClient(store_uri).download_artifacts(cand, f"comparisons/{base}/gate.json", str(tmp_path))
        ).read_text()
    )
    gate = _section(after, "Release gate", 3)
    assert "The gate that ran on this pair (ragexp gate, recorded on the candidate run as" in gate
    rows = _cells(gate)[1:]
    assert [(r[0].strip("`"), r[1].strip("`"), r[2]) for r in rows] == [
        (rule["metric"], rule["rule"], rule["outcome"]) for rule in recorded["rules"]
    ]
    assert len(rows) == recorded["checked"] == 5
    failed = len(recorded["failures"])
    assert f"release_stat: FAILED ({failed} of 5 rules did not pass)" in gate
    # The pass marks shown as the project's choice are the rule set that ran, too.
    marks = next(r for r in _cells(_section(after, "What this project chose", 3)) if r[0] == "Pass marks (gate rules)")
    assert marks[1].startswith("release_stat: ") and "p95_seconds" not in marks[1]


def test_official_split_follows_each_metrics_registry_flag(
    ragexp: Any, store_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ragexp.metrics.registry import METRICS
    from tests.servers.procs import serve

    monkeypatch.setenv("RAGEXP_JUDGE_API_KEY", "test-key")
    judge = Path(__file__).resolve().parent / "servers/judge.py"
    names = ["recall_at_k", "faithfulness", "answer_accuracy", "answer_relevancy"]
    with serve(judge) as url:
        common = ["dataset=scifacts_zh", f"metrics.names=[{','.join(names)}]", "provider.judge.max_retries=0"]
        urls = [f"provider.judge.base_url={url}", f"provider.judge.embeddings.url={url}"]
        run = ragexp("run", "provider=replay_judge", *common, *urls, "--json")
    assert run.code == 0, run.stderr
    run_id = run.json()["run_id"]
    assert ragexp("report", run_id, "--language", "en", "--out", str(tmp_path / "r")).code == 0
    md = (tmp_path / "r/report.md").read_text(encoding="utf-8")
    logged = MlflowClient(store_uri).get_run(run_id).data.tags["ragexp.metrics"].split(",")
    specs = [METRICS[name] for name in logged]
    assert set(names) <= set(logged)
    official = _cells(_section(md, "Official: what the metrics are, and who defines them"))[1:]
    assert [(r[0], r[-1]) for r in official] == [(s.name, s.source) for s in specs if s.official]
    assert official and all(METRICS[r[0]].official for r in official)
    project = _cells(_section(md, "Metrics this project defines", 3))[1:]
    assert [r[0] for r in project] == [s.name for s in specs if not s.official]
    said = _section(md, "What this run does not prove", 3)
    assert f"The metrics {', '.join(s.name for s in specs if not s.official)} are defined by this project." in said
    assert f"The definitions and ranges of {', '.join(s.name for s in specs if s.official)} come from" in said


def _glyphs() -> tuple[set[int], set[int]]:
    """Code points of the report's fonts: DejaVu Sans (matplotlib's own copy; Debian's default
    sans-serif, which the page's system-ui falls to) and Noto Sans CJK (`make browser`)."""
    import os

    import matplotlib
    from matplotlib import ft2font

    dejavu = os.path.join(os.path.dirname(matplotlib.__file__), "mpl-data/fonts/ttf/DejaVuSans.ttf")
    found = subprocess.run(["fc-match", "-f", "%{file}", "Noto Sans CJK SC"], capture_output=True, text=True)
    assert "NotoSansCJK" in found.stdout, "fonts-noto-cjk is needed (make browser installs it)"
    return set(ft2font.FT2Font(dejavu).get_charmap()), set(ft2font.FT2Font(found.stdout).get_charmap())


def test_no_glyph_outside_the_reports_fonts(ragexp: Any, tmp_path: Path) -> None:
    import html as html_module

    latin, cjk = _glyphs()
    base = ragexp("run", "--json").json()["run_id"]
    cand = ragexp("run", "provider.system.sample.chunking=sentence", "--json").json()["run_id"]
    assert ragexp("gate", "--baseline", base, "--candidate", cand).code == 2  # with its P95 rule
    for language in ("zh", "en"):
        out = tmp_path / language
        assert ragexp("report", cand, "--baseline", base, "--language", language, "--out", str(out)).code == 0
        page = (out / "report.html").read_text(encoding="utf-8")
        text = re.sub(r"<(script|style)[^>]*>.*?</\1>", " ", page, flags=re.S)
        text = html_module.unescape(re.sub(r"<[^>]+>", " ", text))
        missing = sorted({ch for ch in text if not ch.isspace() and ord(ch) not in latin and ord(ch) not in cjk})
        assert missing == [], [f"U+{ord(ch):04X} {ch}" for ch in missing]


def test_no_section_for_what_the_run_does_not_have(ragexp: Any, tmp_path: Path) -> None:
    base = ragexp("run", "--json").json()["run_id"]  # the sample system on kb_zh: no judge
    cand = ragexp("run", "provider.system.sample.chunking=sentence", "--json").json()["run_id"]
    assert ragexp("report", cand, "--baseline", base, "--language", "en", "--out", str(tmp_path / "r")).code == 0
    md = (tmp_path / "r/report.md").read_text(encoding="utf-8")
    headings = re.findall(r"^#+ (.+)$", md, flags=re.M)
    assert not [h for h in headings if h.startswith(("How far the judge", "Spread between judge"))], headings
    assert not [h for h in headings if h.startswith("Official")], headings
    assert "Spread between judge repeats" not in md
    assert "Errored cases" not in headings  # none errored
    # A run at full marks on every case has no worst cases to list.
    perfect = ragexp("run", "provider=fake", "--json").json()["run_id"]
    assert ragexp("report", perfect, "--language", "en", "--out", str(tmp_path / "perfect")).code == 0
    assert "Worst cases" not in (tmp_path / "perfect/report.md").read_text(encoding="utf-8")
    # Without a baseline: nothing compared, so neither what changed nor a gate.
    assert ragexp("report", cand, "--language", "en", "--out", str(tmp_path / "alone")).code == 0
    alone = (tmp_path / "alone/report.md").read_text(encoding="utf-8")
    assert "What changed" not in alone and "Release gate" not in alone and "Likely stage" not in alone


def test_what_changed_lists_every_moved_case_with_the_rationale_rows_carry(
    ragexp: Any, store_uri: str, tmp_path: Path
) -> None:
    import json

    from ragexp.compare.data import load_run
    from ragexp.metrics.registry import METRICS
    from ragexp.tracking.store import Store

    base = ragexp("run", "--json").json()["run_id"]  # the demo's pair: cases move both ways
    cand = ragexp("run", "provider.system.sample.chunking=sentence", "--json").json()["run_id"]
    store = Store(store_uri)
    runs = {run_id: load_run(store, run_id) for run_id in (base, cand)}
    rows = {run_id: [run.row(i) for i in range(len(run.case_ids))] for run_id, run in runs.items()}
    # Every case that moved, found from the two runs' cases.jsonl rows here, by the diff's rule.
    expected: dict[str, set[str]] = {"worse": set(), "better": set()}
    by_id = {row["id"]: row for row in rows[base]}
    for row in rows[cand]:
        before = by_id[row["id"]]
        for name, value in row["metrics"].items():
            old = before["metrics"].get(name)
            spec = METRICS[name]
            if value is None or old is None or (spec.population == "answerable" and row.get("unanswerable")):
                continue
            if abs(value - old) > 1e-9:
                expected["worse" if (value < old) == (spec.direction == "higher") else "better"].add(row["id"])
    assert expected["worse"] and expected["better"]
    # The candidate's rows carry a rationale recorded as text only (as a run made before rationale
    # codes, or a custom metric's words): the report shows it as recorded.
    lines = []
    for row in rows[cand]:
        row = {k: v for k, v in row.items() if k != "rationale_codes"}
        row["rationale"] = {name: f"why {name} of {row['id']}" for name in row["metrics"]}
        lines.append(json.dumps(row, ensure_ascii=False))
    store.log_files(cand, {"cases.jsonl": ("\n".join(lines) + "\n").encode("utf-8")})

    assert ragexp("report", cand, "--baseline", base, "--language", "en", "--out", str(tmp_path / "r")).code == 0
    md = (tmp_path / "r/report.md").read_text(encoding="utf-8")
    assert re.findall(r"^## (.+)$", md, flags=re.M)[:2] == ["Verdict", "What changed"]  # the verdict, then this
    changed = _section(md, "What changed")
    worse = _cells(_section(changed, "Cases that got worse", 3))
    better = _cells(_section(changed, "Cases that got better", 3))
    assert worse[0][-1] == "Why" and better[0][-1] == "Why"
    assert {r[0] for r in worse[1:]} == expected["worse"] and {r[0] for r in better[1:]} == expected["better"]
    for r in worse[1:] + better[1:]:
        moved = [part.split()[0] for part in r[2].split("; ")]
        # the candidate's words per moved metric, in order (the baseline's, now computed, beside them)
        said = [r[-1].index(f"{name}: why {name} of {r[0]}") for name in moved]
        assert said == sorted(said) and said[0] == 0
    assert changed.index("Cases that got worse") < changed.index("Cases that got better")
