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
from typer.exceptions import TyperException

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


def _interrupt(signum: int, frame: Any) -> None:
    # SIGTERM ends a run like Ctrl-C does: marked interrupted, checkpoint kept for --resume.
    raise KeyboardInterrupt


def emit_json(payload: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(payload, ensure_ascii=False) + "\n")


def info(message: str) -> None:
    sys.stderr.write(message + "\n")


@app.command()
def run(
    overrides: Overrides = None,
    resume: Annotated[
        str | None,
        typer.Option(
            "--resume", help="Continue this interrupted run (same config): only the cases it lacks are evaluated."
        ),
    ] = None,
    multirun: Annotated[
        bool,
        typer.Option(
            "--multirun",
            "-m",
            help="Sweep: one run per point of comma-separated values (k=3,5,10), grouped under a parent run.",
        ),
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Compose the config, validate the dataset, evaluate every case and log one MLflow run."""
    import signal

    if multirun:
        if resume:
            from ragexp.errors import ConfigError

            raise ConfigError("--resume continues one run; it cannot be combined with -m")
        _sweep(overrides or [], as_json)
        return

    from ragexp.config.compose import compose
    from ragexp.runner import execute, plan_run
    from ragexp.tracking.store import Store

    config = compose(overrides or [])
    store = Store(config.tracking.uri)
    plan = plan_run(config, store.state_dir())
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        outcome = execute(plan, store, resume=resume)
    finally:
        signal.signal(signal.SIGTERM, previous)
    errors = f"{outcome.error_count} of {outcome.case_count} cases errored"
    if outcome.error_count:
        info(f"warning: {errors}; their scores are missing, not zero (see cases.jsonl)")
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
    for stage, figures in outcome.timings.items():
        print(f"stage {stage:10} p50 {figures['p50_seconds']:.4f} s  p95 {figures['p95_seconds']:.4f} s")
    if outcome.timings:
        print()
    print(f"run {outcome.run_id}  experiment {outcome.experiment}  ({outcome.tracking_uri})")
    print(
        f"config {outcome.config_hash[:12]}  dataset {config.dataset.name} "
        f"({outcome.case_count} cases, {outcome.dataset_hash[:12]})  provider {config.provider.name}  "
        f"k={config.k}  {errors}"
    )


def _sweep(overrides: list[str], as_json: bool) -> None:
    from ragexp.cli.render import fmt, table
    from ragexp.sweep import run_sweep

    outcome = run_sweep(overrides)
    headline = ["recall_at_k", "mrr", "answer_accuracy", "faithfulness", "p95_seconds", "error_rate"]
    if as_json:
        emit_json(
            {
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
        )
    else:
        shown = [name for name in headline if any(name in r.metrics for r in outcome.runs)]
        rows = [
            [r.tag("sweep.num"), r.tag("sweep.point"), r.run_id, *(fmt(r.metrics.get(n)) for n in shown)]
            for r in outcome.runs
        ]
        print(table(["#", "point", "run", *shown], rows, "lll" + "r" * len(shown)))
        print(f"\nsweep {outcome.parent}: {len(outcome.runs)} runs, {len(outcome.failures)} failed points")
    for number, reason in sorted(outcome.failures.items()):
        info(f"ragexp: sweep point {number} failed: {reason}")
    if outcome.failures:
        raise typer.Exit(1)


def record_comparison(store: Any, candidate: str, baseline: str, name: str, payload: dict[str, Any]) -> None:
    """Keep every comparison on the candidate run, as ``comparisons/<baseline>/<name>`` (the
    ``ragexp.gate.*`` tags only hold the latest verdict)."""
    data = json.dumps(payload, ensure_ascii=False, indent=1, default=str).encode("utf-8")
    store.log_files(candidate, {f"comparisons/{baseline}/{name}": data})


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
    sweep: Annotated[str | None, typer.Option("--sweep", help="Only the points of this sweep (parent run id).")] = None,
    config_hash: Annotated[
        str | None,
        typer.Option(
            "--config-hash", help="Only runs whose config hash starts with this (e.g. the 12 characters run prints)."
        ),
    ] = None,
    tracking_uri: TrackingUri = None,
    as_json: JsonFlag = False,
) -> None:
    """Recent runs: id, time, config hash, dataset, provider, headline metrics."""
    from ragexp.tracking.store import TAG_PREFIX, Store

    store = Store(tracking_uri)
    clauses = []
    if config_hash is not None:
        prefix = config_hash.strip().lower()
        if not prefix or any(c not in "0123456789abcdef" for c in prefix):
            from ragexp.errors import ConfigError

            raise ConfigError(f"--config-hash: expected hexadecimal digits, got {config_hash!r}")
        clauses.append(f"tags.`{TAG_PREFIX}config_hash` LIKE '{prefix}%'")
    if sweep:
        parent = store.get_run(sweep)
        experiment = store.experiment_name(parent.experiment_id)
        clauses.append(f"tags.`{TAG_PREFIX}sweep` = '{sweep}'")
    records = store.search(experiment, limit=limit, filter_string=" and ".join(clauses))
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
                "point": record.tag("sweep.point"),
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


Baseline = Annotated[str, typer.Option("--baseline", help="Run id of the baseline.")]
AllowIncomparable = Annotated[
    bool, typer.Option("--allow-incomparable", help="Compare runs with different dataset, cases, K, metrics or judge.")
]


@app.command()
def gate(
    baseline: Baseline,
    overrides: Overrides = None,
    candidate: Annotated[
        str | None,
        typer.Option(
            "--candidate", help="Run id of the candidate (default: newest finished run of the baseline's experiment)."
        ),
    ] = None,
    tracking_uri: TrackingUri = None,
    allow_incomparable: AllowIncomparable = False,
    as_json: JsonFlag = False,
) -> None:
    """Release check of a candidate against a baseline: exit 0 pass, 2 fail; every failure is printed."""
    from ragexp.compare.data import load_run
    from ragexp.compare.gate import gate_runs
    from ragexp.config.compose import compose
    from ragexp.errors import TrackingError
    from ragexp.tracking.store import TAG_PREFIX, Store

    gates = compose(overrides or []).gates
    store = Store(tracking_uri)
    base = load_run(store, baseline)
    if candidate is None:
        newest = store.newest_finished(base.record.experiment_id, exclude=base.run_id)
        if newest is None:
            raise TrackingError(f"no finished candidate run besides the baseline {base.run_id} in its experiment")
        candidate = newest.run_id
    cand = load_run(store, candidate)
    diff, result = gate_runs(gates, base, cand, allow_incomparable=allow_incomparable)
    store.set_tags(
        cand.run_id,
        {
            TAG_PREFIX + "gate.verdict": "passed" if result.passed else "failed",
            TAG_PREFIX + "gate.baseline": base.run_id,
            TAG_PREFIX + "gate.gates": gates.name,
            TAG_PREFIX + "gate.failures": ",".join(sorted({f.metric for f in result.failures})) or "none",
        },
    )
    record_comparison(
        store,
        cand.run_id,
        base.run_id,
        "gate.json",
        {
            "verdict": "passed" if result.passed else "failed",
            **result.to_json(),
            "gates": gates.name,
            "checked": result.checked,
            "rules": {name: rule.model_dump(exclude_none=True) for name, rule in gates.rules.items()},
            "max_error_rate": gates.max_error_rate,
            "confidence": gates.confidence,
            "compared_although_incomparable": list(diff.differences),
        },
    )
    if as_json:
        emit_json(result.to_json())
    else:
        from ragexp.cli.render import fmt, table

        verdict = "PASSED" if result.passed else "FAILED"
        print(f"gate {gates.name}: {verdict}  ({len(result.failures)} of {result.checked} checks failed)")
        print(f"baseline {base.run_id}  candidate {cand.run_id}")
        if diff.differences:
            info(f"warning: compared although not comparable: {'; '.join(diff.differences)}")
        if result.failures:
            rows = [
                [f.metric, f.rule, fmt(f.baseline), fmt(f.candidate), fmt(f.threshold), f.message]
                for f in result.failures
            ]
            print(table(["metric", "rule", "baseline", "candidate", "threshold", "why"], rows, "llrrrl"))
    if not result.passed:
        raise typer.Exit(2)


@app.command()
def diff(
    baseline: Annotated[str, typer.Argument(help="Run id of the baseline.")],
    candidate: Annotated[str, typer.Argument(help="Run id of the candidate.")],
    top: Annotated[int, typer.Option("--top", min=0, help="How many of the most regressed cases to show.")] = 10,
    tracking_uri: TrackingUri = None,
    allow_incomparable: AllowIncomparable = False,
    resamples: Annotated[
        int, typer.Option("--resamples", min=100, help="Bootstrap resamples and permutations.")
    ] = 10_000,
    confidence: Annotated[float, typer.Option("--confidence", min=0.5, max=0.999)] = 0.95,
    seed: Annotated[int, typer.Option("--seed", help="Random seed; the same seed gives the same figures.")] = 0,
    as_json: JsonFlag = False,
) -> None:
    """Per-metric and per-case comparison with paired confidence intervals and p-values."""
    from ragexp.compare.data import load_run
    from ragexp.compare.diff import compute_diff
    from ragexp.tracking.store import Store

    store = Store(tracking_uri)
    base, cand = load_run(store, baseline), load_run(store, candidate)
    result = compute_diff(
        base,
        cand,
        resamples=resamples,
        confidence=confidence,
        seed=seed,
        top=top,
        allow_incomparable=allow_incomparable,
    )
    record_comparison(store, cand.run_id, base.run_id, "diff.json", result.to_json())
    if as_json:
        emit_json(result.to_json())
        return
    from ragexp.cli.render import fmt, table

    print(f"baseline {base.run_id}  candidate {cand.run_id}  ({len(base.case_ids)} cases)")
    if result.differences:
        info(f"warning: compared although not comparable: {'; '.join(result.differences)}")
    rows = []
    for m in result.metrics:
        ci = f"[{m.ci_low:+.4f}, {m.ci_high:+.4f}]" if m.ci_low is not None and m.ci_high is not None else "—"
        p = f"{m.p_value:.4f}" if m.p_value is not None else "—"
        delta = f"{m.delta:+.4f}" if m.delta is not None else "—"
        rows.append(
            [
                m.name,
                m.direction,
                fmt(m.baseline),
                fmt(m.candidate),
                delta,
                ci,
                p,
                f"{m.improved}/{m.regressed}/{m.unchanged}",
                m.moved(),
            ]
        )
    print(
        table(
            [
                "metric",
                "better",
                "baseline",
                "candidate",
                "delta",
                f"{confidence:.0%} CI",
                "p",
                "up/down/same",
                "verdict",
            ],
            rows,
            "llrrrlrll",
        )
    )
    if result.diagnosis:
        print("\nlikely stage:")
        for line in result.diagnosis:
            print(f"  - {line}")
    if result.cases:
        print(f"\nmost regressed cases (top {len(result.cases)}):")
        for case in result.cases:
            changes = ", ".join(
                f"{name} {fmt(v['baseline'], 2)}->{fmt(v['candidate'], 2)}"
                for name, v in case["metrics"].items()
                if v["baseline"] != v["candidate"]
            )
            print(f"  {case['id']}: {changes or 'errored'}")
            for side in ("baseline", "candidate"):
                did = case[side]
                answer = (did["answer"] or "").replace("\n", " ")[:80]
                error = f"  error: {did['error']}" if did["error"] else ""
                print(f"    {side:9} retrieved {did['retrieved_ids'][:5]}  answer {answer!r}{error}")


@app.command()
def report(
    run_id: Annotated[str, typer.Argument(help="Run id to report on.")],
    baseline: Annotated[str | None, typer.Option("--baseline", help="Compare with this run.")] = None,
    out: Annotated[
        str | None, typer.Option("--out", help="Folder for report.md, report.html and plots (default: reports/RUN_ID).")
    ] = None,
    language: Annotated[
        str | None, typer.Option("--language", help="zh or en (default: the run's report.language).")
    ] = None,
    tracking_uri: TrackingUri = None,
    allow_incomparable: AllowIncomparable = False,
) -> None:
    """Markdown + self-contained HTML report with plots, also logged to the run."""
    from pathlib import Path

    from ragexp.errors import ConfigError
    from ragexp.report.build import build_report, write_report
    from ragexp.tracking.store import Store

    if language not in (None, "zh", "en"):
        raise ConfigError(f"--language: expected zh or en, got {language!r}")
    store = Store(tracking_uri)
    built, used = build_report(store, run_id, baseline, language, allow_incomparable)
    folder = Path(out) if out else Path("reports") / run_id
    written = write_report(built, folder)
    files = {f"report/{path.relative_to(folder)}": path.read_bytes() for path in written}
    store.log_files(run_id, files)
    print(
        f"report ({used}) written to {folder}/report.html and {folder}/report.md; logged to run {run_id} under report/"
    )


def main() -> None:
    """Console entry point: one line on stderr and the contract's exit code for any error."""
    # Commands build hundreds of thousands of long-lived objects (cases, rows) and exit soon after;
    # the cyclic collector would rescan them again and again (measured: a third of a 100k-case
    # run, two thirds of a 100k-case diff). Nothing here relies on collecting cycles.
    gc.disable()
    try:
        code = app(standalone_mode=False)
    except RagexpError as exc:
        info(f"ragexp: error: {exc}")
        sys.exit(exc.exit_code)
    except (typer.Exit, click.exceptions.Exit) as exc:
        sys.exit(exc.exit_code)
    except (KeyboardInterrupt, typer.Abort, click.exceptions.Abort):
        info("ragexp: interrupted")
        sys.exit(130)
    except (TyperException, click.ClickException) as exc:
        # Usage errors are errors (exit 1; 2 is a failed gate), in one line like every other error.
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        info(f"ragexp: error: {message} (see 'ragexp --help')")
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
