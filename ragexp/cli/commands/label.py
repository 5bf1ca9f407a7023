"""``ragexp label RUN_ID`` and ``ragexp label export RUN_ID --out FILE``."""

from __future__ import annotations

from typing import Annotated

import typer

from ragexp.cli.console import emit_json
from ragexp.cli.options import JsonFlag, TrackingUri, store_option
from ragexp.outputs import info

Metrics = Annotated[
    str | None,
    typer.Option(
        "--metrics",
        help="Comma-separated metrics to label (default: the run's judge metrics and "
        "answer accuracy: every metric of it that people can score).",
    ),
]
Sample = Annotated[
    int | None,
    typer.Option("--sample", help="Queue this many cases, drawn uniformly at random (already labelled ones kept)."),
]
UiUrl = Annotated[
    str | None,
    typer.Option("--ui-url", help="MLflow UI address for the queue's link (default: the tracking URI if a server)"),
]


def label(
    target: Annotated[str, typer.Argument(help="Run id to label, or 'export' followed by the run id.")],
    rest: Annotated[
        list[str] | None,
        typer.Argument(help="With 'export': the run id; and tracking.uri=URI (as --tracking-uri).", show_default=False),
    ] = None,
    metrics: Metrics = None,
    sample: Sample = None,
    seed: Annotated[int, typer.Option("--seed", help="Random seed of --sample.")] = 0,
    queue: Annotated[str | None, typer.Option("--queue", help="Review queue name (default: 'ragexp RUN_ID').")] = None,
    out: Annotated[str | None, typer.Option("--out", help="With 'export': the JSONL file to write.")] = None,
    ui_url: UiUrl = None,
    tracking_uri: TrackingUri = None,
    as_json: JsonFlag = False,
) -> None:
    """Put a run's traces in an MLflow review queue for people to label (or export the labels)."""
    from ragexp.cli.views_people import show_label_queue
    from ragexp.errors import ConfigError
    from ragexp.workflows.label import export_labels, label_run

    settings = [arg for arg in rest or [] if "=" in arg]
    run = next((arg for arg in rest or [] if "=" not in arg), None)
    if len(rest or []) - len(settings) > 1:
        raise ConfigError(f"label: unexpected arguments {rest!r} (ragexp label RUN_ID, or ragexp label export RUN_ID)")
    tracking_uri = store_option("label", tracking_uri, settings)
    if target == "export":
        if run is None:
            raise ConfigError("label export: give the run id (ragexp label export RUN_ID --out FILE)")
        if metrics is not None or sample is not None or queue is not None:
            raise ConfigError("label export: --metrics, --sample and --queue belong to 'ragexp label RUN_ID'")
        exported = export_labels(run, out, tracking_uri=tracking_uri, say=info)
        if as_json:
            emit_json(exported.to_json())
        else:
            print(f"{exported.cases} labelled cases of run {run} written to {exported.out}")
        return
    if run is not None:
        raise ConfigError(f"label: unexpected argument {run!r} (ragexp label RUN_ID, or ragexp label export RUN_ID)")
    if out is not None:
        raise ConfigError("label: --out belongs to 'ragexp label export RUN_ID --out FILE'")
    names = [name.strip() for name in metrics.split(",") if name.strip()] if metrics is not None else None
    queued = label_run(
        target, metrics=names, sample=sample, seed=seed, queue=queue, ui_url=ui_url, tracking_uri=tracking_uri
    )
    if as_json:
        emit_json(queued.to_json())
    else:
        show_label_queue(queued)
