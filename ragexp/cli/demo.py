"""What ``ragexp demo`` prints: the workflow (:mod:`ragexp.workflows.demo`) through the CLI's own views,
each step's output exactly as its command prints it, preceded by the line a user would type."""

from __future__ import annotations

import shlex
from collections.abc import Callable

from ragexp.cli.render import terminal
from ragexp.cli.views import report_line, run_warning, show_run
from ragexp.cli.views_compare import gate_exit, show_diff, show_gate
from ragexp.outputs import info
from ragexp.workflows.demo import STEPS, Demo, Step, narrate, shown, ui_lines
from ragexp.workflows.run import Evaluation


def _show_evaluation(evaluation: Evaluation | None) -> None:
    assert evaluation is not None  # the step that ran sets it
    run_warning(evaluation.outcome)
    show_run(evaluation)


def _candidate(demo: Demo) -> None:
    _show_evaluation(demo.candidate_run)
    print(f"\nbaseline run: {demo.baseline}\ncandidate run: {demo.candidate}")


def _diff(demo: Demo) -> None:
    assert demo.compared is not None
    show_diff(demo.compared.result)


def _gate(demo: Demo) -> None:
    assert demo.compared is not None and demo.gated is not None
    show_gate(demo.gated)
    print()
    for line in narrate(demo.compared, demo.gated, gate_exit(demo.gated)):
        print(terminal(line))


def _report(demo: Demo) -> None:
    assert demo.published is not None
    print(report_line(demo.candidate, demo.published))


SHOWN: dict[str, Callable[[Demo], None]] = {
    "baseline": lambda demo: _show_evaluation(demo.baseline_run),
    "candidate": _candidate,
    "diff": _diff,
    "gate": _gate,
    "report": _report,
}
"""Each step of :data:`ragexp.workflows.demo.STEPS` -> what its command prints."""


class DemoScreen:
    """The demo on the terminal: stdout for what the commands print, stderr for progress."""

    def say(self, line: str) -> None:
        info(line)

    def begin(self, demo: Demo) -> None:
        where = shown(demo.folder)
        print(f"ragexp demo: baseline -> candidate -> diff -> gate -> report, in a fresh store at {where}/")
        print("The system under test is the bundled sample (BM25 over character bigrams, a coverage reranker,")
        print("an extractive answer) on kb_zh, 35 Chinese customer-service questions, run in-process.")

    def before(self, number: int, step: Step, demo: Demo) -> None:
        print(f"\n── {number}/{len(STEPS)}  {step.title}", flush=True)
        print("$ " + " ".join(shlex.quote(part) for part in step.command(demo)), flush=True)

    def after(self, step: Step, demo: Demo) -> None:
        SHOWN[step.name](demo)

    def end(self, demo: Demo, experiment_id: str | None, seconds: float) -> None:
        print(f"\nDone in {seconds:.1f} s. The two runs in the MLflow UI (no network needed):")
        for line in ui_lines(demo, experiment_id):
            print(line)
        if demo.report is not None:
            print(f"  The report itself: {shown(demo.report / 'report.html')}")
