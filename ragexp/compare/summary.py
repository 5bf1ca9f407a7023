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

from ragexp.compare.figures import fmt, threshold
from ragexp.compare.missing import case_legend, metric_legend
from ragexp.compare.tables import failure_table, metric_table
from ragexp.datasets.ledger import Ledger
from ragexp.escape import markdown
from ragexp.phrases import LANGUAGES, t
from ragexp.tables import Column, Table, to_markdown

if TYPE_CHECKING:
    # Types only: `ragexp diff` checks --language before any work, and the gate's config models
    # (pydantic) are not needed for that.
    from ragexp.compare.diff import DiffResult
    from ragexp.compare.gate import GateResult
    from ragexp.tracking.store import RunRecord

SUMMARY_CASES = 5
"""How many of the most regressed cases a summary lists."""

__all__ = ["LANGUAGES", "SUMMARY_CASES", "Links", "diff_summary", "gate_summary"]


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
        lines += to_markdown(failure_table(result, language))
        if any(None in (r.baseline, r.candidate) for r in result.failures):
            lines += ["", markdown(t("dash_run_value", language))]
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
        unconfirmed=sum(1 for m in diff.metrics if m.verdict() in ("better_ns", "worse_ns")),
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
    if diff.ledger is not None:
        lines += ["", markdown(ledger_line(diff.ledger, language))]
    if diff.differences:
        lines += ["", t("incomparable", language, what=markdown("; ".join(diff.differences)))]
    return lines


def ledger_line(ledger: Ledger, language: str) -> str:
    """The one line every output of a ``--common-cases`` comparison carries: the ledger's counts
    and the cases compared."""
    return t("versions_ledger", language, **ledger.counts())


def _body(diff: DiffResult, language: str) -> list[str]:
    lines = ["", f"### {t('metrics', language)}", ""]
    lines += to_markdown(metric_table(diff, language, marks=True))
    dashes = metric_legend(diff, language)
    if dashes:
        lines += ["", markdown(dashes[0]), ""]
        lines += [f"- {markdown(line)}" for line in dashes[1:]]
    if any(m.power is not None for m in diff.metrics):
        lines += ["", t("detectable_note", language, level=diff.confidence)]
    lines += ["", f"### {t('most_regressed', language)}", ""]
    if diff.cases:
        columns = [
            Column(t("case", language), kind="code"),
            Column(t("regression", language), "right", "figure"),
            Column(t("changes", language)),
            Column(t("error", language), kind="code"),
        ]
        rows = []
        for case in diff.cases[:SUMMARY_CASES]:
            changes = ", ".join(
                f"{name} {fmt(v['baseline'], 2)}→{fmt(v['candidate'], 2)}"
                for name, v in case["metrics"].items()
                if v["baseline"] != v["candidate"]
            )
            error = case["candidate"]["error"] or ""
            rows.append([case["id"], fmt(case["regression"]), changes or t("errored", language), error[:200]])
        lines += to_markdown(Table(columns, rows))
        lines += [f"\n{markdown(line)}" for line in case_legend(diff.cases[:SUMMARY_CASES], language)]
    else:
        lines.append(t("no_worst", language))
    if diff.diagnosis:
        lines += ["", f"### {t('stage', language)}", ""]
        lines += [f"- {markdown(hint.text(language))}" for hint in diff.diagnosis]
    lines += ["", f"<sub>{t('footer', language)}</sub>"]
    return lines
