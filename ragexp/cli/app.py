"""``ragexp``: typer commands. Heavy modules are imported inside the commands that need them,
so ``ragexp --help`` stays fast."""

from __future__ import annotations

import gc
import json
import sys
from datetime import datetime
from typing import Annotated, Any

import click
import typer

from ragexp.errors import RagexpError

app = typer.Typer(
    name="ragexp",
    help="Config-driven RAG evaluation: run, compare and gate experiments tracked in MLflow.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

Overrides = Annotated[
    list[str] | None, typer.Argument(help="Hydra overrides, e.g. k=10 dataset=scifacts_zh provider=replay")
]
JsonFlag = Annotated[bool, typer.Option("--json", help="Print exactly one JSON object on stdout.")]
TrackingUri = Annotated[
    str | None,
    typer.Option(
        "--tracking-uri", help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else sqlite:///mlruns/mlflow.db)."
    ),
]


def emit_json(payload: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(payload, ensure_ascii=False) + "\n")


def info(message: str) -> None:
    sys.stderr.write(message + "\n")


@app.command()
def run(
    overrides: Overrides = None,
    as_json: JsonFlag = False,
) -> None:
    """Compose the config, validate the dataset, evaluate every case and log one MLflow run."""
    from ragexp.config.compose import compose
    from ragexp.runner import execute, plan_run
    from ragexp.tracking.store import Store

    # A run allocates millions of small objects and frees them in bulk at exit; the cyclic
    # collector would rescan them over and over (measured: a third of a 100k-case run).
    gc.disable()
    config = compose(overrides or [])
    plan = plan_run(config)
    store = Store(config.tracking.uri)
    outcome = execute(plan, store)
    if as_json:
        emit_json(outcome.to_json())
        return
    from ragexp.cli.render import fmt, table

    rows = []
    for spec in outcome.specs:
        value = outcome.summary.get(spec.name)
        scored = outcome.scored.get(spec.name)
        rows.append(
            [spec.name, fmt(value), spec.direction, f"{scored}/{outcome.case_count}" if scored is not None else "run"]
        )
    print(table(["metric", "value", "better", "scored"], rows, "lrll"))
    print()
    errors = f"{outcome.error_count} of {outcome.case_count} cases errored"
    print(f"run {outcome.run_id}  experiment {outcome.experiment}  ({outcome.tracking_uri})")
    print(
        f"config {outcome.config_hash[:12]}  dataset {config.dataset.name} "
        f"({outcome.case_count} cases, {outcome.dataset_hash[:12]})  provider {config.provider.name}  "
        f"k={config.k}  {errors}"
    )
    if outcome.error_count:
        info(f"warning: {errors}; their scores are missing, not zero (see cases.jsonl)")


@app.command()
def validate(
    overrides: Overrides = None,
    path: Annotated[
        str | None, typer.Option("--path", help="Check this file instead of the configured dataset.")
    ] = None,
    fmt_: Annotated[str, typer.Option("--format", help="auto, jsonl or columns")] = "auto",
    as_json: JsonFlag = False,
) -> None:
    """Check a dataset without running anything."""
    from ragexp.config.compose import PROJECT_ROOT, compose
    from ragexp.datasets.loader import load_dataset, resolve_path
    from ragexp.errors import DatasetErrors

    file_format: str = fmt_
    if path is None:
        config = compose(overrides or [])
        file, file_format = resolve_path(config.dataset.path, PROJECT_ROOT), config.dataset.format
    else:
        file = resolve_path(path)
    try:
        dataset = load_dataset(file, file_format)
    except DatasetErrors as exc:
        if as_json:
            emit_json({"valid": False, "errors": [str(error) for error in exc.errors]})
        else:
            for error in exc.errors:
                info(f"ragexp: {error}")
        raise typer.Exit(1) from None
    summary: dict[str, Any] = {
        "valid": True,
        "path": str(file),
        "format": dataset.format,
        "case_count": len(dataset.cases),
        "unanswerable": len(dataset.cases) - dataset.answerable_count,
        "dataset_hash": dataset.dataset_hash,
        "label_fields": sorted(dataset.label_fields),
        "output_fields": sorted(dataset.output_fields),
    }
    if as_json:
        emit_json(summary)
    else:
        print(
            f"ok: {file}: {summary['case_count']} cases ({summary['unanswerable']} unanswerable), "
            f"format {dataset.format}, dataset hash {dataset.dataset_hash[:12]}"
        )
        print(f"labels: {', '.join(summary['label_fields'])}")
        print(f"recorded outputs: {', '.join(summary['output_fields']) or 'none'}")


@app.command()
def runs(
    limit: Annotated[int, typer.Option("--limit", min=1, help="How many runs, newest first.")] = 20,
    experiment: Annotated[str, typer.Option("--experiment", help="MLflow experiment.")] = "ragexp",
    tracking_uri: TrackingUri = None,
    as_json: JsonFlag = False,
) -> None:
    """Recent runs: id, time, config hash, dataset, provider, headline metrics."""
    from ragexp.tracking.store import Store

    records = Store(tracking_uri).search(experiment, limit=limit)
    headline = ["recall_at_k", "mrr", "answer_accuracy", "faithfulness", "p95_seconds", "error_rate"]
    items: list[dict[str, Any]] = []
    for record in records:
        items.append(
            {
                "run_id": record.run_id,
                "name": record.name,
                "status": record.status,
                "start_time": datetime.fromtimestamp(record.start_time / 1000).isoformat(timespec="seconds"),
                "config_hash": record.tag("config_hash"),
                "dataset": record.tag("dataset"),
                "provider": record.tag("provider"),
                "k": record.tag("k"),
                "metrics": {name: record.metrics[name] for name in headline if name in record.metrics},
                "case_count": int(record.metrics.get("case_count", 0)),
                "error_count": int(record.metrics.get("error_count", 0)),
            }
        )
    if as_json:
        emit_json({"experiment": experiment, "runs": items})
        return
    if not items:
        info(f"no runs in experiment '{experiment}'")
        return
    from ragexp.cli.render import fmt, table

    shown = [name for name in headline if any(name in item["metrics"] for item in items)]
    rows = [
        [
            item["run_id"],
            item["start_time"].replace("T", " "),
            item["status"].lower(),
            item["config_hash"][:12],
            item["dataset"],
            item["provider"],
            item["k"],
            *(fmt(item["metrics"].get(name)) for name in shown),
            f"{item['error_count']}/{item['case_count']}",
        ]
        for item in items
    ]
    print(
        table(
            ["run", "started", "status", "config", "dataset", "provider", "k", *shown, "errors"],
            rows,
            "lllllll" + "r" * len(shown) + "r",
        )
    )


def main() -> None:
    """Console entry point: one line on stderr and the contract's exit code for any error."""
    try:
        code = app(standalone_mode=False)
    except RagexpError as exc:
        info(f"ragexp: error: {exc}")
        sys.exit(exc.exit_code)
    except click.exceptions.Exit as exc:
        sys.exit(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        sys.exit(1)  # usage errors are errors (1); 2 is reserved for a failed gate
    except (KeyboardInterrupt, click.exceptions.Abort):
        info("ragexp: interrupted")
        sys.exit(130)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
