"""``ragexp``: typer commands. Heavy modules are imported inside the commands that need them,
so ``ragexp --help`` stays fast."""

from __future__ import annotations

import gc
import json
import os
import sys
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any

import click
import typer
from typer.exceptions import TyperException

from ragexp.errors import RagexpError

if TYPE_CHECKING:
    from ragexp.compare.promote import PromotionTag
    from ragexp.compare.select import Selection, Selector
    from ragexp.tracking.store import RunRecord, Store

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
AllowDraft = Annotated[
    bool, typer.Option("--allow-draft", help="Accept cases still draft.status 'draft' (a run is tagged ragexp.draft).")
]
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
    """One line on stderr: credentials in any URL in it masked, control characters from data (case
    ids, service bodies) shown as escapes."""
    from ragexp.escape import terminal
    from ragexp.secrets import mask_urls

    sys.stderr.write(terminal(mask_urls(message)) + "\n")


ConfigDir = Annotated[
    str | None,
    typer.Option(
        "--config-dir",
        help="Your config folder, composed over the packaged defaults "
        "(default: $RAGEXP_CONFIG_DIR, else ./conf when it exists).",
    ),
]


def _use_config_dir(config_dir: str | None) -> None:
    if config_dir:
        import os

        from ragexp.paths import CONFIG_DIR_ENV

        os.environ[CONFIG_DIR_ENV] = config_dir  # read by composition, data paths and sweep workers alike


@app.callback()
def _options(config_dir: ConfigDir = None) -> None:
    """Config-driven RAG evaluation: run, compare and gate experiments tracked in MLflow."""
    _use_config_dir(config_dir)


@app.command()
def init(
    directory: Annotated[str, typer.Argument(help="Folder to set up (created if missing).")] = ".",
    force: Annotated[bool, typer.Option("--force", help="Overwrite starter files that already exist.")] = False,
    system: Annotated[
        str,
        typer.Option(
            "--system",
            help="Template of conf/system/my_service.yaml: http (ragexp's contract), dify, ragflow, openai_chat, "
            "python.",
        ),
    ] = "http",
) -> None:
    """Write a starter conf/ (your dataset, your service, your gate), a two-case dataset and a .gitignore."""
    from pathlib import Path

    from ragexp.cli.init import init_project, next_commands

    folder = Path(directory)
    for path in init_project(folder, force=force, system=system):
        info(f"wrote {path}")
    typer.echo("Next:")
    for line in next_commands(folder):
        typer.echo(f"  {line}")


@app.command()
def run(
    overrides: Overrides = None,
    config_dir: ConfigDir = None,
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
    retry_errors: Annotated[
        bool,
        typer.Option(
            "--retry-errors",
            help="With --resume: also ask again the cases that failed for other reasons than the transport.",
        ),
    ] = False,
    allow_draft: AllowDraft = False,
    as_json: JsonFlag = False,
) -> None:
    """Compose the config, validate the dataset, evaluate every case and log one MLflow run."""
    _use_config_dir(config_dir)
    import signal

    if multirun:
        if resume:
            from ragexp.errors import ConfigError

            raise ConfigError("--resume continues one run; it cannot be combined with -m")
        _sweep(overrides or [], as_json)
        return

    import shlex

    from ragexp.config.compose import compose
    from ragexp.errors import ConfigError
    from ragexp.runner import Interrupted, Stopped, execute, plan_run
    from ragexp.tracking.store import Store

    if retry_errors and not resume:
        raise ConfigError("--retry-errors goes with --resume RUN_ID")
    config = compose(overrides or [])
    store = Store(config.tracking.uri, timeout_s=config.tracking.timeout_s)
    from ragexp.secrets import register_url

    register_url(store.uri)  # a tracking server's password is masked wherever a secret is
    plan = plan_run(config, store.state_dir())
    from ragexp.draft.screening import DRAFT_TAG, refuse_unscreened, unscreened

    if not allow_draft:
        refuse_unscreened(plan.dataset)
    draft_tags = {DRAFT_TAG: "true"} if unscreened(plan.dataset) else None
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        outcome = execute(plan, store, resume=resume, retry_errors=retry_errors, tags=draft_tags)
    except Stopped as exc:
        if as_json and isinstance(exc, Interrupted):
            emit_json({"status": "interrupted", "run_id": exc.run_id})
        command = " ".join(["ragexp", "run", *map(shlex.quote, overrides or []), "--resume", exc.run_id])
        exc.args = (f"{exc}; continue with: {command}",)
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
    errors = f"{outcome.error_count} of {outcome.case_count} cases errored"
    if outcome.error_count:
        info(f"warning: {errors}; their scores are missing, not zero (see cases.jsonl)")
    if as_json:
        emit_json(outcome.to_json())
        return
    from ragexp.cli.render import duration, fmt, table

    rows = []
    for spec in outcome.specs:
        value = outcome.summary.get(spec.name)
        scored = outcome.scored.get(spec.name)
        rows.append(
            [spec.name, fmt(value), spec.direction, f"{scored}/{outcome.case_count}" if scored is not None else "run"]
        )
    print(table(["metric", "value", "better", "scored"], rows, "lrll"))
    print()
    from ragexp.cli.render import terminal

    for stage, figures in outcome.timings.items():
        p50, p95 = duration(figures["p50_seconds"]), duration(figures["p95_seconds"])
        print(f"stage {terminal(stage):10} p50 {p50:>10}  p95 {p95:>10}")
    if outcome.timings:
        print()
    from ragexp.secrets import mask_url

    shown = terminal(mask_url(outcome.tracking_uri))
    print(f"run {outcome.run_id}  experiment {terminal(outcome.experiment)}  ({shown})")
    print(
        f"config {outcome.config_hash[:12]}  dataset {terminal(config.dataset.name)} "
        f"({outcome.case_count} cases, {outcome.dataset_hash[:12]})  provider {terminal(config.provider.name)}  "
        f"k={config.k}  {errors}"
    )
    from ragexp.cli.render import trust_lines

    for line in trust_lines(outcome.trust, config.calibration.threshold, plan.findings):
        print(line)


def _sweep(overrides: list[str], as_json: bool) -> None:
    from ragexp.cli.render import fmt, table
    from ragexp.metrics.registry import headline_metrics
    from ragexp.sweep import run_sweep

    outcome = run_sweep(overrides)
    headline = headline_metrics()
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
    from ragexp.errors import TrackingError

    data = json.dumps(payload, ensure_ascii=False, indent=1, default=str).encode("utf-8")
    try:
        store.log_files(candidate, {f"comparisons/{baseline}/{name}": data})
    except TrackingError as exc:  # a read-only copy of a store: the result stands, unrecorded
        info(f"warning: the comparison is not recorded on run {candidate}: {exc}")


@app.command()
def validate(
    overrides: Overrides = None,
    config_dir: ConfigDir = None,
    path: Annotated[
        str | None, typer.Option("--path", help="Check this file instead of the configured dataset.")
    ] = None,
    fmt_: Annotated[str, typer.Option("--format", help="auto, jsonl or columns")] = "auto",
    corpus: Annotated[
        str | None,
        typer.Option(
            "--corpus",
            help="Audit the labels against this JSONL of {id, text} chunks (default: the configured dataset.corpus).",
        ),
    ] = None,
    strict: Annotated[bool, typer.Option("--strict", help="Exit 1 when the label audit finds anything.")] = False,
    probe: Annotated[
        bool,
        typer.Option(
            "--probe",
            help="Ask the configured system about the first case, once: show the raw reply and what each "
            "response expression read from it.",
        ),
    ] = False,
    allow_draft: AllowDraft = False,
    as_json: JsonFlag = False,
) -> None:
    """Check a dataset without running anything; with a corpus, audit its labels too; with
    --probe, ask the system under test about the first case."""
    _use_config_dir(config_dir)
    from ragexp.config.compose import compose
    from ragexp.datasets.audit import audit, load_corpus, shares_ids
    from ragexp.datasets.loader import load_dataset, resolve_path
    from ragexp.errors import ConfigError, DatasetErrors
    from ragexp.paths import data_roots

    file_format: str = fmt_
    config = None
    if path is None:
        from ragexp.runner import check_store_fields

        config = compose(overrides or [])
        check_store_fields(config)
        file, file_format = resolve_path(config.dataset.path, data_roots()), config.dataset.format
        configured = corpus or config.dataset.corpus
        corpus_file = resolve_path(configured, data_roots()) if configured else None
    else:
        file = resolve_path(path)
        corpus_file = resolve_path(corpus) if corpus else None
    try:
        dataset = load_dataset(file, file_format)
        if not allow_draft:
            from ragexp.draft.screening import refuse_unscreened

            refuse_unscreened(dataset)
        findings = None
        if corpus_file is not None:
            chunks = load_corpus(corpus_file)
            if corpus is None and path is None and not shares_ids(dataset, chunks):
                info(
                    f"warning: label audit skipped: the configured corpus {corpus_file} holds none of its relevant ids"
                )
            else:
                findings = audit(dataset, chunks)
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
        "human_labels": _human_counts(dataset.cases),
    }
    if findings is not None:
        summary["corpus"] = str(corpus_file)
        summary["findings"] = [finding.to_json() for finding in findings]
    if probe:
        if config is None:
            raise ConfigError("--probe asks the configured system: it does not go with --path")
        summary["probe"] = _probe(config, dataset)
    if as_json:
        emit_json(summary)
    else:
        from ragexp.escape import terminal

        print(
            f"ok: {terminal(file)}: {summary['case_count']} cases ({summary['unanswerable']} unanswerable), "
            f"format {dataset.format}, dataset hash {dataset.dataset_hash[:12]}"
        )
        print(f"labels: {terminal(', '.join(summary['label_fields']))}")
        print(f"recorded outputs: {terminal(', '.join(summary['output_fields']) or 'none')}")
        if summary["human_labels"]:
            counts = ", ".join(f"{name} {count}" for name, count in summary["human_labels"].items())
            print(f"human scores: {terminal(counts)}")
        if findings is not None:
            print(f"label audit against {terminal(corpus_file)}: {len(findings)} finding(s)")
            for finding in findings:
                print(f"  warning: {terminal(finding)}")
        if probe:
            _print_probe(summary["probe"])
    if findings and strict:
        raise typer.Exit(1)
    if probe and summary["probe"].get("error"):
        raise typer.Exit(1)


def _probe(config: Any, dataset: Any) -> dict[str, Any]:
    """One real request for the dataset's first case (``validate --probe``)."""
    from ragexp.providers.base import RunSettings, build_provider

    settings = RunSettings(k=config.k, concurrency=1, dataset=config.dataset)
    provider = build_provider(config.provider.system, settings)
    provider.preflight(dataset)
    return provider.probe(dataset.cases[0])


def _print_probe(report: dict[str, Any]) -> None:
    from ragexp.escape import terminal

    sent = report.get("params" if report.get("method") == "GET" else "body")
    print(terminal(f"probe: case {report['case_id']}: {report['method']} {report['url']}"))
    print(terminal(f"  sent: {json.dumps(sent, ensure_ascii=False)}"))
    if "status" in report:
        print(
            f"  reply: HTTP {report['status']} in {report['seconds']:g} s, {report['bytes']:,} bytes "
            f"({report['content_type'] or 'no content type'})"
        )
    elif "raw" in report:
        print(f"  returned in {report['seconds']:g} s, as plain data:")
    if "raw" in report:
        for line in str(report["raw"]).splitlines() or [""]:
            print(f"  | {terminal(line)}")
    for key, value in report.get("extracted", {}).items():
        print(terminal(f"  {key} -> {json.dumps(value, ensure_ascii=False)}"))
    if report.get("error"):
        print(terminal(f"  error: {report['error']}"))
    elif report.get("output") is not None:
        print(terminal(f"  output: {json.dumps(report['output'], ensure_ascii=False)}"))


def _human_counts(cases: list[Any]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for case in cases:
        for name in case.human:
            counts[name] = counts.get(name, 0) + 1
    return dict(sorted(counts.items()))


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

    store = Store(tracking_uri, read_only=True)
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
    from ragexp.metrics.registry import headline_metrics

    headline = headline_metrics()
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


Baseline = Annotated[
    str,
    typer.Option(
        "--baseline",
        help="Run id of the baseline, or tag:KEY=VALUE / latest:EXPERIMENT (the newest finished comparable run).",
    ),
]
AllowIncomparable = Annotated[
    bool, typer.Option("--allow-incomparable", help="Compare runs with different dataset, cases, K, metrics or judge.")
]
SummaryFile = Annotated[
    str | None, typer.Option("--summary", help="Write a Markdown summary here (e.g. $GITHUB_STEP_SUMMARY).")
]
Language = Annotated[
    str | None, typer.Option("--language", help="Language of --summary: zh or en (default: report.language).")
]
UiUrl = Annotated[
    str | None,
    typer.Option("--ui-url", help="MLflow UI address for links in --summary (default: the tracking URI if a server)."),
]


@app.command()
def gate(
    baseline: Baseline,
    overrides: Overrides = None,
    config_dir: ConfigDir = None,
    candidate: Annotated[
        str | None,
        typer.Option(
            "--candidate",
            help="Run id of the candidate (default: the newest finished run created after the baseline in its "
            "experiment that is comparable with it).",
        ),
    ] = None,
    tracking_uri: TrackingUri = None,
    allow_incomparable: AllowIncomparable = False,
    junit: Annotated[str | None, typer.Option("--junit", help="Write a JUnit XML report here.")] = None,
    summary: SummaryFile = None,
    language: Language = None,
    ui_url: UiUrl = None,
    promote: Annotated[
        bool,
        typer.Option(
            "--promote",
            help="If the gate passes, move the baseline's tag (tag:KEY=VALUE, or --promote-tag) onto the candidate.",
        ),
    ] = False,
    promote_tag: Annotated[
        str | None, typer.Option("--promote-tag", help="KEY=VALUE that --promote moves (default: the --baseline tag).")
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Release check of a candidate against a baseline: exit 0 pass, 2 fail; every failure is printed."""
    _use_config_dir(config_dir)
    import time

    from ragexp.cli.outputs import check_writable, write_file
    from ragexp.compare.select import parse_selector

    started = time.perf_counter()
    junit_path, summary_path = check_writable("--junit", junit), check_writable("--summary", summary)
    _check_language(language)
    selector = parse_selector(baseline)
    tag = _promotion_tag(promote, promote_tag, selector.tag)

    from ragexp.compare.data import load_run
    from ragexp.compare.gate import check_gate, gate_runs
    from ragexp.compare.promote import PROMOTION_READS, holders
    from ragexp.compare.summary import SUMMARY_CASES
    from ragexp.config.compose import compose
    from ragexp.errors import PromotionConflict, TrackingError
    from ragexp.tracking.store import TAG_PREFIX, Store

    config = compose(overrides or [])
    gates = config.gates
    check_gate(gates)
    store = Store(tracking_uri, read_only=True)
    given = store.get_run(candidate) if candidate else None
    # A baseline chosen by the tag --promote moves can lose it to another pipeline between the
    # two reads: then the baseline is chosen again, from the run the tag is on now.
    for _ in range(PROMOTION_READS):
        chosen = _choose(store, selector, given)
        base_record, cand_record = chosen[0].record, chosen[1].record
        expected = holders(store, tag, cand_record.experiment_id) if tag else []
        raced = tag is not None and selector.tag == (tag.key, tag.value)
        if not (raced and expected and expected != [base_record.run_id]):
            break
    if tag and expected and expected != [base_record.run_id]:
        raise PromotionConflict(
            f"--promote: tag {tag} is on {', '.join(expected)}, not on the baseline {base_record.run_id}; a candidate "
            f"is promoted only over the run holding the tag (--baseline tag:{tag})",
            expected,
        )
    # Whatever was chosen (not named by id) is said once the runs and the tag's holders are
    # known: nothing the gate compares against can change under it after these lines.
    for selection in chosen:
        if selection.asked:
            info(selection.how)
    base, cand = load_run(store, base_record.run_id), load_run(store, cand_record.run_id)
    diff, result = gate_runs(
        gates, base, cand, allow_incomparable=allow_incomparable, top=SUMMARY_CASES if summary_path else 0
    )
    try:
        store.set_tags(
            cand.run_id,
            {
                TAG_PREFIX + "gate.verdict": "passed" if result.passed else "failed",
                TAG_PREFIX + "gate.baseline": base.run_id,
                TAG_PREFIX + "gate.gates": gates.name,
                TAG_PREFIX + "gate.failures": ",".join(sorted({f.metric for f in result.failures})) or "none",
            },
        )
    except TrackingError as exc:  # a read-only copy of a store: the verdict stands, unrecorded
        info(f"warning: the verdict is not recorded on run {cand.run_id}: {exc}")
    promotion = None
    if tag and result.passed:
        from ragexp.compare.promote import promote as move_tag

        promotion = move_tag(store, tag, cand_record, expected)
    how = [c.how for c in chosen]
    if junit_path:
        from ragexp.compare.junit import junit_xml

        extra = {"baseline.selected": how[0], "candidate.selected": how[1]}
        write_file("--junit", junit_path, junit_xml(result, diff, seconds=time.perf_counter() - started, extra=extra))
    if summary_path:
        from ragexp.compare.summary import Links, gate_summary

        text = gate_summary(
            result,
            diff,
            language=language or config.report.language,
            links=Links.for_store(store.uri, ui_url),
            chosen=[c.asked for c in chosen],
            notes=[promotion.message] if promotion else [],
        )
        write_file("--summary", summary_path, text.encode("utf-8"))
    record_comparison(
        store,
        cand.run_id,
        base.run_id,
        "gate.json",
        {
            "verdict": "passed" if result.passed else "failed",
            **result.to_json(),
            "checked": result.checked,
            "config": {
                "gates": gates.name,
                "rules": {name: rule.model_dump(exclude_none=True) for name, rule in gates.rules.items()},
                "max_error_rate": gates.max_error_rate,
                "confidence": gates.confidence,
            },
            "compared_although_incomparable": list(diff.differences),
        },
    )
    if as_json:
        emit_json(
            {
                **result.to_json(),
                "selection": {"baseline": how[0], "candidate": how[1]},
                **({"promotion": promotion.to_json()} if promotion else {}),
            }
        )
    else:
        from ragexp.cli.render import fmt, table, terminal
        from ragexp.compare.figures import threshold

        verdict = "PASSED" if result.passed else "FAILED"
        print(f"gate {terminal(gates.name)}: {verdict}  ({len(result.failures)} of {result.checked} checks failed)")
        print(f"baseline {base.run_id}  candidate {cand.run_id}")
        if diff.differences:
            info(f"warning: compared although not comparable: {'; '.join(diff.differences)}")
        if result.failures:
            rows = [
                [f.metric, f.rule, fmt(f.baseline), fmt(f.candidate), threshold(f.threshold), f.message]
                for f in result.failures
            ]
            print(table(["metric", "rule", "baseline", "candidate", "threshold", "why"], rows, "llrrrl"))
        for r in result.rules:
            if r.method == "prediction-powered" and r.passed:
                print(f"note: {terminal(r.message)}")
        from ragexp.cli.power import print_gate_power

        print_gate_power(result)
    if tag and not result.passed:
        info(f"not promoted: the gate failed, so tag {tag} stays where it is")
    if promotion is not None:
        for warning in promotion.warnings:
            info(f"warning: {warning}")
        if not promotion.promoted:
            info(f"ragexp: error: {promotion.message}")
            raise typer.Exit(1)
        info(promotion.message)
    if not result.passed:
        raise typer.Exit(2)


def _check_language(language: str | None) -> None:
    from ragexp.compare.summary import LANGUAGES
    from ragexp.errors import ConfigError

    if language is not None and language not in LANGUAGES:
        raise ConfigError(f"--language: expected zh or en, got {language!r}")


def _promotion_tag(promote: bool, promote_tag: str | None, selector_tag: tuple[str, str] | None) -> PromotionTag | None:
    """The tag --promote moves, checked before any work (None without --promote)."""
    from ragexp.compare.promote import parse_tag
    from ragexp.errors import ConfigError

    if promote_tag is not None and not promote:
        raise ConfigError("--promote-tag only says which tag --promote moves; add --promote")
    if not promote:
        return None
    if promote_tag is not None:
        return parse_tag(promote_tag, "--promote-tag")
    if selector_tag is None:
        raise ConfigError("--promote needs a tag to move: --baseline tag:KEY=VALUE, or --promote-tag KEY=VALUE")
    key, value = selector_tag
    return parse_tag(f"{key}={value}", "--baseline tag:KEY=VALUE")


def _choose(store: Store, selector: Selector, given: RunRecord | None) -> list[Selection]:
    """Baseline and candidate, each explained in one line (``Selection.how``)."""
    from ragexp.compare.select import Selection, choose_candidate, describe, resolve_baseline
    from ragexp.errors import ConfigError

    base = resolve_baseline(store, selector, candidate=given)
    cand = choose_candidate(store, base.record) if given is None else Selection(given, f"candidate: {describe(given)}")
    if cand.run_id == base.run_id:
        raise ConfigError(f"the candidate {cand.run_id} is the baseline itself: there is nothing to compare")
    return [base, cand]


@app.command()
def diff(
    baseline: Annotated[
        str, typer.Argument(help="Run id of the baseline, or tag:KEY=VALUE / latest:EXPERIMENT.", show_default=False)
    ],
    candidate: Annotated[str, typer.Argument(help="Run id of the candidate.")],
    top: Annotated[int, typer.Option("--top", min=0, help="How many of the most regressed cases to show.")] = 10,
    tracking_uri: TrackingUri = None,
    allow_incomparable: AllowIncomparable = False,
    resamples: Annotated[
        int, typer.Option("--resamples", min=100, help="Sign-flip draws (p-value and interval).")
    ] = 10_000,
    confidence: Annotated[float, typer.Option("--confidence", min=0.5, max=0.999)] = 0.95,
    seed: Annotated[int, typer.Option("--seed", help="Random seed; the same seed gives the same figures.")] = 0,
    summary: SummaryFile = None,
    language: Language = None,
    ui_url: UiUrl = None,
    as_json: JsonFlag = False,
) -> None:
    """Per-metric and per-case comparison with paired confidence intervals and p-values."""
    from ragexp.cli.outputs import check_writable, write_file
    from ragexp.compare.select import parse_selector

    summary_path = check_writable("--summary", summary)
    _check_language(language)
    selector = parse_selector(baseline)

    from ragexp.compare.data import load_run
    from ragexp.compare.diff import compute_diff
    from ragexp.compare.select import resolve_baseline
    from ragexp.compare.summary import SUMMARY_CASES
    from ragexp.tracking.store import Store

    store = Store(tracking_uri, read_only=True)
    given = store.get_run(candidate)
    chosen = resolve_baseline(store, selector, candidate=given)
    if chosen.asked:
        info(chosen.how)
    if chosen.run_id == given.run_id:
        from ragexp.errors import ConfigError

        raise ConfigError(f"the candidate {given.run_id} is the baseline itself: there is nothing to compare")
    base, cand = load_run(store, chosen.run_id), load_run(store, candidate)
    result = compute_diff(
        base,
        cand,
        resamples=resamples,
        confidence=confidence,
        seed=seed,
        # The summary lists the five most regressed cases whatever --top shows.
        top=max(top, SUMMARY_CASES) if summary_path else top,
        allow_incomparable=allow_incomparable,
    )
    if summary_path:
        from ragexp.compare.summary import Links, diff_summary

        text = diff_summary(
            result,
            language=language or cand.record.params.get("report.language") or "zh",
            links=Links.for_store(store.uri, ui_url),
            chosen=[chosen.asked],
        )
        write_file("--summary", summary_path, text.encode("utf-8"))
    result.cases = result.cases[:top]
    record_comparison(store, cand.run_id, base.run_id, "diff.json", result.to_json())
    if as_json:
        emit_json(result.to_json())
        return
    from ragexp.cli.render import fmt, signed, table, terminal

    print(f"baseline {base.run_id}  candidate {cand.run_id}  ({len(base.case_ids)} cases)")
    if result.differences:
        info(f"warning: compared although not comparable: {'; '.join(result.differences)}")
    rows = []
    for m in result.metrics:
        ci = f"[{signed(m.ci_low)}, {signed(m.ci_high)}]" if m.ci_low is not None and m.ci_high is not None else "—"
        p, delta = fmt(m.p_value), signed(m.delta)
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
                fmt(m.detectable_effect),
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
                "detectable",
            ],
            rows,
            "llrrrlrllr",
        )
    )
    from ragexp.cli.power import print_diff_power

    print_diff_power(result)
    with_ppi = [(m.name, m.ppi) for m in result.metrics if m.ppi is not None]
    if with_ppi:
        print("\nprediction-powered difference (judge corrected by human scores on shared labelled cases):")
        for name, ppi in with_ppi:
            print(
                f"  {terminal(name):22} {ppi.mean:+.4f}  CI [{ppi.ci_low:+.4f}, {ppi.ci_high:+.4f}]  "
                f"judge alone {ppi.judge_mean:+.4f}  ({ppi.n_labelled} labelled of {ppi.n_total} pairs)"
            )
    if result.diagnosis:
        print("\nlikely stage:")
        for line in result.diagnosis:
            print(f"  - {terminal(line)}")
    if result.cases:
        print(f"\nmost regressed cases (top {len(result.cases)}):")
        for case in result.cases:
            changes = ", ".join(
                f"{name} {fmt(v['baseline'], 2)}->{fmt(v['candidate'], 2)}"
                for name, v in case["metrics"].items()
                if v["baseline"] != v["candidate"]
            )
            print(f"  {terminal(case['id'])}: {terminal(changes) or 'errored'}")
            for side in ("baseline", "candidate"):
                did = case[side]
                answer = (did["answer"] or "").replace("\n", " ")[:80]
                error = f"  error: {did['error']}" if did["error"] else ""
                print(terminal(f"    {side:9} retrieved {did['retrieved_ids'][:5]}  answer {answer!r}{error}"))


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

    from ragexp.errors import ConfigError, TrackingError
    from ragexp.report.build import build_report, write_report
    from ragexp.tracking.store import Store

    if language not in (None, "zh", "en"):
        raise ConfigError(f"--language: expected zh or en, got {language!r}")
    store = Store(tracking_uri, read_only=True)
    built, used = build_report(store, run_id, baseline, language, allow_incomparable)
    folder = Path(out) if out else Path("reports") / run_id
    written = write_report(built, folder)
    files = {f"report/{path.relative_to(folder)}": path.read_bytes() for path in written}
    try:
        store.log_files(run_id, files)
    except TrackingError as exc:  # a read-only copy of a store: the report is on disk all the same
        info(f"warning: the report is not logged to run {run_id}: {exc}")
    print(
        f"report ({used}) written to {folder}/report.html and {folder}/report.md; logged to run {run_id} under report/"
    )


@app.command()
def demo(
    store: Annotated[
        str, typer.Option("--store", help="Folder for the demo's own MLflow store; emptied if a previous demo made it.")
    ] = "ragexp-demo",
) -> None:
    """The whole loop on the bundled sample system: baseline, candidate, diff, gate (fails on purpose), report."""
    from pathlib import Path

    from ragexp.cli.demo import run_demo

    run_demo(Path(store))


from ragexp.cli.power import power  # noqa: E402  (a command in its own module)

app.command()(power)
from ragexp.cli.labels import calibrate, label  # noqa: E402

app.command()(label)
app.command()(calibrate)
from ragexp.cli.draft import draft as _draft  # noqa: E402  (a command of its own module)

app.command(name="draft")(_draft)


def main() -> None:
    """Console entry point: one line on stderr and the contract's exit code for any error."""
    # Commands build hundreds of thousands of long-lived objects (cases, rows) and exit soon after;
    # the cyclic collector would rescan them again and again (measured: a third of a 100k-case
    # run, two thirds of a 100k-case diff). Nothing here relies on collecting cycles.
    gc.disable()
    if "--allow-store-upgrade" in sys.argv[1:]:  # any command: read by Store before MLflow opens a store
        sys.argv.remove("--allow-store-upgrade")
        os.environ["RAGEXP_ALLOW_STORE_UPGRADE"] = "1"
    try:
        code = app(standalone_mode=False)
    except RagexpError as exc:
        from ragexp.secrets import scrub

        kind = "interrupted" if exc.exit_code == 130 else "error"
        info(f"ragexp: {kind}: {scrub(str(exc))}")
        sys.exit(exc.exit_code)
    except (typer.Exit, click.exceptions.Exit) as exc:
        code = exc.exit_code
    except (KeyboardInterrupt, typer.Abort, click.exceptions.Abort):
        info("ragexp: interrupted")
        sys.exit(130)
    except (TyperException, click.ClickException) as exc:
        # Usage errors are errors (exit 1; 2 is a failed gate), in one line like every other error.
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        info(f"ragexp: error: {message} (see 'ragexp --help')")
        sys.exit(1)
    if code == 130:  # typer turns a KeyboardInterrupt (or SIGTERM) in a command into a silent 130
        info("ragexp: interrupted")
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
