"""``ragexp label RUN_ID`` and ``ragexp label export RUN_ID --out FILE``."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer

from ragexp.cli.console import emit_json
from ragexp.cli.options import JsonFlag, TrackingUri


def label(
    target: Annotated[str, typer.Argument(help="Run id to label, or 'export' followed by the run id.")],
    run: Annotated[str | None, typer.Argument(help="With 'export': the run id.", show_default=False)] = None,
    metrics: Annotated[
        str | None,
        typer.Option(
            "--metrics",
            help="Comma-separated metrics to label (default: the run's judge metrics and "
            "answer accuracy: every metric of it that people can score).",
        ),
    ] = None,
    sample: Annotated[
        int | None,
        typer.Option("--sample", help="Queue this many cases, drawn uniformly at random (already labelled ones kept)."),
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="Random seed of --sample.")] = 0,
    queue: Annotated[str | None, typer.Option("--queue", help="Review queue name (default: 'ragexp RUN_ID').")] = None,
    out: Annotated[str | None, typer.Option("--out", help="With 'export': the JSONL file to write.")] = None,
    ui_url: Annotated[
        str | None,
        typer.Option("--ui-url", help="MLflow UI address for the queue's link (default: the tracking URI if a server)"),
    ] = None,
    tracking_uri: TrackingUri = None,
    as_json: JsonFlag = False,
) -> None:
    """Put a run's traces in an MLflow review queue for people to label (or export the labels)."""
    from ragexp.errors import ConfigError

    if target == "export":
        if run is None:
            raise ConfigError("label export: give the run id (ragexp label export RUN_ID --out FILE)")
        if metrics is not None or sample is not None or queue is not None:
            raise ConfigError("label export: --metrics, --sample and --queue belong to 'ragexp label RUN_ID'")
        _export(run, out, tracking_uri, as_json)
        return
    if run is not None:
        raise ConfigError(f"label: unexpected argument {run!r} (ragexp label RUN_ID, or ragexp label export RUN_ID)")
    if out is not None:
        raise ConfigError("label: --out belongs to 'ragexp label export RUN_ID --out FILE'")
    from ragexp.compare.summary import Links
    from ragexp.labels.queue import create_label_queue
    from ragexp.tracking.store import Store

    names = [name.strip() for name in metrics.split(",") if name.strip()] if metrics is not None else None
    store = Store(tracking_uri)
    made = create_label_queue(store, target, metrics=names, sample=sample, seed=seed, queue=queue)
    base = Links.for_store(store.uri, ui_url).base
    if as_json:
        emit_json(made.to_json(base))
        return
    print(
        f"review queue '{made.queue}' ({made.queue_id}): {len(made.traces)} of {made.cases} traces of run "
        f"{made.run_id}, {made.kept} already labelled"
    )
    print(f"questions: {', '.join(made.schemas)}" + (f" (created: {', '.join(made.created)})" if made.created else ""))
    from ragexp.cli.views import print_queue_link

    print_queue_link(made.url, base, store.uri)
    print(f"then: ragexp calibrate {made.run_id}")


def _export(run_id: str, out: str | None, tracking_uri: str | None, as_json: bool) -> None:
    from ragexp.compare.data import load_run
    from ragexp.errors import ConfigError
    from ragexp.labels.collect import collect_labels, export_rows, trace_expectations
    from ragexp.outputs import check_writable, write_file
    from ragexp.tracking.store import Store

    path = check_writable("--out", out)
    if path is None:
        raise ConfigError("label export: --out FILE is required")
    store = Store(tracking_uri, read_only=True)
    data = load_run(store, run_id)
    labels = collect_labels(store, data)
    if (line := labels.ignored_line()) is not None:
        sys.stderr.write(line + "\n")
    rows = export_rows(data, labels, trace_expectations(store, data))
    text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    write_file("--out", path, text.encode("utf-8"))
    if as_json:
        emit_json({"run_id": run_id, "out": str(path), "cases": len(rows), "labels": labels.counts()})
    else:
        print(f"{len(rows)} labelled cases of run {run_id} written to {path}")
