"""``ragexp run``: plan (validate everything), then execute (evaluate, score, log).

Everything that can be wrong with the input is found in :func:`plan_run`, before an MLflow run
exists, so bad input never leaves a half-written run behind.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from ragexp import __version__
from ragexp.config.compose import PROJECT_ROOT
from ragexp.config.identity import config_hash, flatten, resolved_config
from ragexp.config.models import RagexpConfig
from ragexp.datasets.loader import Dataset, load_dataset, resolve_path
from ragexp.errors import MetricError
from ragexp.metrics.offline import build_inputs
from ragexp.metrics.registry import MetricSpec, check_requirements, parse_metric_names
from ragexp.metrics.summary import score_cases, summarize
from ragexp.progress import Progress
from ragexp.providers.base import Provider, RunSettings, build_provider
from ragexp.records import CaseResult
from ragexp.tracking.store import FAILED, FINISHED, KILLED, TAG_PREFIX, Store, write_table

TEXT_IN_TABLE = 300


@dataclass
class Plan:
    """A validated run, ready to execute."""

    config: RagexpConfig
    dataset: Dataset
    specs: list[MetricSpec]
    provider: Provider
    config_hash: str
    judge: str

    def tags(self) -> dict[str, str]:
        cfg = self.config
        return {
            TAG_PREFIX + "config_hash": self.config_hash,
            TAG_PREFIX + "dataset_hash": self.dataset.dataset_hash,
            TAG_PREFIX + "dataset": cfg.dataset.name,
            TAG_PREFIX + "provider": cfg.provider.name,
            TAG_PREFIX + "metrics": ",".join(spec.name for spec in self.specs),
            TAG_PREFIX + "metric_set": cfg.metrics.set,
            TAG_PREFIX + "k": str(cfg.k),
            TAG_PREFIX + "judge": self.judge,
            TAG_PREFIX + "case_count": str(len(self.dataset.cases)),
            TAG_PREFIX + "version": __version__,
        }


@dataclass
class RunOutcome:
    run_id: str
    experiment: str
    tracking_uri: str
    config_hash: str
    dataset_hash: str
    case_count: int
    error_count: int
    summary: dict[str, float | None]
    scored: dict[str, int]
    """Metric -> number of cases with a score."""
    specs: list[MetricSpec]

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "experiment": self.experiment,
            "config_hash": self.config_hash,
            "dataset_hash": self.dataset_hash,
            "case_count": self.case_count,
            "error_count": self.error_count,
            "summary": self.summary,
        }


def plan_run(config: RagexpConfig) -> Plan:
    """Load and check everything a run needs; raises a RagexpError on any bad input."""
    specs = parse_metric_names(config.metrics.names)
    path = resolve_path(config.dataset.path, PROJECT_ROOT)
    dataset = load_dataset(path, config.dataset.format)
    judge_specs = [spec.name for spec in specs if spec.judge]
    if judge_specs and config.provider.judge is None:
        raise MetricError(
            f"metric '{judge_specs[0]}' needs an LLM judge, and provider {config.provider.name} has none "
            "(use provider=npu or set provider.judge)"
        )
    settings = RunSettings(k=config.k, concurrency=config.concurrency, dataset=config.dataset)
    provider = build_provider(config.provider.system, settings)
    check_requirements(
        specs,
        dataset.label_fields,
        provider.output_fields(dataset),
        dataset=config.dataset.name,
        provider=config.provider.name,
    )
    provider.preflight(dataset)
    return Plan(config, dataset, specs, provider, config_hash(config, dataset.file_sha256), judge="none")


def execute(plan: Plan, store: Store) -> RunOutcome:
    """Create the MLflow run, evaluate every case, score, log; mark the run's real status."""
    cfg = plan.config
    params = flatten(resolved_config(cfg))
    run_name = f"{cfg.provider.name}-{cfg.dataset.name}-k{cfg.k}"
    run_id = store.create_run(cfg.experiment, run_name, plan.tags(), params)
    status = FAILED
    try:
        results = _evaluate(plan)
        outcome = _score_and_log(plan, store, run_id, results)
        status = FINISHED
        return outcome
    except KeyboardInterrupt:
        status = KILLED
        store.set_tags(run_id, {TAG_PREFIX + "status": "interrupted"})
        raise
    finally:
        store.end_run(run_id, status)


def _evaluate(plan: Plan) -> list[CaseResult]:
    cases = plan.dataset.cases
    results: list[CaseResult | None] = [None] * len(cases)
    progress = Progress(len(cases), "evaluating", enabled=plan.config.progress)

    def on_result(index: int, result: CaseResult) -> None:
        results[index] = result
        progress.advance(error=result.error is not None)

    try:
        plan.provider.run(cases, on_result)
    finally:
        progress.close()
    missing = [cases[i].id for i, result in enumerate(results) if result is None]
    if missing:  # a provider bug, not a user error: never score a missing case as anything
        raise RuntimeError(f"provider {plan.config.provider.name} returned no result for case {missing[0]}")
    return [result for result in results if result is not None]


def _score_and_log(plan: Plan, store: Store, run_id: str, results: list[CaseResult]) -> RunOutcome:
    cfg = plan.config
    cases = plan.dataset.cases
    inputs = build_inputs(cases, results, cfg.k, cfg.dataset.refusal_phrases)
    scores = score_cases(plan.specs, inputs)
    errored = np.array([not r.ok or bool(r.metric_errors) for r in results], dtype=bool)
    summary = summarize(plan.specs, scores, inputs, errored)
    error_count = int(errored.sum())

    metrics = {name: value for name, value in summary.items() if value is not None}
    metrics["case_count"] = float(len(cases))
    metrics["error_count"] = float(error_count)
    store.log_metrics(run_id, metrics)

    columns = {name: _nullable(values) for name, values in scores.items()}
    latency = _nullable(inputs.latency)
    with tempfile.TemporaryDirectory(prefix="ragexp-run-") as tmp:
        folder = Path(tmp)
        _write_cases_jsonl(folder / "cases.jsonl", plan, results, columns, latency)
        (folder / "config.yaml").write_bytes(_yaml(resolved_config(cfg)))
        (folder / "summary.json").write_text(
            json.dumps(
                {
                    "summary": summary,
                    "case_count": len(cases),
                    "error_count": error_count,
                    "config_hash": plan.config_hash,
                    "dataset_hash": plan.dataset.dataset_hash,
                },
                indent=2,
                ensure_ascii=False,
            ),
            encoding="utf-8",
        )
        write_table(folder / "cases_table.json", _table(plan, results, columns, latency))
        (folder / "scores.json").write_bytes(
            orjson.dumps(
                {
                    "case_ids": [case.id for case in cases],
                    "unanswerable": [case.unanswerable for case in cases],
                    "errored": errored.tolist(),
                    "latency_seconds": latency,
                    "metrics": columns,
                }
            )
        )
        store.log_dir(run_id, folder, tables=["cases_table.json"])
    scored = {name: int(np.isfinite(values).sum()) for name, values in scores.items()}
    return RunOutcome(
        run_id,
        cfg.experiment,
        store.uri,
        plan.config_hash,
        plan.dataset.dataset_hash,
        len(cases),
        error_count,
        summary,
        scored,
        plan.specs,
    )


def _nullable(values: np.ndarray) -> list[float | None]:
    return [None if value != value else value for value in values.tolist()]


def _write_cases_jsonl(
    path: Path,
    plan: Plan,
    results: Sequence[CaseResult],
    columns: dict[str, list[float | None]],
    latency: list[float | None],
) -> None:
    names = list(columns)
    with path.open("wb") as out:
        for i, (case, result) in enumerate(zip(plan.dataset.cases, results, strict=True)):
            row: dict[str, Any] = {
                "id": case.id,
                "unanswerable": case.unanswerable,
                "metrics": {name: columns[name][i] for name in names},
                "error": _error_text(result),
                "output": result.output.to_json() if result.output is not None else None,
                "latency_seconds": latency[i],
            }
            if result.metric_errors:
                row["metric_errors"] = result.metric_errors
            out.write(orjson.dumps(row, option=orjson.OPT_APPEND_NEWLINE))


def _error_text(result: CaseResult) -> str | None:
    if result.error is not None:
        return result.error
    if result.metric_errors:
        return "; ".join(f"{name}: {reason}" for name, reason in result.metric_errors.items())
    return None


def _table(
    plan: Plan, results: Sequence[CaseResult], columns: dict[str, list[float | None]], latency: list[float | None]
) -> dict[str, list[Any]]:
    cases = plan.dataset.cases
    return {
        "id": [case.id for case in cases],
        "question": [case.question[:TEXT_IN_TABLE] for case in cases],
        "answer": [(r.output.answer[:TEXT_IN_TABLE] if r.output else None) for r in results],
        "error": [_error_text(r) for r in results],
        **columns,
        "latency_seconds": latency,
    }


def _yaml(data: dict[str, Any]) -> bytes:
    import yaml

    text: str = yaml.safe_dump(data, allow_unicode=True, sort_keys=False)
    return text.encode("utf-8")
