"""Gather a run (and optionally its baseline) from the store and write the report.

With a baseline it opens with what changed: every case that got worse, then every case that got
better. It keeps MindSDK's two columns apart, by each metric's registry flag: what is official
(metrics defined by ragas / the MindSDK evaluation module, with ranges, directions, required fields
and sources) and what this project defined itself (its metrics, thresholds, dataset, baseline), and
says in plain words what the run therefore does not prove. The gate section is the gate that ran on
the pair (``gate.json`` recorded on the candidate), else says which rule set it applied. A section
appears only for what the run has.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import yaml

from ragexp import __version__, artifacts
from ragexp.compare.bridge import Bridge
from ragexp.compare.bridge import apply_to_gate as bridged_gate
from ragexp.compare.bridge import bridge_judge as bridge_runs
from ragexp.compare.changes import CaseChange, Changes, case_changes
from ragexp.compare.comparisons import read_comparison
from ragexp.compare.data import RunData, load_run
from ragexp.compare.diff import DiffResult
from ragexp.compare.figures import fmt, signed
from ragexp.compare.gate import GateResult, gate_runs
from ragexp.compare.summary import ledger_line
from ragexp.compare.tables import metric_table, rule_table
from ragexp.compare.turns import by_turn, turn_table
from ragexp.compare.versions import on_versions
from ragexp.config.models import GatesConfig
from ragexp.escape import html, markdown
from ragexp.metrics.population import covered, population
from ragexp.metrics.registry import (
    FIRST_FAILING_HOP,
    REASON_KINDS,
    MetricSpec,
    case_values_metric,
    headline_metrics,
    hop_of,
)
from ragexp.phrases import t
from ragexp.report import plots
from ragexp.stats.strata import MetricStrata
from ragexp.tables import Table, to_html, to_markdown
from ragexp.tracking.store import Store

WORST = 5


@dataclass
class Report:
    markdown: str
    html: str
    svgs: dict[str, str] = field(default_factory=dict)
    """File name -> SVG text (the Markdown links them; the HTML has them inline)."""


class Doc:
    """Builds the Markdown and the HTML side by side from the same calls. Every text it is given
    is plain text (answers, case ids and error bodies among it), escaped here for each side."""

    def __init__(self) -> None:
        self.md: list[str] = []
        self.html: list[str] = []
        self.svgs: dict[str, str] = {}

    def heading(self, text: str, level: int = 2) -> None:
        self.md.append(f"\n{'#' * level} {markdown(text)}\n")
        self.html.append(f"<h{level}>{html(text)}</h{level}>")

    def para(self, text: str) -> None:
        self.md.append(f"\n{markdown(text)}\n")
        self.html.append(f"<p>{html(text)}</p>")

    def table(self, headers: list[str], rows: list[list[str]]) -> None:
        self.render(Table.plain(headers, rows))

    def render(self, table: Table) -> None:
        self.md.append("")
        self.md.extend(to_markdown(table))
        self.html.append(to_html(table))

    def figure(self, name: str, svg: str, caption: str) -> None:
        self.svgs[name] = svg
        self.md.append(f"\n![{markdown(caption)}](plots/{name})\n")
        self.html.append(f"<figure>{svg}<figcaption>{html(caption)}</figcaption></figure>")


def build_report(
    store: Store,
    run_id: str,
    baseline_id: str | None,
    language: str | None,
    allow_incomparable: bool = False,
    attribution: dict[str, Any] | None = None,
    common_cases: bool = False,
    strata: list[MetricStrata] | None = None,
    bridge_judge: str | None = None,
) -> tuple[Report, str]:
    """The report of ``run_id`` (against ``baseline_id`` if given); returns it and its language.
    ``attribution``: what ``diff --attribute`` found for the pair (its JSON), shown as a section;
    ``strata``: a shadow pair's comparison by stratum (:func:`ragexp.workflows.shadow.pair_strata`);
    ``bridge_judge``: compare runs judged differently as ``diff --bridge-judge`` does."""
    run = load_run(store, run_id)
    config = yaml.safe_load(store.read_artifact(run_id, artifacts.CONFIG)) or {}
    language = language or config.get("report", {}).get("language") or "zh"
    base = load_run(store, baseline_id) if baseline_id else None
    diff: DiffResult | None = None
    gate: Gate | None = None
    ledger = None
    bridge: Bridge | None = None
    compared = run
    if base is not None:
        # Across dataset versions (--common-cases) the comparison is over the unchanged cases;
        # the run's own sections keep every case it scored.
        base, compared, ledger = on_versions(
            store, base, run, common_cases=common_cases, allow_incomparable=allow_incomparable
        )
        gates = GatesConfig.model_validate(config.get("gates", {"name": "release"}))
        if bridge_judge is not None:
            base, bridge = bridge_runs(store, base, compared, bridge_judge, confidence=gates.confidence)
        diff, verdict = gate_runs(gates, base, compared, allow_incomparable=allow_incomparable, ledger=ledger)
        if bridge is not None:
            diff.bridge = bridge.to_json()
            verdict = bridged_gate(verdict, bridge, {m.name: m.spec.direction for m in diff.metrics if m.spec})
        gate = Gate.of(store, base, compared, verdict, gates)
    specs = [spec for name in run.metrics if (spec := run.spec(name)) is not None]
    doc = Doc()
    doc.heading(f"{t('title', language)} · {run.record.name}", 1)
    if gate is not None:
        _verdict(doc, gate, language)
    if ledger is not None:
        doc.para(ledger_line(ledger, language))
    for line in bridge.lines() if bridge is not None else []:
        doc.para(line)
    if base is not None:
        _what_changed(doc, case_changes(base, compared, language), base, compared, language)
    _identity(doc, run, base, language)
    _columns(doc, run, base, config, specs, language, gate)
    _results(doc, run, specs, language)
    _trust(doc, run, config, specs, language)
    _audit(doc, store, run, language)
    _hops(doc, run, diff, language)
    if diff is not None and gate is not None and base is not None:
        _comparison(doc, diff, base, compared, language)
        if strata:
            _strata(doc, strata, PAIR_CONFIDENCE, language)
        _gate(doc, gate, language)
        _stage(doc, diff, language)
        if attribution is not None:
            _attribution(doc, attribution, language)
    return Report("\n".join(doc.md).strip() + "\n", _page(doc, language, run), doc.svgs), language


@dataclass(frozen=True)
class Gate:
    """The gate the report shows: the one ``ragexp gate`` ran on this pair (its recorded
    ``gate.json``), else the candidate's configured rule set applied here."""

    result: GateResult
    ran: bool
    """True: recorded by ``ragexp gate`` on the candidate for this baseline."""
    path: str
    """Where the candidate keeps (or would keep) the gate of this pair."""
    config: dict[str, Any]
    """The rule set: ``gates`` (its name), ``rules`` (metric -> bounds), ``max_error_rate``."""

    @classmethod
    def of(cls, store: Store, base: RunData, run: RunData, configured: GateResult, gates: GatesConfig) -> Gate:
        path = artifacts.comparison(base.run_id, artifacts.GATE)
        recorded = read_comparison(store, run.run_id, base.run_id, artifacts.GATE)
        if recorded is not None and recorded.get("rules") is not None:
            config = recorded.get("config") or {}
            return cls(GateResult.from_json(recorded), True, path, config)
        config = {
            "gates": gates.name,
            "rules": {name: rule.model_dump(exclude_none=True) for name, rule in gates.rules.items()},
            "max_error_rate": gates.max_error_rate,
        }
        return cls(configured, False, path, config)


def _what_changed(doc: Doc, changes: Changes, base: RunData, run: RunData, language: str) -> None:
    """Every case that got worse, then every case that got better, with what both runs did; the
    rationales in the report's language, but for runs that kept no code of them (said once)."""
    doc.heading(t("what_changed", language))
    doc.para(
        t(
            "what_changed_intro",
            language,
            baseline=base.run_id,
            worse=changes.worse_count,
            better=changes.better_count,
        )
    )
    if not changes.worse_count and not changes.better_count:
        doc.para(t("none_changed", language))
        return
    doc.table(
        [t("metric", language), t("cases_worse", language), t("cases_better", language)],
        [[name, str(worse), str(better)] for name, (worse, better) in changes.per_metric.items()],
    )
    for key, listed, count in (
        ("got_worse", changes.worse, changes.worse_count),
        ("got_better", changes.better, changes.better_count),
    ):
        if not count:
            continue
        doc.heading(t(key, language, n=count), 3)
        reasons = any(_reasons(change) for change in listed)
        headers = [
            "id",
            t("question", language),
            t("moved_on", language),
            t("baseline_retrieved", language),
            t("baseline_answer", language),
            t("candidate_retrieved", language),
            t("candidate_answer", language),
        ]
        rows = [_change_row(change, language) for change in listed]
        if reasons:
            headers.append(t("why", language))
            for row, change in zip(rows, listed, strict=True):
                row.append(_reasons(change))
        doc.table(headers, rows)
        if count > len(listed):
            doc.para(t("more_cases", language, n=count - len(listed)))
    recorded = _as_recorded(changes, base, run, language)
    if recorded:
        doc.para(t("reasons_recorded", language, runs=", ".join(recorded)))


def _as_recorded(changes: Changes, base: RunData, run: RunData, language: str) -> list[str]:
    """The runs (``id (language)``) whose offline rationales the report shows as they were
    recorded, in another language: runs written before rationales kept their codes."""
    found = []
    for side, data in (("baseline", base), ("candidate", run)):
        written = data.record.tag("language") or "?"
        if written == language:
            continue
        for change in (*changes.worse, *changes.better):
            recorded = getattr(change, side).recorded
            if any(m.metric in recorded and m.metric in REASON_KINDS for m in change.moves):
                found.append(f"{data.run_id} ({written})")
                break
    return found


def _change_row(change: CaseChange, language: str) -> list[str]:
    errors = case_values_metric("errored").name
    moved = []
    for m in change.moves:
        if m.metric == errors:
            moved.append(t("now_errors" if (m.candidate or 0) > (m.baseline or 0) else "no_longer_errors", language))
        else:
            moved.append(f"{m.metric} {fmt(m.baseline, 2)} → {fmt(m.candidate, 2)}")

    def answer(side: Any) -> str:
        if side.error:
            return f"{t('errored', language)}: {str(side.error)[:200]}"
        return str(side.answer or "")[:200]

    return [
        change.case_id,
        change.question[:120],
        "; ".join(moved),
        ", ".join(change.baseline.retrieved_ids[:5]) or "—",
        answer(change.baseline),
        ", ".join(change.candidate.retrieved_ids[:5]) or "—",
        answer(change.candidate),
    ]


def _reasons(change: CaseChange) -> str:
    """The candidate's rationale for each metric the case moved on, the baseline's beside it."""
    parts = []
    for m in change.moves:
        now, before = change.candidate.rationale.get(m.metric), change.baseline.rationale.get(m.metric)
        if now or before:
            text = f"{m.metric}: {now or '—'}"
            parts.append(f"{text} (baseline: {before})" if before and before != now else text)
    return "; ".join(parts)[:600]


def _identity(doc: Doc, run: RunData, base: RunData | None, language: str) -> None:
    record = run.record
    doc.heading(t("identity", language))
    rows = [
        [t("run", language), record.run_id],
        [t("config_hash", language), record.tag("config_hash")],
        [t("dataset_hash", language), f"{record.tag('dataset_hash')} ({len(run.case_ids)} {t('cases', language)})"],
        [t("dataset", language), record.tag("dataset")],
        [t("provider", language), record.tag("provider")],
        [t("k", language), record.tag("k")],
        [t("judge", language), record.tag("judge")],
        [t("version", language), f"{record.tag('version')} (report: {__version__})"],
        [t("date", language), datetime.fromtimestamp(record.start_time / 1000).isoformat(timespec="seconds")],
    ]
    if base is not None:
        rows.append(
            [
                t("baseline_run", language),
                f"{base.run_id} ({t('config_hash', language)} {base.record.tag('config_hash')[:12]})",
            ]
        )
    doc.table([t("item", language), t("value", language)], rows)
    spreads = {
        name.split(".", 1)[1]: value for name, value in record.metrics.items() if name.startswith("judge_spread.")
    }
    if spreads:
        doc.heading(t("spread", language), 3)
        doc.table([t("metric", language), "mean per-case std"], [[n, fmt(v)] for n, v in sorted(spreads.items())])


def _columns(
    doc: Doc,
    run: RunData,
    base: RunData | None,
    config: dict[str, Any],
    specs: list[MetricSpec],
    language: str,
    gate: Gate | None = None,
) -> None:
    """MindSDK's two columns, split by each metric's registry flag (``MetricSpec.official``)."""
    official = [spec for spec in specs if spec.official]
    project = [spec for spec in specs if not spec.official]
    headers = [
        t("metric", language),
        t("definition", language),
        t("range", language),
        t("direction", language),
        t("fields", language),
    ]
    if official:
        doc.heading(t("official", language))
        doc.table([*headers, t("source", language)], [[*_metric_row(spec, language), spec.source] for spec in official])
    doc.heading(t("self_defined", language))
    if project:
        doc.heading(t("project_metrics", language), 3)
        doc.table(
            [*headers, t("source", language)],
            [[*_metric_row(spec, language), _source(spec, language)] for spec in project],
        )
    yours = [spec.name for spec in project if spec.custom is not None]
    if yours:
        doc.para(t("yours_note", language, names=", ".join(yours)))
    dataset = config.get("dataset", {})
    gates = gate.config if gate is not None else config.get("gates", {})
    rules = "; ".join(
        f"{metric}: " + ", ".join(f"{k}={v}" for k, v in rule.items() if v is not None and v is not False)
        for metric, rule in (gates.get("rules") or {}).items()
    )
    if gates.get("max_error_rate") is not None:
        rules += f"; max_error_rate={gates['max_error_rate']}"
    name = gates.get("gates") or gates.get("name") or "—"
    doc.heading(t("project_choices", language), 3)
    doc.table(
        [t("item", language), t("value", language), t("who", language)],
        [
            [t("thresholds", language), f"{name}: {rules or '—'}", t("self", language)],
            [
                t("eval_dataset", language),
                f"{dataset.get('name', '—')} · {len(run.case_ids)} {t('cases', language)} · "
                f"{dataset.get('description', '')}",
                t("self", language),
            ],
            [t("author", language), str(dataset.get("author", "unknown")), t("self", language)],
            [
                t("baseline_run", language),
                base.run_id if base is not None else t("none", language),
                t("self", language),
            ],
        ],
    )
    doc.heading(t("not_proved", language), 3)
    honesty = [t("honesty", language, n=len(run.case_ids), author=dataset.get("author", "unknown"))]
    if project:
        honesty.append(t("honesty_project", language, names=", ".join(spec.name for spec in project)))
    if official:
        honesty.append(t("honesty_official", language, names=", ".join(spec.name for spec in official)))
    doc.para(("" if language == "zh" else " ").join(honesty))


def _metric_row(spec: MetricSpec, language: str) -> list[str]:
    high = "∞" if spec.high is None else f"{spec.high:g}"
    return [
        spec.name,
        spec.describe(language),
        f"[{spec.low:g}, {high}]",
        t(spec.direction, language),
        ", ".join(sorted(spec.needs)) or "—",
    ]


def _results(doc: Doc, run: RunData, specs: list[MetricSpec], language: str) -> None:
    doc.heading(t("results", language))
    rows = []
    for spec in specs:
        values = run.per_case(spec.name)
        covers = population(spec, values, run.unanswerable) if values is not None and spec.per_case else None
        missing = covers.cases - covers.scored if covers is not None else int(run.errored.sum())
        rows.append(
            [
                spec.name,
                fmt(run.summary(spec.name)),
                t(spec.direction, language),
                covers.words() if covers is not None else "—",
                str(missing),
            ]
        )
    doc.table(
        [
            t("metric", language),
            t("mean", language),
            t("direction", language),
            t("scored", language),
            t("errored_cases", language),
        ],
        rows,
    )
    for spec in specs:
        values = run.scores.get(spec.name)
        if values is not None:
            # The cases the mean covers, as the table counts them: not the unanswerable rows' 1.0s.
            covers = population(spec, values, run.unanswerable)
            doc.figure(
                f"hist_{spec.name}.svg",
                plots.histogram(
                    values[covered(spec, run.unanswerable)], spec.name, spec.low, spec.high, covers.words()
                ),
                f"{t('histogram', language)}: {spec.name} ({t(spec.direction, language)})",
            )
    errored = [i for i in range(len(run.case_ids)) if run.errored[i]]
    if errored:  # none: the table's errored column says 0, and no section lists nothing
        doc.heading(t("errors_list", language), 3)
        doc.table(
            ["id", t("why", language)], [[run.case_ids[i], str(run.row(i).get("error"))[:300]] for i in errored[:50]]
        )
    badness = np.zeros(len(run.case_ids))
    for name, values in run.scores.items():
        known = run.spec(name)
        if known is None or known.high is None:
            continue
        normal = np.nan_to_num((values - known.low) / (known.high - known.low), nan=0.0)
        badness += (1 - normal) if known.direction == "higher" else normal
    rows = []
    for i in np.argsort(-badness, kind="stable")[:WORST]:
        if badness[i] <= 0:  # a case at full marks on every metric is no worst case
            break
        row = run.row(int(i))
        output = row.get("output") or {}
        rows.append(
            [
                row["id"],
                str(row.get("question", ""))[:120],
                str(output.get("answer", ""))[:160],
                ", ".join(output.get("ranked_ids", [])[:5]),
                ", ".join(f"{k}={fmt(v, 2)}" for k, v in row["metrics"].items()),
            ]
        )
    if rows:
        doc.heading(t("worst_cases", language), 3)
        doc.table(
            ["id", t("question", language), t("answer", language), t("retrieved", language), t("metric", language)],
            rows,
        )


def _source(spec: MetricSpec, language: str) -> str:
    """Who defines a metric: its official source, this project, or the user (``metrics.custom``)."""
    if spec.custom is not None:
        return t("yours", language)
    return spec.source if spec.official else t("project", language)


def _trust(doc: Doc, run: RunData, config: dict[str, Any], specs: list[MetricSpec], language: str) -> None:
    """Calibration against human scores and prediction-powered means, from the run's metrics."""
    labelled = [spec for spec in specs if spec.human_labels and spec.name in run.human]
    if not labelled:
        return
    threshold = float(config.get("calibration", {}).get("threshold", 0.5))
    # Without a judge the scores people checked are computed by code: no judge to trust.
    judged = any(spec.judge for spec in labelled)
    doc.heading(t("trust" if judged else "trust_automatic", language))
    doc.para(t("trust_intro", language, threshold=f"{threshold:g}"))
    rows = []
    for spec in labelled:
        c = run.calibration(spec.name)
        if not c:
            continue
        ci = (
            f"[{fmt(c['kappa_ci_low'], 2)}, {fmt(c['kappa_ci_high'], 2)}]"
            if "kappa_ci_low" in c and "kappa_ci_high" in c
            else "—"
        )
        rows.append(
            [
                spec.name,
                str(int(c["n"])),
                fmt(c.get("mae"), 3),
                signed(c["bias"], 3),
                fmt(c.get("spearman"), 3),
                fmt(c.get("accuracy"), 3),
                fmt(c.get("kappa"), 3),
                ci,
            ]
        )
    if rows:
        doc.table([t("metric", language), "n", "MAE", "bias", "Spearman ρ", "accuracy", "Cohen's κ", "κ CI"], rows)
    else:
        doc.para(t("no_labels", language))
    metrics = run.record.metrics
    ppi_rows = [
        [
            spec.name,
            fmt(run.summary(spec.name)),
            fmt(metrics[f"ppi.{spec.name}.mean"]),
            f"[{fmt(metrics[f'ppi.{spec.name}.ci_low'])}, {fmt(metrics[f'ppi.{spec.name}.ci_high'])}]",
            f"{int(metrics[f'ppi.{spec.name}.n_labelled'])}/{int(metrics[f'ppi.{spec.name}.n_total'])}",
        ]
        for spec in labelled
        if f"ppi.{spec.name}.mean" in metrics
    ]
    if ppi_rows:
        doc.heading(t("ppi_title", language), 3)
        confidence = float(config.get("calibration", {}).get("confidence", 0.95))
        doc.table(
            [t("metric", language), f"judge {t('mean', language)}", "PPI", f"{confidence:.0%} CI", "labelled"],
            ppi_rows,
        )
    for spec in labelled:
        if spec.name in run.scores:
            doc.figure(
                f"human_{spec.name}.svg",
                plots.judge_vs_human(run.scores[spec.name], run.human[spec.name], spec.name, threshold),
                f"{t('judge_vs_human', language)}: {spec.name}",
            )


def _audit(doc: Doc, store: Store, run: RunData, language: str) -> None:
    """The label audit's findings, when the run had a corpus to audit against."""
    if artifacts.AUDIT not in store.list_artifacts(run.run_id):
        return
    findings = orjson.loads(store.read_artifact(run.run_id, artifacts.AUDIT)).get("findings", [])
    doc.heading(t("audit", language))
    if not findings:
        doc.para(t("audit_none", language))
        return
    doc.para(t("audit_count", language).format(n=len(findings)))
    doc.table(
        ["id", "line", "kind", t("why", language)],
        [[f["id"], str(f["line"]), f["kind"], f["message"]] for f in findings[:200]],
    )


def _comparison(doc: Doc, diff: DiffResult, base: RunData, run: RunData, language: str) -> None:
    doc.heading(t("comparison", language))
    doc.render(metric_table(diff, language))
    with_ci = [m for m in diff.metrics if m.ci_low is not None and m.ci_high is not None and m.delta is not None]
    if with_ci:
        doc.figure(
            "deltas.svg",
            plots.deltas(
                [m.name for m in with_ci],
                [float(m.delta or 0) for m in with_ci],
                [float(m.ci_low or 0) for m in with_ci],
                [float(m.ci_high or 0) for m in with_ci],
            ),
            f"{t('delta', language)} ({t('ci', language, level=diff.confidence)})",
        )
    turns = by_turn(base, run, headline_metrics())
    if turns:
        doc.heading(t("by_turn", language), 3)
        headers, rows = turn_table(turns, headline_metrics(), (t("turn", language), t("pairs", language)))
        doc.table(headers, rows)
    shared = [name for name in headline_metrics() if name in base.scores and name in run.scores][:3]
    candidate = run.select(base.case_ids) if set(base.case_ids) == set(run.case_ids) else None
    for name in shared:
        if candidate is None:
            break
        doc.figure(
            f"scatter_{name}.svg",
            plots.scatter(*_covered_pair(base, candidate, name), name),
            f"{t('scatter', language)}: {name}",
        )


PAIR_CONFIDENCE = 0.95
"""The confidence of a shadow pair's table by stratum in the report (``diff``'s default)."""


def _strata(doc: Doc, found: list[MetricStrata], confidence: float, language: str) -> None:
    """A shadow pair: each metric by stratum, the judged delta beside its PPI correction."""
    doc.heading(t("by_stratum", language), 3)
    headers = [
        t("stratum", language),
        t("pairs", language),
        t("judged_delta", language),
        t("ci", language, level=confidence),
        t("labelled_pairs", language),
        t("ppi_delta", language),
        t("ppi_interval", language),
    ]
    for metric in found:
        rows = []
        for row in [metric.overall, *metric.strata]:
            stats, ppi = row.stats, row.ppi
            rows.append(
                [
                    row.stratum,
                    str(stats.n if stats else 0),
                    signed(stats.delta) if stats else "—",
                    f"[{signed(stats.ci_low)}, {signed(stats.ci_high)}]" if stats else "—",
                    str(row.labelled),
                    signed(ppi.mean) if ppi else "—",
                    f"[{signed(ppi.ci_low)}, {signed(ppi.ci_high)}]" if ppi else "—",
                ]
            )
        doc.heading(metric.name, 4)
        doc.table(headers, rows)


def _hops(doc: Doc, run: RunData, diff: DiffResult | None, language: str) -> None:
    """A run of a multi-hop set: each per-hop metric's mean hop by hop, with the cases it covers;
    the cases by first failing hop; and, against a baseline, how that moved."""
    rows: dict[int, dict[str, str]] = {}
    bases: list[str] = []
    for name in run.metrics:
        found = hop_of(name)
        spec = run.spec(name)
        if found is None or spec is None or name not in run.scores:
            continue
        base, hop = found
        if base not in bases:
            bases.append(base)
        covered_by = population(spec, run.scores[name], run.unanswerable)
        rows.setdefault(hop, {})[base] = f"{fmt(run.summary(name))} ({covered_by.words()})"
    failing = run.scores.get(FIRST_FAILING_HOP)
    if not rows and failing is None:
        return
    doc.heading(t("hops", language), 3)
    doc.para(t("hops_intro", language))
    if rows:
        doc.table(
            [t("hop_column", language), *bases],
            [[str(hop), *(rows[hop].get(base, "-") for base in bases)] for hop in sorted(rows)],
        )
    if failing is not None:
        scored = failing[np.isfinite(failing)].astype(np.int64)
        counts = np.bincount(scored, minlength=max(rows, default=0) + 1) if scored.size else np.zeros(1, np.int64)
        doc.para(t("hops_first_failing", language))
        labels = ["none" if hop == 0 else f"hop {hop}" for hop in range(counts.size)]
        doc.table(labels, [[str(int(count)) for count in counts]])
    moves = diff.hops if diff is not None else None
    if moves is not None:
        doc.para(t("hops_moved", language, n=moves.paired))
        labels = [moves.label(hop) for hop in range(moves.hops + 1)]
        doc.table(
            ["", *labels],
            [
                [labels[b], *(str(int(moves.counts[b, c])) for c in range(moves.hops + 1))]
                for b in range(moves.hops + 1)
            ],
        )


def _verdict(doc: Doc, gate: Gate, language: str) -> None:
    """What a reader decides on, before anything else: the gate's verdict and the rules that failed
    (every rule is in the gate section)."""
    result = gate.result
    doc.heading(t("verdict", language), 2)
    word = t("verdict_passed", language) if result.passed else t("verdict_failed", language)
    doc.para(t("gate_verdict", language, gates=result.gates, word=word, failed=len(result.failures), n=result.checked))
    if result.failures:
        doc.render(rule_table(result, language, everything=False))
    if not gate.ran:
        doc.para(t("gate_not_ran", language, path=gate.path, gates=result.gates, n=result.checked))


def _gate(doc: Doc, gate: Gate, language: str) -> None:
    """The gate that ran on this pair, rule by rule; else the rule set applied here, said so."""
    result = gate.result
    doc.heading(t("gate", language), 3)
    if gate.ran:
        doc.para(t("gate_ran", language, path=gate.path))
    else:
        doc.para(t("gate_not_ran", language, path=gate.path, gates=result.gates, n=result.checked))
    word = t("verdict_passed", language) if result.passed else t("verdict_failed", language)
    doc.para(t("gate_verdict", language, gates=result.gates, word=word, failed=len(result.failures), n=result.checked))
    doc.render(rule_table(result, language))


def _stage(doc: Doc, diff: DiffResult, language: str) -> None:
    """The likely stage, in the words ``ragexp diff`` prints (:meth:`Hint.text`)."""
    doc.heading(t("stage", language), 3)
    for line in [hint.text(language) for hint in diff.diagnosis] or [t("no_diagnosis", language)]:
        doc.para(line)


def _attribution(doc: Doc, found: dict[str, Any], language: str) -> None:
    """``--attribute``: the parts of each metric's change as a table and a stacked bar, and the
    cases by cause, in the figures ``diff --attribute`` printed."""
    doc.heading(t("attribution", language), 3)
    level = round(100 * float(found["confidence"]))
    doc.para(t("attribution_about", language, replayed=found["replayed"], level=level))
    keys = ("total", "retrieval", "generation", "interaction")

    def cell(row: dict[str, Any], key: str) -> str:
        if row[key] is None:
            return "—"
        low, high = row[f"{key}_ci"]
        return f"{signed(row[key])} [{signed(low)}, {signed(high)}]"

    rows = [[row["name"], str(row["cases"]), *(cell(row, key) for key in keys)] for row in found["metrics"]]
    doc.table([t("metric", language), t("cases", language), *(t(f"part_{key}", language) for key in keys)], rows)
    shown = [row for row in found["metrics"] if row["total"] is not None and not row["by_definition"]]
    if shown:
        labels = {key: t(f"part_{key}", language) for key in keys}
        doc.figure(
            "attribution.svg",
            plots.attribution(
                [row["name"] for row in shown],
                {key: [float(row[key]) for row in shown] for key in keys[1:]},
                [float(row["total"]) for row in shown],
                labels,
            ),
            t("attribution_bar", language),
        )
    by_cause: dict[str, list[str]] = {}
    for case in found["cases"]:
        by_cause.setdefault(case["cause"], []).append(case["id"])
    if by_cause:
        doc.heading(t("attribution_causes", language), 4)
        doc.table(
            [t("cause", language), t("case_ids", language)],
            [[cause, ", ".join(ids)] for cause, ids in by_cause.items()],
        )
    if found["errors"]:
        doc.para(t("attribution_errors", language, n=len(found["errors"])))


STYLE = """
body{font-family:system-ui,-apple-system,"Noto Sans CJK SC","PingFang SC","Microsoft YaHei",sans-serif;
margin:2rem auto;max-width:1100px;color:#222;line-height:1.5;padding:0 1rem}
table{border-collapse:collapse;margin:.5rem 0 1.5rem;font-size:.9rem;width:100%}
th,td{border:1px solid #ddd;padding:.3rem .5rem;text-align:left;vertical-align:top}
th{background:#f3f5f8} figure{display:inline-block;margin:.5rem 1rem .5rem 0}
figure svg{max-width:100%;height:auto} figcaption{font-size:.8rem;color:#555}
h1{font-size:1.6rem} h2{border-bottom:2px solid #4C78A8;padding-bottom:.2rem;margin-top:2rem}
"""

# Lets a headless browser (and a person) check the page: counts and any script error land on <body>.
CHECK = """
window.__errors=[];window.addEventListener('error',function(e){window.__errors.push(String(e.message));});
document.addEventListener('DOMContentLoaded',function(){var b=document.body;
b.setAttribute('data-svgs',document.querySelectorAll('figure svg').length);
b.setAttribute('data-tables',document.querySelectorAll('table').length);
b.setAttribute('data-errors',window.__errors.length);b.setAttribute('data-ready','1');});
"""


def _page(doc: Doc, language: str, run: RunData) -> str:
    return page(doc, language, f"{t('title', language)} · {run.run_id}")


def page(doc: Doc, language: str, title_text: str) -> str:
    """The self-contained HTML page of a report built with ``doc``."""
    lang = "zh-CN" if language == "zh" else "en"
    title = html(title_text)
    body = "\n".join(doc.html)
    return (
        f'<!DOCTYPE html>\n<html lang="{lang}"><head><meta charset="utf-8"><title>{title}</title>'
        f"<style>{STYLE}</style><script>{CHECK}</script></head><body>\n{body}\n</body></html>\n"
    )


def write_report(report: Report, out: Path) -> list[Path]:
    (out / "plots").mkdir(parents=True, exist_ok=True)
    written = [out / "report.md", out / "report.html"]
    written[0].write_text(report.markdown, encoding="utf-8")
    written[1].write_text(report.html, encoding="utf-8")
    for name, svg in report.svgs.items():
        path = out / "plots" / name
        path.write_text(svg, encoding="utf-8")
        written.append(path)
    return written


def _covered_pair(base: RunData, candidate: RunData, name: str) -> tuple[np.ndarray, np.ndarray]:
    """Both runs' per-case scores of ``name`` over the cases its mean covers (the diff's pairs)."""
    mask = covered(base.spec(name), base.unanswerable)
    return base.scores[name][mask], candidate.scores[name][mask]
