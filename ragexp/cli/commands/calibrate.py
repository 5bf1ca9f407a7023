"""``ragexp calibrate RUN_ID``."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from ragexp.cli.console import emit_json
from ragexp.cli.options import JsonFlag, TrackingUri


def calibrate(
    run_id: Annotated[str, typer.Argument(help="Run id whose traces people labelled.")],
    tracking_uri: TrackingUri = None,
    as_json: JsonFlag = False,
) -> None:
    """Judge calibration and prediction-powered means from the labels on a run's traces, logged on the run."""
    from ragexp.compare.data import load_run
    from ragexp.labels.collect import calibrate_run, collect_labels
    from ragexp.tracking.store import Store

    store = Store(tracking_uri)
    data = load_run(store, run_id)
    labels = collect_labels(store, data)
    if (line := labels.ignored_line()) is not None:
        sys.stderr.write(line + "\n")
    trust = calibrate_run(data, labels)
    figures = trust.as_metrics()
    if figures:
        store.log_metrics(run_id, figures)
    counts = labels.counts()
    if as_json:
        emit_json(
            {
                "run_id": run_id,
                "labels": counts,
                "own": labels.own,
                "carried_over": labels.carried,
                "ignored": labels.ignored,
                **trust.to_json(),
            }
        )
        return
    from ragexp.cli.render import trust_lines
    from ragexp.labels.collect import calibration_settings

    labelled = ", ".join(f"{name} {n}" for name, n in counts.items()) or "none"
    print(f"run {run_id}: labelled cases {labelled} ({labels.carried} carried over from identical outputs)")
    for line in trust_lines(trust, calibration_settings(data).threshold, None):
        print(line)
    if not figures:
        print("not calibrated: fewer labelled, scored cases than calibration.min_labelled for every metric")
    else:
        print(f"logged on run {run_id}: {len(figures)} calibration.* and ppi.* metrics")
