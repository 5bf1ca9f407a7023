"""What the comparing commands print for people: ``runs``, ``diff`` (and its attribution), ``gate``
and ``power``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ragexp.cli.render import fmt, scorer, signed, table, terminal, to_terminal
from ragexp.cli.views_shadow import show_strata
from ragexp.compare.missing import case_legend, metric_legend
from ragexp.compare.power import POWER, POWER_ASSUMPTION, detectable_words
from ragexp.compare.summary import ledger_line
from ragexp.compare.tables import failure_table, metric_table
from ragexp.compare.turns import by_turn, turn_table
from ragexp.metrics.registry import headline_metrics
from ragexp.outputs import info
from ragexp.phrases import t
from ragexp.workflows.runs import role_words

if TYPE_CHECKING:
    from ragexp.compare.data import RunData
    from ragexp.compare.diff import DiffResult
    from ragexp.compare.gate import GateResult
    from ragexp.workflows.gate import GateOutcome
    from ragexp.workflows.power import BaselinePower


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
    if result.strata is not None:
        print("\nshadow pair by stratum:")
        show_strata(result.strata, ("baseline", "candidate"))
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
    # This output is English: a reason is shown rendered in English from its code, or as recorded
    # by a run written in English; a recorded reason in another language is not mixed in.
    runs = (("baseline", result.baseline), ("candidate", result.candidate))
    language = {side: run.record.tag("language") for side, run in runs}
    hidden = sorted(
        {language[side] for case in result.cases for side in language if case[side]["rationale_recorded"]} - {"en", ""}
    )
    print(f"\nmost regressed cases (top {len(result.cases)}):")
    if hidden:
        print(
            f"  (reasons recorded in {', '.join(hidden)} by runs made before reasons kept their codes are not shown: "
            "`ragexp report --language` shows them as recorded)"
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
                english = name not in did["rationale_recorded"] or language[side] in ("en", "")
                if english and said and v["baseline"] != v["candidate"]:
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
