"""What the sweep commands print for people: ``ragexp sweep`` and the points of ``run -m``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ragexp.cli.render import fmt, table, terminal
from ragexp.metrics.registry import headline_metrics

if TYPE_CHECKING:
    from ragexp.compare.sweeps import SweepAnalysis
    from ragexp.workflows.multirun import SweepOutcome


def show_sweep(outcome: SweepOutcome) -> None:
    headline = headline_metrics()
    shown = [name for name in headline if any(name in r.metrics for r in outcome.runs)]
    from ragexp.compare.sweeps import override_words, shown_override, varying_overrides

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


def _with_run(label: str, run_id: str) -> str:
    """A point's label and its run, the run named once (a baseline outside the sweep is labelled by it)."""
    return label if run_id in label else f"{label} (run {run_id})"
