"""``ragexp shadow [OVERRIDES]``: a candidate replayed on production traffic, compared by stratum."""

from __future__ import annotations

from typing import Annotated

import typer

from ragexp.cli.console import emit_json
from ragexp.cli.options import ConfigDir, JsonFlag, Overrides, TrackingUri, UntilDecided, use_config_dir

Experiment = Annotated[
    str | None,
    typer.Option(
        "--experiment",
        help="MLflow experiment the two runs and their traces are written to "
        "(default: the production experiment's name + '-shadow'; never the production experiment).",
    ),
]


def shadow(
    overrides: Overrides = None,
    config_dir: ConfigDir = None,
    experiment: Experiment = None,
    tracking_uri: TrackingUri = None,
    until_decided: UntilDecided = False,
    as_json: JsonFlag = False,
) -> None:
    """Replay sampled production traces (dataset=traces) through the candidate config: a
    production run and a candidate run on the same questions, compared per stratum."""
    from ragexp.cli.views import show_sequential
    from ragexp.cli.views_shadow import show_shadow
    from ragexp.workflows.shadow import run_shadow

    use_config_dir(config_dir)
    outcome = run_shadow(overrides or [], tracking_uri=tracking_uri, experiment=experiment, until_decided=until_decided)
    if as_json:
        emit_json(outcome.to_json())
        return
    show_shadow(outcome)
    if outcome.sequential is not None:
        show_sequential(outcome.sequential)
