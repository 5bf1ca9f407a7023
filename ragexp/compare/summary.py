"""``--summary FILE`` of ``ragexp gate`` and ``ragexp diff``: Markdown for a pull request or
``$GITHUB_STEP_SUMMARY``, in Chinese or English.

What comes from data (case ids, run and dataset names, a service's error text) is shown as code
spans (:func:`ragexp.escape.markdown`): nothing in a code span is a link, an image or HTML, not
even a bare address that GitHub would otherwise link.

The verdict comes first, then the rules that did not pass, the metric table with deltas and
intervals, the most regressed cases and the likely stage. Runs link to the MLflow UI when one is
known (a tracking server, or ``--ui-url``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import quote, urlsplit, urlunsplit

from ragexp.compare.figures import fmt, signed, threshold
from ragexp.escape import markdown

if TYPE_CHECKING:
    # Types only: `ragexp diff` checks --language before any work, and the gate's config models
    # (pydantic) are not needed for that.
    from ragexp.compare.diff import DiffResult, MetricDiff
    from ragexp.compare.gate import GateResult
    from ragexp.tracking.store import RunRecord

SUMMARY_CASES = 5
"""How many of the most regressed cases a summary lists."""

TEXT: dict[str, dict[str, str]] = {
    "gate_passed": {"en": "✅ Release gate {gates}: PASSED", "zh": "✅ 发布门禁 {gates}：通过"},
    "gate_failed": {"en": "❌ Release gate {gates}: FAILED", "zh": "❌ 发布门禁 {gates}：未通过"},
    "rules_passed": {"en": "All {n} rules passed.", "zh": "全部 {n} 条规则通过。"},
    "rules_failed": {"en": "{failed} of {n} rules did not pass.", "zh": "{n} 条规则中 {failed} 条未通过。"},
    "rules_undecided": {
        "en": "{undecided} of them could not be decided (a missing score is never a pass).",
        "zh": "其中 {undecided} 条无法判定（缺失的分数不算通过）。",
    },
    "diff_title": {
        "en": "Candidate vs baseline: {better} better, {worse} worse, {flat} unchanged",
        "zh": "候选对比基线：{better} 项变好，{worse} 项变差，{flat} 项无显著变化",
    },
    "worse_list": {"en": "Worse: {names}.", "zh": "变差的指标：{names}。"},
    "incomparable": {
        "en": "⚠️ Compared although not comparable: {what}.",
        "zh": "⚠️ 两次运行本不可比，仍按要求比较：{what}。",
    },
    "baseline": {"en": "Baseline", "zh": "基线"},
    "candidate": {"en": "Candidate", "zh": "候选"},
    "config": {"en": "config", "zh": "配置"},
    "chosen": {"en": "chosen by", "zh": "选择方式"},
    "default": {
        "en": "the newest finished comparable run after the baseline",
        "zh": "基线之后最新的、可比的已完成运行",
    },
    "dataset": {"en": "Dataset", "zh": "数据集"},
    "cases": {"en": "cases", "zh": "条"},
    "failed_rules": {"en": "Rules that did not pass", "zh": "未通过的规则"},
    "metric": {"en": "Metric", "zh": "指标"},
    "rule": {"en": "Rule", "zh": "规则"},
    "outcome": {"en": "Outcome", "zh": "结果"},
    "failed": {"en": "failed", "zh": "未通过"},
    "undecided": {"en": "undecided", "zh": "无法判定"},
    "threshold": {"en": "Threshold", "zh": "阈值"},
    "why": {"en": "Why", "zh": "原因"},
    "metrics": {"en": "Metrics", "zh": "指标对比"},
    "better": {"en": "Better", "zh": "方向"},
    "higher": {"en": "higher", "zh": "越高越好"},
    "lower": {"en": "lower", "zh": "越低越好"},
    "delta": {"en": "Delta", "zh": "差值"},
    "ci": {"en": "{level:.0%} CI", "zh": "{level:.0%} 置信区间"},
    "p": {"en": "p", "zh": "p 值"},
    "updown": {"en": "Up/down/same", "zh": "变好/变差/不变"},
    "moved": {"en": "Verdict", "zh": "判断"},
    "moved_better": {"en": "better", "zh": "变好"},
    "moved_worse": {"en": "worse", "zh": "变差"},
    "moved_flat": {"en": "flat", "zh": "持平"},
    "worst": {"en": "Most regressed cases", "zh": "退步最多的样本"},
    "no_worst": {"en": "No case regressed.", "zh": "没有样本退步。"},
    "case": {"en": "Case", "zh": "样本"},
    "regression": {"en": "Regression", "zh": "退步量"},
    "changes": {"en": "What changed", "zh": "变化"},
    "error": {"en": "Candidate error", "zh": "候选的错误"},
    "errored": {"en": "errored", "zh": "出错"},
    "stage": {"en": "Likely stage", "zh": "可能出问题的环节"},
    "detectable": {"en": "Detectable", "zh": "可检测变化"},
    "underpowered": {"en": "What this gate cannot see", "zh": "该门禁看不出的变化"},
    "detectable_note": {
        "en": "Detectable: the smallest true change each paired comparison finds 4 times in 5 "
        "(two-sided, {level:.0%} confidence).",
        "zh": "可检测变化：配对比较有 80% 把握发现的最小真实变化（双侧，{level:.0%} 置信度）。",
    },
    "footer": {
        "en": "Statistics are paired over the cases both runs scored; a missing score is never counted as zero.",
        "zh": "统计量按两次运行都有分数的样本配对计算；缺失的分数不会按 0 计。",
    },
}

LANGUAGES = ("zh", "en")


def t(key: str, language: str, **values: object) -> str:
    return TEXT[key][language].format(**values)


@dataclass(frozen=True)
class Links:
    """Where the MLflow UI shows runs (None: no UI known, e.g. a local SQLite store)."""

    base: str | None

    @classmethod
    def for_store(cls, tracking_uri: str, ui_url: str | None) -> Links:
        """``ui_url`` if given, else the tracking URI when it is a server; credentials are dropped."""
        chosen = ui_url or (tracking_uri if tracking_uri.startswith(("http://", "https://")) else None)
        if not chosen:
            return cls(None)
        parts = urlsplit(chosen)
        host = parts.hostname or ""
        netloc = f"{host}:{parts.port}" if parts.port else host
        return cls(urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", "")))

    def run(self, record: RunRecord) -> str | None:
        if self.base is None:
            return None
        # Percent-encoded so that no character of it can end the Markdown link it goes into.
        return quote(f"{self.base}/#/experiments/{record.experiment_id}/runs/{record.run_id}", safe=":/#?&=%~+,;@")


def gate_summary(
    result: GateResult,
    diff: DiffResult,
    *,
    language: str,
    links: Links,
    chosen: Sequence[str] = (),
    notes: Sequence[str] = (),
) -> str:
    """Markdown for a gate: verdict, rules that did not pass, metrics, most regressed cases."""
    lines: list[str] = []
    if result.passed:
        lines += [
            f"## {t('gate_passed', language, gates=markdown(result.gates, code=True))}",
            "",
            t("rules_passed", language, n=result.checked),
        ]
    else:
        lines += [
            f"## {t('gate_failed', language, gates=markdown(result.gates, code=True))}",
            "",
            t("rules_failed", language, failed=len(result.failures), n=result.checked),
        ]
        if result.undecided:
            lines[-1] += " " + t("rules_undecided", language, undecided=len(result.undecided))
    lines += [f"\n{markdown(note)}" for note in notes]
    lines += _runs(diff, language, links, chosen)
    # Beside the verdict, not under a heading of its own: a reader of the verdict sees it.
    cannot_tell = [(r, r.cannot_tell(language)) for r in result.rules]
    if any(line for _, line in cannot_tell):
        lines += ["", f"**⚠️ {t('underpowered', language)}**", ""]
        lines += [
            f"- {markdown(r.metric, code=True)} {markdown(r.rule, code=True)} {markdown(threshold(r.threshold))}: "
            f"{markdown(line)}"
            for r, line in cannot_tell
            if line
        ]
    if result.failures:
        lines += ["", f"### {t('failed_rules', language)}", ""]
        lines += _table(
            [t(k, language) for k in ("metric", "rule", "outcome", "baseline", "candidate", "threshold", "why")],
            [
                [
                    markdown(r.metric, code=True),
                    markdown(r.rule, code=True),
                    t(r.outcome, language),
                    fmt(r.baseline),
                    fmt(r.candidate),
                    markdown(threshold(r.threshold)),
                    markdown(r.message),
                ]
                for r in result.failures
            ],
        )
    lines += _body(diff, language)
    return "\n".join(lines) + "\n"


def diff_summary(diff: DiffResult, *, language: str, links: Links, chosen: Sequence[str] = ()) -> str:
    """Markdown for a diff: how many metrics moved which way, then the same tables as a gate."""
    moves = [m.moved() for m in diff.metrics]
    worse = [m.name for m in diff.metrics if m.moved() == "worse"]
    title = t(
        "diff_title",
        language,
        better=moves.count("better"),
        worse=moves.count("worse"),
        flat=moves.count("flat"),
    )
    lines = [f"## {'⚠️' if worse else '✅'} {title}"]
    if worse:
        lines += ["", t("worse_list", language, names=", ".join(markdown(name, code=True) for name in worse))]
    lines += _runs(diff, language, links, chosen)
    lines += _body(diff, language)
    return "\n".join(lines) + "\n"


def _runs(diff: DiffResult, language: str, links: Links, chosen: Sequence[str]) -> list[str]:
    lines = [""]
    for role, data, how in [
        ("baseline", diff.baseline, chosen[0] if len(chosen) > 0 else ""),
        ("candidate", diff.candidate, chosen[1] if len(chosen) > 1 else ""),
    ]:
        record = data.record
        url = links.run(record)
        # The link's target is the UI's address (configured, not data) with ids MLflow generated.
        run_id = markdown(record.run_id, code=True)
        run = f"[{run_id}]({url})" if url else run_id
        name = f" {markdown(record.name, code=True)}" if record.name else ""
        config_hash = markdown(record.tag("config_hash")[:12], code=True)
        text = f"- **{t(role, language)}**: {run}{name} · {t('config', language)} {config_hash}"
        if how:
            text += f" · {t('chosen', language)}: " + (
                t("default", language) if how == "default" else markdown(how, code=True)
            )
        lines.append(text)
    base = diff.baseline.record
    lines.append(
        f"- **{t('dataset', language)}**: {markdown(base.tag('dataset'), code=True)} "
        f"{markdown(base.tag('dataset_hash')[:12], code=True)} · "
        f"{len(diff.baseline.case_ids)} {t('cases', language)} · K={base.tag('k')}"
    )
    if diff.differences:
        lines += ["", t("incomparable", language, what=markdown("; ".join(diff.differences)))]
    return lines


def _body(diff: DiffResult, language: str) -> list[str]:
    lines = ["", f"### {t('metrics', language)}", ""]
    lines += _table(
        [
            t("metric", language),
            t("better", language),
            t("baseline", language),
            t("candidate", language),
            t("delta", language),
            t("ci", language, level=diff.confidence),
            t("p", language),
            t("updown", language),
            t("moved", language),
            t("detectable", language),
        ],
        [_metric_row(m, language) for m in diff.metrics],
    )
    if any(m.power is not None for m in diff.metrics):
        lines += ["", t("detectable_note", language, level=diff.confidence)]
    lines += ["", f"### {t('worst', language)}", ""]
    if diff.cases:
        rows = []
        for case in diff.cases[:SUMMARY_CASES]:
            changes = ", ".join(
                f"{markdown(name)} {fmt(v['baseline'], 2)}→{fmt(v['candidate'], 2)}"
                for name, v in case["metrics"].items()
                if v["baseline"] != v["candidate"]
            )
            error = case["candidate"]["error"] or ""
            rows.append(
                [
                    markdown(case["id"], code=True),
                    fmt(case["regression"]),
                    changes or t("errored", language),
                    markdown(error[:200], code=True) if error else "",
                ]
            )
        lines += _table([t(k, language) for k in ("case", "regression", "changes", "error")], rows)
    else:
        lines.append(t("no_worst", language))
    if diff.diagnosis:
        lines += ["", f"### {t('stage', language)}", ""]
        lines += [f"- {markdown(line)}" for line in diff.diagnosis]
    lines += ["", f"<sub>{t('footer', language)}</sub>"]
    return lines


def _metric_row(m: MetricDiff, language: str) -> list[str]:
    ci = f"[{signed(m.ci_low)}, {signed(m.ci_high)}]" if m.ci_low is not None and m.ci_high is not None else "—"
    moved = m.moved()
    mark = {"better": "🟢 ", "worse": "🔴 ", "flat": ""}[moved]
    return [
        markdown(m.name, code=True),
        t(m.direction, language),
        fmt(m.baseline),
        fmt(m.candidate),
        signed(m.delta),
        ci,
        fmt(m.p_value),
        f"{m.improved}/{m.regressed}/{m.unchanged}",
        mark + t(f"moved_{moved}", language),
        fmt(m.detectable_effect),
    ]


def _table(headers: list[str], rows: list[list[str]]) -> list[str]:
    """Rows of Markdown cells; every value from data was escaped by :func:`markdown` already."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return lines
