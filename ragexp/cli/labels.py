"""``ragexp label RUN_ID``, ``ragexp label export RUN_ID --out FILE`` and ``ragexp calibrate RUN_ID``."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Annotated

import typer

from ragexp.secrets import mask_url

TrackingUri = Annotated[
    str | None,
    typer.Option(
        "--tracking-uri", help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else sqlite:///mlruns/mlflow.db)."
    ),
]
JsonFlag = Annotated[bool, typer.Option("--json", help="Print exactly one JSON object on stdout.")]


def _info(message: str) -> None:
    sys.stderr.write(message + "\n")


def _emit(payload: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(payload, ensure_ascii=False) + "\n")


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
        _emit(made.to_json(base))
        return
    print(
        f"review queue '{made.queue}' ({made.queue_id}): {len(made.traces)} of {made.cases} traces of run "
        f"{made.run_id}, {made.kept} already labelled"
    )
    print(f"questions: {', '.join(made.schemas)}" + (f" (created: {', '.join(made.created)})" if made.created else ""))
    print_queue_link(made.url, base, store.uri)
    print(f"then: ragexp calibrate {made.run_id}")


def print_queue_link(url_of: Callable[[str | None], str | None], base: str | None, store_uri: str) -> None:
    """Where to open a review queue: its link on a known UI, else how to start one on this store."""
    url = url_of(base)
    if url:
        print(f"open: {url}")
    else:
        print(
            f"open: start the MLflow UI on this store (mlflow ui --backend-store-uri {mask_url(store_uri)}), then "
            f"{url_of('http://127.0.0.1:5000')}"
        )


def _export(run_id: str, out: str | None, tracking_uri: str | None, as_json: bool) -> None:
    from ragexp.cli.outputs import check_writable, write_file
    from ragexp.compare.data import load_run
    from ragexp.errors import ConfigError
    from ragexp.labels.collect import collect_labels, export_rows, trace_expectations
    from ragexp.tracking.store import Store

    path = check_writable("--out", out)
    if path is None:
        raise ConfigError("label export: --out FILE is required")
    store = Store(tracking_uri, read_only=True)
    data = load_run(store, run_id)
    labels = collect_labels(store, data)
    if (line := labels.ignored_line()) is not None:
        _info(line)
    rows = export_rows(data, labels, trace_expectations(store, data))
    text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows)
    write_file("--out", path, text.encode("utf-8"))
    if as_json:
        _emit({"run_id": run_id, "out": str(path), "cases": len(rows), "labels": labels.counts()})
    else:
        print(f"{len(rows)} labelled cases of run {run_id} written to {path}")


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
        _info(line)
    trust = calibrate_run(data, labels)
    figures = trust.as_metrics()
    if figures:
        store.log_metrics(run_id, figures)
    counts = labels.counts()
    if as_json:
        _emit(
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
