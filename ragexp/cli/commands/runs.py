"""``ragexp runs``."""

from __future__ import annotations

from typing import Annotated

import typer

from ragexp.cli.console import emit_json
from ragexp.cli.options import JsonFlag, StoreOverrides, TrackingUri, store_option
from ragexp.outputs import info


def runs(
    overrides: StoreOverrides = None,
    limit: Annotated[int, typer.Option("--limit", min=1, help="How many runs, newest first.")] = 20,
    experiment: Annotated[
        str | None,
        typer.Option("--experiment", help="MLflow experiment (default: ragexp; with --config-hash: every experiment)."),
    ] = None,
    sweep: Annotated[str | None, typer.Option("--sweep", help="Only the points of this sweep (parent run id).")] = None,
    config_hash: Annotated[
        str | None,
        typer.Option(
            "--config-hash", help="Only runs whose config hash starts with this (e.g. the 12 characters run prints)."
        ),
    ] = None,
    cells: Annotated[
        bool,
        typer.Option(
            "--cells",
            help="Also list the attribution cell runs of diff --attribute (always listed, marked, with --config-hash).",
        ),
    ] = False,
    tracking_uri: TrackingUri = None,
    as_json: JsonFlag = False,
) -> None:
    """Recent runs: id, time, config hash, dataset, provider, headline metrics."""
    from ragexp.cli.views_compare import show_runs
    from ragexp.workflows.runs import list_runs

    found = list_runs(
        limit=limit,
        experiment=experiment,
        sweep=sweep,
        config_hash=config_hash,
        tracking_uri=store_option("runs", tracking_uri, overrides),
        cells=cells,
    )
    if as_json:
        emit_json(found.to_json())
        return
    if not found.runs:
        info(f"no runs in {found.where()}")
    else:
        show_runs(found.runs, with_experiment=found.experiment is None)
    if found.cells_left_out:
        info(f"{found.cells_left_out} attribution cell run(s) of diff --attribute not listed (--cells lists them)")
