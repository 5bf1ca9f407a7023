"""What each command prints for people (``--json`` prints the library's ``to_json`` instead).

One function per output; the command modules and ``ragexp demo`` call them, so a command's output
looks the same wherever it is shown.
"""

from __future__ import annotations

import json
import shlex
import shutil
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ragexp.cli.render import duration, fmt, scorer, signed, table, terminal, to_terminal, trust_lines
from ragexp.compare.missing import case_legend, metric_legend
from ragexp.compare.power import POWER, POWER_ASSUMPTION, detectable_words
from ragexp.compare.summary import ledger_line
from ragexp.compare.sweeps import override_words, shown_override, varying_overrides
from ragexp.compare.tables import failure_table, metric_table
from ragexp.compare.turns import by_turn, turn_table
from ragexp.metrics.registry import headline_metrics
from ragexp.outputs import info
from ragexp.phrases import t
from ragexp.secrets import mask_url
from ragexp.workflows.datasets import VersionDiff
from ragexp.workflows.runs import role_words

if TYPE_CHECKING:
    from ragexp.compare.data import RunData
    from ragexp.compare.diff import DiffResult
    from ragexp.compare.gate import GateResult
    from ragexp.compare.sweeps import SweepAnalysis
    from ragexp.draft.review import Accepted
    from ragexp.workflows.calibrate import Calibrated
    from ragexp.workflows.draft import DraftedSet, InReview
    from ragexp.workflows.gate import GateOutcome
    from ragexp.workflows.label import Queued
    from ragexp.workflows.multirun import SweepOutcome
    from ragexp.workflows.power import BaselinePower
    from ragexp.workflows.report import Published
    from ragexp.workflows.run import Evaluation, RunOutcome
    from ragexp.workflows.sequential import SequentialOutcome
    from ragexp.workflows.shadow import ShadowOutcome

"""Cases a run lists among those it missed; the rest are counted."""


def show_run(evaluation: Evaluation) -> None:
    """The metric table, the cases the run missed, stage timings, where the run is, and trust."""
    outcome, config = evaluation.outcome, evaluation.plan.config
    errors = f"{outcome.error_count} of {outcome.case_count} cases errored"
    rows = []
    for spec in outcome.specs:
        value = outcome.summary.get(spec.name)
        scored = outcome.scored.get(spec.name)
        rows.append([spec.name, fmt(value), spec.direction, scored.words() if scored is not None else "run"])
    print(table(["metric", "value", "better", "scored"], rows, "lrll"))
    unscored = [spec.name for spec in outcome.specs if outcome.summary.get(spec.name) is None]
    if unscored:
        print(f"— means no value: no case has a score for {', '.join(unscored)} (see 'scored')")
    if outcome.conversations is not None:
        for line in conversation_lines(outcome.conversations):
            print(line)
    print()
    missed = missed_lines(evaluation)
    if missed:
        for line in missed:
            print(line)
        print()
    for stage, figures in outcome.timings.items():
        p50, p95 = duration(figures["p50_seconds"]), duration(figures["p95_seconds"])
        print(f"stage {terminal(stage):10} p50 {p50:>10}  p95 {p95:>10}")
    if outcome.timings:
        print()
    shown = terminal(mask_url(outcome.tracking_uri))
    print(f"run {outcome.run_id}  experiment {terminal(outcome.experiment)}  ({shown})")
    print(
        f"config {outcome.config_hash[:12]}  dataset {terminal(config.dataset.name)} "
        f"({outcome.case_count} cases, {outcome.dataset_hash[:12]})  provider {terminal(config.provider.name)}  "
        f"k={config.k}  {errors}"
    )
    for line in trust_lines(outcome.trust, config.calibration.threshold, evaluation.plan.findings, outcome.labels_note):
        print(line)


def conversation_lines(chats: Any, shown: int = 5) -> list[str]:
    """A run's conversations: the headline, results by turn position, then the conversations not
    every turn of which was correct (the first few; ``--json``'s ``by_conversation`` has them all)."""
    lines = [chats.line()]
    if chats.positions:
        names = [name for name in headline_metrics() if name in chats.positions[0].means]
        rows = [
            [str(p.turn), str(p.cases), str(p.correct), str(p.errored), *(fmt(p.means[n]) for n in names)]
            for p in chats.positions
        ]
        lines += [
            "by turn position:",
            table(["turn", "turns", "correct", "errored", *names], rows, "rrrr" + "r" * len(names)),
        ]
    wrong = [row for row in chats.rows if row.all_correct is not True]
    if wrong:
        said = [
            f"{terminal(row.conversation)} (turn {row.errored_turn} errored)"
            if row.errored_turn is not None
            else f"{terminal(row.conversation)} (first wrong turn {row.first_failed_turn} of {row.turns})"
            for row in wrong[:shown]
        ]
        more = f", and {len(wrong) - shown} more (--json: by_conversation)" if len(wrong) > shown else ""
        lines.append(f"by conversation, not every turn correct: {', '.join(said)}{more}")
    return lines


SYSTEMS: dict[str, Callable[[Any], str]] = {
    "sample": lambda system: "the bundled sample RAG system (BM25, a reranker, an extractive answer), in-process",
    "fake": lambda system: "outputs built from the dataset's own labels (they prove the chain, not a system)",
    "replay": lambda system: "the outputs recorded in the dataset (no system was called)",
    "http": lambda system: f"the HTTP service at {mask_url(system.url or '?')}",
    "python": lambda system: f"the Python target {system.target}, in-process",
}
"""What ``provider.system.kind`` evaluated, in words, for the lines after a run's tables."""

KNOB = "provider.system.sample.chunking"
"""The knob worth changing for a first candidate of the sample system (other systems: your own change)."""


def candidate_overrides(config: Any, overrides: Sequence[str]) -> list[str] | None:
    """The run's own overrides with the sample system's chunking changed (to ``sentence``, or to
    ``doc`` when it is ``sentence`` already); None for a system whose change is the user's own."""
    if config.provider.system.kind != "sample":
        return None
    current = config.provider.system.sample.chunking if config.provider.system.sample else "doc"
    kept = [word for word in overrides if word.lstrip("+~").split("=", 1)[0] not in (KNOB, "tracking.uri")]
    return [*kept, f"{KNOB}={'doc' if current == 'sentence' else 'sentence'}"]


def show_next(evaluation: Evaluation, overrides: Sequence[str], tracking_uri: str | None) -> None:
    """After a run's tables: what was evaluated, what the numbers mean, and the next commands, each
    runnable as printed: this environment's programs, the run's own overrides, the store the user
    named and, for a run with a comparable earlier run of another config, the comparison of the two."""
    from ragexp.compare.select import previous_run_id

    outcome, config = evaluation.outcome, evaluation.plan.config
    previous = previous_run_id(outcome.tracking_uri, outcome.run_id)
    store = store_words(overrides, tracking_uri)
    system = config.provider.system
    run_id = outcome.run_id
    print(f"\nevaluated: {terminal(SYSTEMS[system.kind](system))},")
    print(f"  on {terminal(config.dataset.name)} ({outcome.case_count} cases), the top {config.k} retrieved ids scored")
    print("the numbers: scores from 0 to 1, each the mean over the cases 'scored' counts ('better': which way is")
    print("  good); p95_seconds (seconds) and error_rate are figures of the whole run; an errored case is counted,")
    print("  never scored 0; docs/metrics.md defines each metric")
    ragexp, at = program("ragexp"), [shlex.quote(word) for word in store]
    steps: list[tuple[str, str]] = []
    if previous is not None:
        steps += [
            (_words(ragexp, "diff", previous, run_id, *at), f"what changed since run {previous[:8]}, per metric, case"),
            (
                _words(ragexp, "gate", "--baseline", previous, "--candidate", run_id, *at),
                "the release rules: exit 0 passed, 2 failed",
            ),
            (
                _words(ragexp, "report", run_id, "--baseline", previous, "--out", "report", "--language", "en", *at),
                "a report with plots, in report/",
            ),
        ]
    candidate = candidate_overrides(config, overrides)
    if candidate is not None:
        what = "another candidate" if previous else "a candidate run: one knob changed"
        steps.append((_words(ragexp, "run", *map(shlex.quote, candidate), *at), what))
    if previous is None:
        steps.append(
            (_words(ragexp, "gate", "--baseline", run_id, *at), "then: the release rules on the newest run after it")
        )
    uri = shlex.quote(mask_url(outcome.tracking_uri))
    steps.append((_words(program("mlflow"), "ui", "--backend-store-uri", uri), "every run and case"))
    print("next (each line runs as printed; '#' lines say what it does):")
    if candidate is None:
        print("  # a candidate: change your system, then run this command again with the same overrides")
    for command, what in steps:
        print(terminal(f"  # {what}"))
        print(terminal(f"  {command}"))


def store_words(overrides: Sequence[str], tracking_uri: str | None) -> list[str]:
    """The store the user named (``--tracking-uri`` or ``tracking.uri=``), as the other commands take it."""
    named = [word.split("=", 1)[1] for word in overrides if word.lstrip("+~").startswith("tracking.uri=")]
    chosen = tracking_uri or (named[-1] if named else None)
    return ["--tracking-uri", chosen] if chosen else []


def _words(*words: str) -> str:
    return " ".join(word for word in words if word)


def program(name: str) -> str:
    """A command of this environment as the user can type it here: its bare name when the shell
    finds this very one on PATH, else its path (relative when under the working folder)."""
    here = Path(sys.executable).parent / name
    if not here.exists():
        return name
    found = shutil.which(name)
    if found is not None and Path(found).resolve() == here.resolve():
        return name
    try:
        shown = str(here.absolute().relative_to(Path.cwd()))
    except ValueError:
        return str(here.absolute())
    return shown if "/" in shown else f"./{shown}"


def missed_lines(evaluation: Evaluation) -> list[str]:
    """The :data:`ragexp.metrics.missed.MISSED_SHOWN` worst cases scored below full marks, worst first: each metric
    it missed, what the case expected and what came back; then how many more, and where they all are."""
    missed = evaluation.outcome.missed
    if not missed.count:
        return []
    lines = [
        f"cases it missed: {missed.count} of {evaluation.outcome.case_count} (a score below full marks), worst first"
    ]
    for case in missed.first:
        scores = ", ".join(f"{name} {fmt(value)}" for name, value in case.metrics.items())
        lines.append(terminal(f"  {case.case_id}: {scores}"))
        for what, value in case.expected.items():
            lines.append(terminal(f"    expected  {what}: {_short(value)}"))
        for what, value in case.got.items():
            lines.append(terminal(f"    came back {what}: {_short(value)}"))
    rest = missed.count - len(missed.first)
    if rest:
        where = cases_file(evaluation.outcome.tracking_uri, evaluation.outcome.run_id)
        lines.append(terminal(f"  ... and {rest} more; every case's scores: {where}"))
    return lines


def cases_file(tracking_uri: str, run_id: str) -> str:
    """Where a run's ``cases.jsonl`` can be read: its path in a local store's artifacts, else the
    command that downloads it."""
    from ragexp.tracking.store import run_artifact_path

    local = run_artifact_path(tracking_uri, run_id, "cases.jsonl")
    if local is not None:
        try:
            return str(local.relative_to(Path.cwd()))
        except ValueError:
            return str(local)
    uri = shlex.quote(mask_url(tracking_uri))
    return f"MLFLOW_TRACKING_URI={uri} {program('mlflow')} artifacts download -r {run_id} -a cases.jsonl"


def _short(value: Any, limit: int = 100) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    text = text.replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 1] + "…"


def show_sweep(outcome: SweepOutcome) -> None:
    headline = headline_metrics()
    shown = [name for name in headline if any(name in r.metrics for r in outcome.runs)]
    varying, common = varying_overrides([r.tag("sweep.point") for r in outcome.runs])
    if common:
        print(f"every point: {' '.join(map(shown_override, common))}")
    rows = [
        [r.tag("sweep.num"), " ".join(map(shown_override, override_words(point))), r.run_id]
        + [fmt(r.metrics.get(n)) for n in shown]
        for r, point in zip(outcome.runs, varying, strict=True)
    ]
    print(table(["#", "point", "run", *shown], rows, "lll" + "r" * len(shown)))
    if any(r.metrics.get(n) is None for r in outcome.runs for n in shown):
        print(
            "— means no value: that point's run logged none for the metric (not in its metric set, or no case scored)"
        )
    print(f"\nsweep {outcome.parent}: {len(outcome.runs)} runs, {len(outcome.failures)} failed points")


def sweep_json(outcome: SweepOutcome) -> dict[str, Any]:
    headline = headline_metrics()
    return {
        "sweep": outcome.parent,
        "runs": [
            {
                "run_id": r.run_id,
                "point": r.tag("sweep.point"),
                "config_hash": r.tag("config_hash"),
                "status": r.status,
                "metrics": {k: v for k, v in r.metrics.items() if k in headline},
            }
            for r in outcome.runs
        ],
        "failed": outcome.failures,
    }


def show_validation(summary: dict[str, Any], findings: Sequence[Any] | None) -> None:
    print(
        f"ok: {terminal(summary['path'])}: {summary['case_count']} cases ({summary['unanswerable']} unanswerable), "
        f"format {summary['format']}, dataset hash {summary['dataset_hash'][:12]}"
    )
    print(f"labels: {terminal(', '.join(summary['label_fields']))}")
    print(f"recorded outputs: {terminal(', '.join(summary['output_fields']) or 'none')}")
    print(f"runs log to: {terminal(summary['tracking_uri'])}")
    if summary["human_labels"]:
        counts = ", ".join(f"{name} {count}" for name, count in summary["human_labels"].items())
        print(f"human scores: {terminal(counts)}")
    if "evidence" in summary:
        evidence = summary["evidence"]
        against = evidence["checked_against"]
        checked = f"checked against {terminal(against)}" if against else "not checked: no corpus"
        spans = f"{evidence['spans']} spans in {evidence['cases']} cases ({evidence['offsets']} as offsets)"
        print(f"evidence: {spans}, {checked}")
    if findings is not None:
        print(f"label audit against {terminal(summary['corpus'])}: {len(findings)} finding(s)")
        for finding in findings:
            print(f"  warning: {terminal(finding)}")
    if "probe" in summary:
        show_probe(summary["probe"])


def _with_run(label: str, run_id: str) -> str:
    """A point's label and its run, the run named once (a baseline outside the sweep is labelled by it)."""
    return label if run_id in label else f"{label} (run {run_id})"


def show_anchored(anchored: Any) -> None:
    """``validate --anchor``'s line: where the evidence went and what it is made of."""
    print(
        f"wrote {terminal(str(anchored.out))}: {anchored.anchored} of {anchored.cases} cases anchored to documents; "
        f"{anchored.spans_from_facts} spans are the sentences holding their facts, "
        f"{anchored.spans_whole_chunk} whole {'chunk' if anchored.spans_whole_chunk == 1 else 'chunks'}"
    )


def show_probe(report: dict[str, Any]) -> None:
    sent = report.get("params" if report.get("method") == "GET" else "body")
    print(terminal(f"probe: case {report['case_id']}: {report['method']} {report['url']}"))
    print(terminal(f"  sent: {json.dumps(sent, ensure_ascii=False)}"))
    if "status" in report:
        print(
            f"  reply: HTTP {report['status']} in {report['seconds']:g} s, {report['bytes']:,} bytes "
            f"({report['content_type'] or 'no content type'})"
        )
    elif "raw" in report:
        print(f"  returned in {report['seconds']:g} s, as plain data:")
    if "raw" in report:
        for line in str(report["raw"]).splitlines() or [""]:
            print(f"  | {terminal(line)}")
    missing = report.get("missing", {})
    for key, value in report.get("extracted", {}).items():
        if key in missing:
            found = "nothing found" if value is None else json.dumps(value, ensure_ascii=False)
            print(terminal(f"  {key} -> {found}  <- found nothing: {missing[key]}"))
        else:
            print(terminal(f"  {key} -> {json.dumps(value, ensure_ascii=False)}"))
    if report.get("error"):
        print(terminal(f"  error: {report['error']}"))
    elif report.get("output") is not None:
        print(terminal(f"  output: {json.dumps(report['output'], ensure_ascii=False)}"))


def show_runs(items: Sequence[dict[str, Any]], *, with_experiment: bool = False) -> None:
    """One row per run; ``with_experiment``: the runs come from several experiments."""
    headline = headline_metrics()
    shown = [name for name in headline if any(name in item["metrics"] for item in items)]
    # A run's role only when some listed run has one (the cells of diff --attribute).
    roles = any(item.get("role") for item in items)
    rows = [
        [
            item["run_id"],
            *([role_words(item.get("role")) or "run"] if roles else []),
            *([item["experiment"]] if with_experiment else []),
            item["start_time"].replace("T", " "),
            item["status"].lower(),
            item["config_hash"][:12],
            item["dataset"],
            item["provider"],
            item["k"],
            *(fmt(item["metrics"].get(name)) for name in shown),
            f"{item['error_count']}/{item['case_count']}",
        ]
        for item in items
    ]
    print(
        table(
            [
                "run",
                *(["role"] if roles else []),
                *(["experiment"] if with_experiment else []),
                "started",
                "status",
                "config",
                "dataset",
                "provider",
                "k",
                *shown,
                "errors",
            ],
            rows,
            "l" * (7 + with_experiment + roles) + "r" * len(shown) + "r",
        )
    )
    if any(item["metrics"].get(name) is None for item in items for name in shown):
        print("— means no value: the run logged none for the metric (not in its metric set, or no case scored)")


def diff_json(result: DiffResult) -> dict[str, Any]:
    """``diff --json``: the comparison, with ``by_turn`` when the runs hold conversations."""
    turns = by_turn(result.baseline, result.candidate, headline_metrics())
    return {**result.to_json(), **({"by_turn": [row.to_json() for row in turns]} if turns else {})}


def show_diff(result: DiffResult) -> None:
    base, cand = result.baseline, result.candidate
    print(f"baseline {base.run_id}  candidate {cand.run_id}  ({population(base)})")
    if result.ledger is not None:
        print(ledger_line(result.ledger, "en"))
    if result.differences:
        info(f"warning: compared although not comparable: {'; '.join(result.differences)}")
    print(to_terminal(metric_table(result, "en")))
    for m in result.metrics:
        if m.not_comparable is not None:
            print(terminal(f"note: {m.name} is not compared: {m.not_comparable}"))
    legend(metric_legend(result))
    print_diff_power(result)
    _show_breakdowns(result)
    if result.diagnosis:
        print("\nlikely stage (a heuristic, from the decision table; --attribute measures it):")
        for hint in result.diagnosis:
            print(f"  - {terminal(hint.text())}")
    if result.attribution is not None:
        show_attribution(result.attribution)
    if result.cases:
        _show_regressed_cases(result)


def _show_breakdowns(result: DiffResult) -> None:
    """``diff``'s figures beside the metric table: prediction-powered deltas, hops, turn positions."""
    with_ppi = [(m.name, m.ppi) for m in result.metrics if m.ppi is not None]
    if with_ppi:
        by = scorer([name for name, _ in with_ppi])
        print(f"\nprediction-powered difference ({by} scores corrected by human scores on shared labelled cases):")
        for name, ppi in with_ppi:
            print(
                f"  {terminal(name):22} {signed(ppi.mean)}  CI [{signed(ppi.ci_low)}, {signed(ppi.ci_high)}]  "
                f"{by} alone {signed(ppi.judge_mean)}  ({ppi.n_labelled} labelled of {ppi.n_total} pairs)"
            )
    if result.hops is not None:
        print(f"\nfirst failing hop, cases by baseline (rows) and candidate (columns), {result.hops.paired} paired:")
        for line in result.hops.lines():
            print(f"  {line}")
    turns = by_turn(result.baseline, result.candidate, headline_metrics())
    if turns:
        print("\nby turn position (means over the turns both runs scored at that position):")
        headers, rows = turn_table(turns, headline_metrics(), ("turn", "pairs"))
        print(table(headers, rows, "r" + "l" * (len(headers) - 2) + "r"))


def _show_regressed_cases(result: DiffResult) -> None:
    """``diff``'s most regressed cases: what each run retrieved and answered, and why it scored so."""
    written = {run.record.tag("language") for run in (result.baseline, result.candidate)} - {""}
    reasons = written <= {"en"}  # this output is English: reasons in another language are not mixed in
    print(f"\nmost regressed cases (top {len(result.cases)}):")
    if not reasons:
        print(
            f"  (the runs wrote their reasons in {', '.join(sorted(written))}, report.language: "
            "`ragexp report --language` shows them; RAGEXP_LANGUAGE=en before a run writes them in English)"
        )
    for case in result.cases:
        changes = ", ".join(
            f"{name} {fmt(v['baseline'], 2)}->{fmt(v['candidate'], 2)}"
            for name, v in case["metrics"].items()
            if v["baseline"] != v["candidate"]
        )
        print(f"  {terminal(case['id'])}: {terminal(changes) or 'errored'}")
        for side in ("baseline", "candidate"):
            did = case[side]
            answer = (did["answer"] or "").replace("\n", " ")[:80]
            error = f"  error: {did['error']}" if did["error"] else ""
            print(terminal(f"    {side:9} retrieved {did['retrieved_ids'][:5]}  answer {answer!r}{error}"))
            for name, v in case["metrics"].items():
                said = did["rationale"].get(name)
                if reasons and said and v["baseline"] != v["candidate"]:
                    print(terminal(f"      {name}: {said}"))
    for line in case_legend(result.cases):
        print(f"  {line}")


def show_attribution(found: dict[str, Any]) -> None:
    """``diff --attribute``: per metric the total delta and its three parts with intervals, then
    the cases by cause and the cases whose attribution failed."""
    level = round(100 * float(found["confidence"]))
    print(f"\nattribution by replay ({found['replayed']} cases replayed; {level}% paired bootstrap intervals):")

    def part(row: dict[str, Any], key: str) -> str:
        if row[key] is None:
            return "—"
        low, high = row[f"{key}_ci"]
        return f"{signed(row[key])} [{signed(low)}, {signed(high)}]"

    print(f"  {'metric':22} {'cases':>5}  {'total':28} {'retrieval':28} {'generation':28} interaction")
    for row in found["metrics"]:
        note = "  (retrieval's by definition)" if row["by_definition"] else ""
        cells = "".join(f"{part(row, key):29}" for key in ("total", "retrieval", "generation"))
        print(terminal(f"  {row['name']:22} {row['cases']:>5}  {cells}{part(row, 'interaction')}{note}"))
    by_cause: dict[str, list[str]] = {}
    for case in found["cases"]:
        by_cause.setdefault(case["cause"], []).append(case["id"])
    for cause, ids in by_cause.items():
        shown = ", ".join(ids[:20]) + (f" (+{len(ids) - 20} more)" if len(ids) > 20 else "")
        print(terminal(f"  cause {cause} ({len(ids)}): {shown}"))
    for error in found["errors"][:20]:
        print(terminal(f"  error {error['id']}: {error['error']}"))
    if len(found["errors"]) > 20:
        print(f"  ... {len(found['errors']) - 20} more errors")


def population(run: RunData) -> str:
    """``35 cases``, or for a run of conversations ``12 conversations, 38 turns (paired by conversation)``."""
    if run.conversations is None:
        return f"{len(run.case_ids)} cases"
    chats = {conversation for conversation in run.conversations if conversation is not None}
    singles = run.conversations.count(None)
    turns = len(run.conversations) - singles
    alone = f", {singles} single question{'s' if singles > 1 else ''}" if singles else ""
    return f"{len(chats)} conversations, {turns} turns{alone} (paired by conversation)"


def legend(lines: Sequence[str]) -> None:
    """What each ``—`` of the table above means: a title line, then one indented line per reason."""
    if lines:
        print(lines[0])
        for line in lines[1:]:
            print(f"  {terminal(line)}")


def show_gate(outcome: GateOutcome) -> None:
    result, diff = outcome.result, outcome.diff
    verdict = "PASSED" if result.passed else "FAILED"
    print(f"gate {terminal(result.gates)}: {verdict}  ({len(result.failures)} of {result.checked} checks failed)")
    print(f"baseline {outcome.baseline}  candidate {outcome.candidate}")
    if diff.ledger is not None:
        print(ledger_line(diff.ledger, "en"))
    if diff.differences:
        info(f"warning: compared although not comparable: {'; '.join(diff.differences)}")
    if result.failures:
        print(to_terminal(failure_table(result, "en")))
        if any(None in (r.baseline, r.candidate) for r in result.failures):
            print(t("dash_run_value", "en"))
    for r in result.rules:
        if r.method == "prediction-powered" and r.passed:
            print(f"note: {terminal(r.message)}")
    print_gate_power(result)


def show_sequential(outcome: SequentialOutcome) -> None:
    """Where ``run --until-decided`` stopped, and each rule's anytime-valid bound."""
    saved = outcome.total - outcome.evaluated
    print(
        f"until decided: {outcome.decision} after {outcome.evaluated} of {outcome.total} cases "
        f"({saved} not evaluated), against baseline {outcome.baseline}"
    )
    for rule in outcome.rules:
        print(f"  {terminal(rule.message)}")
    print()


def gate_exit(outcome: GateOutcome) -> int:
    """Say what became of the promotion; the exit code: 0 passed, 2 failed, 1 promotion lost."""
    if outcome.tag and not outcome.result.passed:
        info(f"not promoted: the gate failed, so tag {outcome.tag} stays where it is")
    promotion = outcome.promotion
    if promotion is not None:
        for warning in promotion.warnings:
            info(f"warning: {warning}")
        if not promotion.promoted:
            info(f"ragexp: error: {promotion.message}")
            return 1
        info(promotion.message)
    return 0 if outcome.result.passed else 2


def report_line(run_id: str, published: Published) -> str:
    folder = published.folder
    return (
        f"report ({published.used}) written to {folder}/report.html and {folder}/report.md; logged to run {run_id} "
        "under report/"
    )


def run_warning(outcome: RunOutcome) -> None:
    """Errored cases are counted, never scored: say so before anything else."""
    if outcome.error_count:
        info(
            f"warning: {outcome.error_count} of {outcome.case_count} cases errored; their scores are missing, "
            "not zero (see cases.jsonl)"
        )


def print_gate_power(result: GateResult) -> None:
    """Per metric of the gate's rules, what the comparison can detect; then each underpowered rule."""
    seen: dict[str, str] = {}
    for rule in result.rules:
        if rule.power is not None and rule.metric not in seen:
            power = rule.power
            units = t(f"units_{power.unit}", "en")
            seen[rule.metric] = (
                f"{fmt(power.detectable)} with {power.n} {units}"
                if power.detectable is not None
                else f"{detectable_words(power)} ({power.n} here)"
            )
    if seen:
        print("detectable change (two-sided, 80% power):")
        for name, text in seen.items():
            print(f"  {name:22} {text}")
    for rule in result.rules:
        line = rule.cannot_tell()
        if line:
            print(f"note: {rule.metric} {rule.rule} {rule.threshold:g}: {line}")


def print_diff_power(result: DiffResult) -> None:
    """The footnote saying what the 'detectable' column means."""
    if any(m.power is not None for m in result.metrics):
        print(
            f"\ndetectable: the smallest true change each paired comparison finds 4 times in 5 "
            f"(two-sided, {result.confidence:.0%} confidence); a smaller change may well be missed"
        )


def print_queue_link(url_of: Callable[[str | None], str | None], base: str | None, store_uri: str) -> None:
    """Where to open a review queue: its link on a known UI, else how to start one on this store."""
    url = url_of(base)
    if url:
        print(f"open: {url}")
    else:
        print(
            f"open: start the MLflow UI on this store (mlflow ui --backend-store-uri {mask_url(store_uri)}), then "
            f"{url_of('http://127.0.0.1:5000')}"
        )


def show_label_queue(queued: Queued) -> None:
    made = queued.made
    print(
        f"review queue '{made.queue}' ({made.queue_id}): {len(made.traces)} of {made.cases} traces of run "
        f"{made.run_id}, {made.kept} already labelled"
    )
    print(f"questions: {', '.join(made.schemas)}" + (f" (created: {', '.join(made.created)})" if made.created else ""))
    print_queue_link(made.url, queued.base, queued.store_uri)
    print(f"then: ragexp calibrate {made.run_id}")


def show_calibration(calibrated: Calibrated) -> None:
    run_id, labels = calibrated.run_id, calibrated.labels
    labelled = ", ".join(f"{name} {n}" for name, n in labels.counts().items()) or "none"
    print(f"run {run_id}: labelled cases {labelled} ({labels.carried} carried over from identical outputs)")
    for c in calibrated.coverage:
        state = "calibrated" if c.enough else f"not calibrated: {c.needed - c.labelled} more needed"
        print(
            f"  {terminal(c.metric)}: {c.labelled} labelled, scored cases; calibration needs {c.needed} "
            f"(calibration.min_labelled): {state}"
        )
    for line in trust_lines(calibrated.trust, calibrated.threshold, None):
        print(line)
    if calibrated.disagreements:
        print(
            f"\npeople and the automatic score disagree on {len(calibrated.disagreements)} labelled cases "
            f"(pass at >= {calibrated.threshold:g}):"
        )
        rows = [[d.case_id, d.metric, fmt(d.human, 2), fmt(d.automatic, 2)] for d in calibrated.disagreements]
        print(table(["case", "metric", "human", "automatic"], rows, "llrr"))
    elif calibrated.coverage:
        print(f"\npeople and the automatic score agree on every labelled case (pass at >= {calibrated.threshold:g})")
    if not calibrated.logged:
        print("not calibrated: fewer labelled, scored cases than calibration.min_labelled for every metric")
    else:
        print(f"logged on run {run_id}: {len(calibrated.logged)} calibration.* and ppi.* metrics")


def show_power(found: BaselinePower) -> None:
    run, effect, confidence = found.baseline, found.effect, found.confidence
    print(f"baseline {run.run_id}  ({population(run)})")
    units = t(f"units_{run.unit}", "en")
    headers = ["metric", units, "sd of difference", "detectable"]
    if effect is not None:
        headers.append(f"{units} for {effect:g}")
    rows = []
    for p in found.plans:
        row = [p.metric, str(p.n), fmt(p.sd), fmt(p.detectable)]
        if effect is not None:
            row.append(f"{p.needed:,}" if p.needed is not None else "not reachable")
        rows.append(row)
    print(table(headers, rows, "lrrr" + "r" * (effect is not None)))
    missing = [(p.metric, reason) for p in found.plans for reason in dict.fromkeys(p.why.values())]
    if missing:
        print("\nwhy a figure is missing (— or not reachable):")
        for metric, reason in missing:
            print(f"  {terminal(metric)}: {reason}")
    print(
        f"\ntwo-sided, {confidence:.0%} confidence, {POWER:.0%} power; assumed: {POWER_ASSUMPTION} "
        f"and a correlation of {found.correlation:g} with it"
    )


def show_drafted(drafted: DraftedSet) -> None:
    """What a draft kept and dropped, and (when it wrote the file) that people screen it next."""
    for line in drafted.summary.lines():
        print(line)
    if drafted.written:
        print(f"wrote {drafted.out}: screen it (set draft.status to 'screened', or drop the case) before it counts")


def show_draft_review(queued: InReview) -> None:
    made = queued.made
    print(
        f"review queue '{made.queue}' ({made.queue_id}): {made.traces} drafted cases of {queued.path}"
        + (f", {made.passed_through} already screened or not drafted left as they are" if made.passed_through else "")
    )
    print_queue_link(made.url, queued.base, queued.store_uri)
    print(f"then: ragexp draft accept '{made.queue}' --out screened.jsonl")


def show_accepted(out: Path, result: Accepted) -> None:
    print(
        f"{result.accepted} accepted, {len(result.rejected)} rejected (dropped), {result.pending} not reviewed yet; "
        f"wrote {len(result.cases)} cases to {out}"
    )
    if result.pending:
        print(
            f"the {result.pending} not reviewed stay draft.status 'draft' (ragexp run refuses them): review them "
            f"and run this again, or drop them from {out}"
        )


STATUS_WORDS = {
    "front": "on the front",
    "dominated": "dominated (with confidence)",
    "indistinguishable": "not distinguishable from the front",
}


def show_sweep_points(analysis: SweepAnalysis) -> None:
    """``ragexp sweep``: one row per point, its deltas from the baseline, latency, cost, status."""
    from ragexp.compare.sweeps import delta_cells

    shown = [name for name in analysis.objectives[1:]]
    rows = []
    for point in analysis.points:
        rows.append(
            [
                str(point.number) if point.number >= 0 else "-",
                point.shown or point.run_id,
                fmt(point.metrics.get(analysis.metric)),
                *delta_cells(analysis, point, on_baseline="baseline"),
                *(fmt(point.metrics.get(name)) for name in shown),
                f"{int(point.run.errored.sum())}/{len(point.run.case_ids)}",
                STATUS_WORDS[point.status],
            ]
        )
    headers = ["point", "overrides", analysis.metric, *(f"Δ {name}" for name in analysis.quality), *shown]
    print(table([*headers, "errored", "pareto"], rows))
    print(
        terminal(
            f"Δ: against the baseline {_with_run(analysis.baseline.label, analysis.baseline.run_id)}; intervals hold "
            f"together at {analysis.confidence:.0%} over {analysis.tests} comparisons (Bonferroni, each at "
            f"{analysis.level:.2%}); * significant after Holm's adjustment over the same comparisons"
        )
    )
    for name, why in analysis.left_out.items():
        print(terminal(f"{name}: left out of the front: {why}"))
    front = ", ".join(point.label for point in analysis.front)
    print(terminal(f"front over {' x '.join(analysis.objectives)}: {front}"))
    print(terminal(f"recommendation: {analysis.recommendation.text()}"))
    confirm = analysis.confirm
    if confirm is None:
        return
    held = len(confirm.held_out)
    print(terminal(f"chosen on {confirm.chosen_on} cases; {held} held out (--confirm {confirm.fraction:g})"))
    if confirm.gate is None:
        print(terminal(f"confirm: {confirm.skipped}"))
        return
    verdict = "passed" if confirm.gate.passed else "FAILED"
    print(terminal(f"confirm run {confirm.run_id} on the {held} held-out cases: gate {confirm.gate.gates} {verdict}"))
    for failure in confirm.gate.failures:
        print(terminal(f"  {failure.message}"))


def show_ledger(found: VersionDiff, *, listed: int = 20) -> None:
    """``ragexp datasets diff``: the counts, then the ids of each kind (the first ``listed``)."""
    ledger = found.ledger
    print(f"old {terminal(found.old)}")
    print(f"new {terminal(found.new)}")
    print(terminal(ledger.words()))
    for kind, ids in (("added", ledger.added), ("removed", ledger.removed)):
        for case_id in ids[:listed]:
            print(f"  {kind:<9} {terminal(case_id)}")
        if len(ids) > listed:
            print(f"  {kind:<9} ... {len(ids) - listed} more (--json lists every id)")
    changed = list(ledger.changed.items())
    for case_id, parts in changed[:listed]:
        print(f"  {'changed':<9} {terminal(case_id)}: {', '.join(parts)}")
    if len(changed) > listed:
        print(f"  {'changed':<9} ... {len(changed) - listed} more (--json lists every id)")


UNREADABLE_SHOWN = 10
"""Unreadable traces ``ragexp shadow`` lists on the terminal; ``traffic.json`` lists every one."""


def show_shadow(outcome: ShadowOutcome) -> None:
    """``ragexp shadow``: the two runs, then each metric overall and per stratum, worst first."""
    traffic = outcome.traffic
    print(traffic.describe())
    for item in traffic.unreadable[:UNREADABLE_SHOWN]:
        print(f"  unreadable: {terminal(item.trace_id)}: {terminal(item.reason)}")
    if len(traffic.unreadable) > UNREADABLE_SHOWN:
        print(f"  ... {len(traffic.unreadable) - UNREADABLE_SHOWN} more in traffic.json")
    print(f"production run {outcome.production.run_id}, candidate run {outcome.candidate.run_id}")
    print(f"  experiment {terminal(outcome.experiment)}")
    for metric in outcome.metrics:
        rows = []
        for row in [metric.overall, *metric.strata]:
            stats = row.stats
            rows.append(
                [
                    row.stratum,
                    str(stats.n if stats else 0),
                    fmt(row.baseline),
                    fmt(row.candidate),
                    signed(stats.delta) if stats else "—",
                    f"[{signed(stats.ci_low)}, {signed(stats.ci_high)}]" if stats else "—",
                    fmt(row.p_holm) if row.p_holm is not None else "",
                    "regressed" if row.regressed else "",
                ]
            )
        print()
        print(f"{terminal(metric.name)} (higher is better)" if metric.direction == "higher" else terminal(metric.name))
        headers = ["stratum", "paired", "production", "candidate", "delta", "interval", "p (Holm)", ""]
        print(table(headers, rows, "lrrrrrrl"))
    worst = outcome.worst
    print()
    print(f"largest credible regression: stratum {terminal(worst)}" if worst else "no stratum credibly regressed")
    base, cand = outcome.production.run_id, outcome.candidate.run_id
    print(f"next: ragexp diff {base} {cand}; ragexp gate --baseline {base} --candidate {cand}")
