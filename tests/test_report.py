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
