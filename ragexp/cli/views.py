"""What each command prints for people (``--json`` prints the library's ``to_json`` instead): here
``ragexp run`` and what to try next; the comparing commands in ``views_compare``, sweeps in
``views_sweep``, the dataset commands in ``views_validate``, ``shadow`` in ``views_shadow``, labels
and drafts in ``views_people``.

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

from ragexp.cli.render import duration, fmt, table, terminal, trust_lines
from ragexp.metrics.registry import headline_metrics
from ragexp.outputs import info
from ragexp.secrets import mask_url

if TYPE_CHECKING:
    from ragexp.workflows.report import Published
    from ragexp.workflows.run import Evaluation, RunOutcome
    from ragexp.workflows.sequential import SequentialOutcome

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
    from ragexp.artifacts import CASES
    from ragexp.tracking.store import run_artifact_path

    local = run_artifact_path(tracking_uri, run_id, CASES)
    if local is not None:
        try:
            return str(local.relative_to(Path.cwd()))
        except ValueError:
            return str(local)
    uri = shlex.quote(mask_url(tracking_uri))
    return f"MLFLOW_TRACKING_URI={uri} {program('mlflow')} artifacts download -r {run_id} -a {CASES}"


def _short(value: Any, limit: int = 100) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    text = text.replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 1] + "…"


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


def report_line(run_id: str, published: Published) -> str:
    folder = published.folder
    logged = f"logged to run {run_id} under report/"
    if published.not_logged is not None:  # one line: where it is, and why it is not in the run
        logged = f"not logged to run {run_id} ({published.not_logged})"
    return f"report ({published.used}) written to {folder}/report.html and {folder}/report.md; {logged}"


def run_warning(outcome: RunOutcome) -> None:
    """Errored cases are counted, never scored: say so before anything else."""
    if outcome.error_count:
        info(
            f"warning: {outcome.error_count} of {outcome.case_count} cases errored; their scores are missing, "
            "not zero (see cases.jsonl)"
        )
