"""The ``ragexp demo`` workflow: the whole loop on the bundled sample system, in a fresh store of its own.

baseline run -> candidate run (one knob changed) -> ``diff`` -> ``gate`` (fails, on purpose) ->
``report``, then where to look in the MLflow UI. Each step (:data:`STEPS`) calls the library
function of the real command, in this process (MLflow is imported once); a :class:`DemoView`
(the CLI's, :mod:`ragexp.cli.demo`) shows the line a user would type and what the command prints.
What the demo says about the results is built from those results (:func:`narrate`), never
written in advance.
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol
from urllib.parse import quote

from ragexp.compare.changes import case_changes
from ragexp.compare.diff import DiffResult
from ragexp.compare.figures import fmt, threshold
from ragexp.errors import ConfigError
from ragexp.tracking.store import Store
from ragexp.workflows.diff import DiffOutcome, compare_runs
from ragexp.workflows.gate import GateOutcome, run_gate
from ragexp.workflows.report import Published, publish_report
from ragexp.workflows.run import Evaluation, run_config

EXPERIMENT = "ragexp-demo"
MARKER = ".ragexp-demo"
"""Written into the demo folder: a folder holding it may be wiped and reused by the next demo."""
SYSTEM = ["provider=sample", "dataset=kb_zh", "metrics=offline", "k=5"]
KNOB = "provider.system.sample.chunking=sentence"
GATE = ["gates=release", "~gates.rules.p95_seconds"]
"""The release gate without its P95 rule: in-process, a case takes a fraction of a millisecond,
and a 20% rule on that measures the machine's scheduler, not the system."""
BASELINE_NAME = "baseline: sample as shipped"
CANDIDATE_NAME = "candidate: chunking=sentence"
"""The runs' names: they differ in their first characters, which is all the UI's run lists show."""
UI_PORT = 5000


def prepare(folder: Path) -> Path:
    """An empty folder for the demo's store; a previous demo's folder is emptied, anything else refused."""
    if folder.exists():
        if not folder.is_dir():
            raise ConfigError(f"--store {folder}: exists and is not a folder")
        if any(folder.iterdir()):
            if not (folder / MARKER).exists():
                raise ConfigError(
                    f"--store {folder}: folder is not empty and was not made by ragexp demo; choose another folder"
                )
            shutil.rmtree(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / MARKER).write_text("made by `ragexp demo`; the next demo empties this folder\n", encoding="utf-8")
    return folder


def shown(path: Path) -> str:
    """``path`` relative to the working directory when it is inside it, so commands stay short."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path.resolve())


@dataclass
class Demo:
    """What the steps share: where the store is, and what each step found."""

    folder: Path
    uri: str
    """The store's URI, absolute (what the library calls get)."""
    short: str
    """The same store as the printed commands name it (relative when inside the working directory)."""
    baseline_run: Evaluation | None = None
    candidate_run: Evaluation | None = None
    compared: DiffOutcome | None = None
    gated: GateOutcome | None = None
    report: Path | None = None
    published: Published | None = None

    @property
    def baseline(self) -> str:
        return "" if self.baseline_run is None else self.baseline_run.outcome.run_id

    @property
    def candidate(self) -> str:
        return "" if self.candidate_run is None else self.candidate_run.outcome.run_id

    @property
    def flag(self) -> list[str]:
        return ["--tracking-uri", self.short]

    def common(self, uri: str) -> list[str]:
        return [f"tracking.uri={uri}", f"experiment={EXPERIMENT}", *SYSTEM]


@dataclass(frozen=True)
class Step:
    """One step of the demo: its name, a title, the command a user would type, and what it does here."""

    name: str
    title: str
    command: Callable[[Demo], list[str]]
    act: Callable[[Demo, Callable[[str], None]], None]
    """Does the step's work and keeps what it found on the :class:`Demo`; the callable is ``say``."""


class DemoView(Protocol):
    """What shows the demo (the CLI's :mod:`ragexp.cli.demo`)."""

    def say(self, line: str) -> None:
        """A line of progress (stderr)."""

    def begin(self, demo: Demo) -> None:
        """Before the first step."""

    def before(self, number: int, step: Step, demo: Demo) -> None:
        """Before step ``number`` (from 1) of :data:`STEPS`."""

    def after(self, step: Step, demo: Demo) -> None:
        """After the step: what its command would print."""

    def end(self, demo: Demo, experiment_id: str | None, seconds: float) -> None:
        """After the last step: where to look."""


def _baseline(demo: Demo, say: Callable[[str], None]) -> None:
    demo.baseline_run = run_config(demo.common(demo.uri))


def _candidate(demo: Demo, say: Callable[[str], None]) -> None:
    demo.candidate_run = run_config([*demo.common(demo.uri), KNOB])
    store = Store(demo.uri)
    store.set_tags(demo.baseline, {"mlflow.runName": BASELINE_NAME})
    store.set_tags(demo.candidate, {"mlflow.runName": CANDIDATE_NAME})


def _diff(demo: Demo, say: Callable[[str], None]) -> None:
    demo.compared = compare_runs(demo.baseline, demo.candidate, top=5, tracking_uri=demo.uri, say=say, attribute=True)


def _gate(demo: Demo, say: Callable[[str], None]) -> None:
    demo.gated = run_gate(demo.baseline, overrides=GATE, candidate=demo.candidate, tracking_uri=demo.uri, say=say)


def _report(demo: Demo, say: Callable[[str], None]) -> None:
    demo.report = demo.folder / "report"
    demo.published = publish_report(
        demo.candidate, baseline=demo.baseline, out=str(demo.report), tracking_uri=demo.uri, say=say
    )


STEPS: list[Step] = [
    Step(
        "baseline",
        "baseline: the sample system as shipped (one chunk per document)",
        lambda d: ["ragexp", "run", *d.common(d.short)],
        _baseline,
    ),
    Step(
        "candidate",
        "candidate: one knob changed, one chunk per sentence",
        lambda d: ["ragexp", "run", *d.common(d.short), KNOB],
        _candidate,
    ),
    Step(
        "diff",
        "diff: per metric with paired confidence intervals, then the cases that got worse",
        lambda d: ["ragexp", "diff", d.baseline, d.candidate, "--top", "5", *d.flag],
        _diff,
    ),
    Step(
        "gate",
        "gate: the release rules (P95 left out, see below)",
        lambda d: ["ragexp", "gate", "--baseline", d.baseline, "--candidate", d.candidate, *GATE, *d.flag],
        _gate,
    ),
    Step(
        "report",
        "report: Markdown and HTML with plots, also logged to the candidate run",
        lambda d: [
            "ragexp",
            "report",
            d.candidate,
            "--baseline",
            d.baseline,
            "--out",
            shown(d.folder / "report"),
            *d.flag,
        ],
        _report,
    ),
]
"""The demo, in order; a step reads what the steps before it found (:class:`Demo`)."""


def narrate(compared: DiffOutcome, gated: GateOutcome, code: int) -> list[str]:
    """What the diff and the gate above printed, in sentences built from their results (so the
    text follows the sample system when it changes)."""
    diff = compared.result
    lines = []
    if code == 2:
        failed = ", ".join(f"{r.metric} {r.rule} {threshold(r.threshold)}" for r in gated.result.failures)
        lines.append(
            f"exit 2: the gate FAILED, which is what this demo expects: {len(gated.result.failures)} of "
            f"{gated.result.checked} rules did not pass ({failed}). In CI, exit 2 stops the release."
        )
    else:
        lines.append(f"exit {code}: the demo expected the gate to fail (exit 2); the sample system has changed.")
    changes = case_changes(compared.baseline, compared.candidate)
    worse = [c.case_id for c in changes.worse]
    better = [c.case_id for c in changes.better]
    lines.append(
        f"What changed: {changes.worse_count} cases got worse ({', '.join(worse) or 'none'}) and "
        f"{changes.better_count} got better ({', '.join(better) or 'none'})."
    )
    empty = [c.case_id for c in changes.worse if c.baseline.retrieved_ids and not c.candidate.retrieved_ids]
    if empty:
        lines.append(f"Of the worse ones, {', '.join(empty)} now retrieve nothing at all.")
    down = [m for m in diff.metrics if m.moved() == "worse" and m.p_value is not None]
    if down:
        unconfirmed = sum(1 for m in down if m.significant is False)
        lines.append(
            f"diff: {len(down)} metrics got worse, {unconfirmed} of them not significantly with "
            f"{len(compared.baseline.case_ids)} cases ({'; '.join(m.evidence() for m in down)})."
        )
    for hint in diff.diagnosis:
        lines.append(f"likely stage: {hint.text()}.")
    strict = [r for r in gated.result.failures if r.rule == "max_drop" and _unconfirmed(diff, r.metric)]
    if strict:
        names = ", ".join(r.metric for r in strict)
        lines.append(
            f"The release rules fail any drop beyond their bound, confirmed or not ({names}); "
            "gates=release_stat fails only a drop the paired interval confirms."
        )
    for r in gated.result.failures:
        if r.rule == "min" and r.baseline is not None and r.threshold is not None and r.baseline < r.threshold:
            lines.append(
                f"{r.metric} misses its floor of {threshold(r.threshold)} in the baseline too ({fmt(r.baseline)})."
            )
    lines.append(
        "The P95 rule is left out here: in-process a case takes well under a millisecond, so a 20% rule "
        "would measure this machine's load, not the system; against a real service keep it."
    )
    return lines


def _unconfirmed(diff: DiffResult, metric: str) -> bool:
    found = diff.metric(metric)
    return found is not None and found.significant is False


def ui_lines(demo: Demo, experiment_id: str | None, port: int = UI_PORT) -> list[str]:
    """Where the two runs are in the MLflow UI: the command, a deep link per view, and the clicks
    that lead there (MLflow 3.17, checked in headless Chromium by tests/test_ui.py)."""
    mlflow = Path(sys.executable).parent / "mlflow"
    base = f"http://127.0.0.1:{port}"
    runs = quote(json.dumps([demo.candidate, demo.baseline], separators=(",", ":")), safe="[],")
    return [
        f"  {shown(mlflow) if mlflow.exists() else 'mlflow'} ui --backend-store-uri {demo.short} --port {port}",
        "  Per case, both runs side by side (every case is a trace with one assessment per metric):",
        f"    {base}/#/experiments/{experiment_id}/evaluation-runs?selectedRunUuid={demo.candidate}"
        f"&compareToRunUuid={demo.baseline}",
        f"    or click: Experiments -> {EXPERIMENT} -> Evaluation runs (left menu) -> tick the candidate, then",
        "    the baseline (the one ticked first is shown against the other) -> Actions -> Compare. One row per",
        "    case with both runs' traces, each metric's AVG and delta; Columns adds the other metrics; a row",
        "    opens the case's retrieved documents and stage spans (docs/traces.md).",
        "  Params and metrics side by side:",
        f"    {base}/#/compare-runs?runs={runs}&experiments=[%22{experiment_id}%22]",
        "    or click: Model training (top left) -> Runs -> tick the candidate and the baseline -> Compare.",
        "    The one parameter that differs, provider.system.sample.chunking, is preselected; Run details",
        "    lists every metric.",
        "  Each run's Artifacts hold cases.jsonl, the cases table and, on the candidate, the report.",
    ]


def run_demo(folder: Path, view: DemoView) -> Demo:
    """Run :data:`STEPS` in a fresh store under ``folder`` (:func:`prepare`), shown by ``view``."""
    started = time.perf_counter()
    folder = prepare(folder)
    db = folder / "mlflow.db"
    demo = Demo(folder, f"sqlite:///{db.resolve()}", f"sqlite:///{shown(db)}")
    view.begin(demo)
    for number, step in enumerate(STEPS, 1):
        view.before(number, step, demo)
        step.act(demo, view.say)
        view.after(step, demo)
    experiment_id = Store(demo.uri).experiment_id(EXPERIMENT, create=False)
    view.end(demo, experiment_id, time.perf_counter() - started)
    return demo
