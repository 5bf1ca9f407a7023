"""``ragexp calibrate RUN_ID``."""

from __future__ import annotations

from typing import Annotated

import typer

from ragexp.cli.console import emit_json
from ragexp.cli.options import JsonFlag, StoreOverrides, TrackingUri, store_option
from ragexp.outputs import info


def calibrate(
    run_id: Annotated[str, typer.Argument(help="Run id whose traces people labelled.")],
    overrides: StoreOverrides = None,
    tracking_uri: TrackingUri = None,
    as_json: JsonFlag = False,
) -> None:
    """Judge calibration and prediction-powered means from the labels on a run's traces, logged on the run."""
    from ragexp.cli.views_people import show_calibration
    from ragexp.workflows.calibrate import calibrate_labels

    calibrated = calibrate_labels(run_id, tracking_uri=store_option("calibrate", tracking_uri, overrides), say=info)
    if as_json:
        emit_json(calibrated.to_json())
    else:
        show_calibration(calibrated)
