"""``ragexp label RUN_ID``: a review queue in MLflow with a uniform sample of a run's traces.

One label schema per metric (pass/fail for 0/1 metrics, a number on the metric's range
otherwise; the instruction is the metric's definition in the run's language), created or reused
by name in the run's experiment, and a custom review queue holding the sampled traces. Cases that
already carry a person's label are always kept in the sample, so labelling more never throws
earlier work away; the others are drawn uniformly at random with ``seed``, which keeps the
labelled cases a random subset of the run, as prediction-powered inference requires.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ragexp import artifacts
from ragexp.compare.data import custom_specs
from ragexp.errors import ConfigError, TrackingError
from ragexp.labels import answers as reviewed
from ragexp.metrics.calibration import labelled_metrics
from ragexp.metrics.registry import MetricSpec, lookup
from ragexp.tracking import review_queues as review
from ragexp.tracking.store import TAG_PREFIX

if TYPE_CHECKING:
    from ragexp.tracking.store import RunRecord, Store

QUEUE_NAME_MAX = 250
"""MLflow's width of a queue name (its validation refuses longer ones)."""
INSTRUCTION_MAX = 1000
"""MLflow's longest label-schema instruction."""
RESERVED_QUEUE = "default"
"""MLflow reserves this queue name (any case) for its no-auth user queue."""
PASS_FAIL = {"en": ("Pass", "Fail"), "zh": ("通过", "不通过")}
"""The answers of a pass/fail question, in the run's language."""


@dataclass
class LabelQueue:
    """What ``ragexp label`` made."""

    run_id: str
    experiment_id: str
    queue_id: str
    queue: str
    schemas: dict[str, str]
    """Metric -> label schema id."""
    traces: list[str]
    """Trace ids in the queue, in the run's case order."""
    kept: int
    """Of them, cases that already had a person's label."""
    cases: int
    """The run's traced cases."""
    created: list[str] = field(default_factory=list)
    """Label schemas this call created (the others were reused)."""

    def url(self, base: str | None) -> str | None:
        """The queue on the MLflow UI's Review page (None without a known UI address)."""
        return reviewed.queue_url(base, self.experiment_id, self.queue_id)

    def to_json(self, base: str | None) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "experiment_id": self.experiment_id,
            "queue_id": self.queue_id,
            "queue": self.queue,
            "schemas": self.schemas,
            "traces": len(self.traces),
            "already_labelled": self.kept,
            "cases": self.cases,
            "url": self.url(base),
        }


def choose_metrics(
    record: RunRecord, names: list[str] | None, custom: Mapping[str, MetricSpec] | None = None
) -> list[MetricSpec]:
    """``names`` checked against the run (each a metric of it that people can score); by default
    every such metric of the run: its judge metrics, answer accuracy and the metrics of the
    user's own config (``custom``, as the run recorded them)."""
    run_metrics = [name for name in record.tag("metrics").split(",") if name]
    if names is None:
        chosen = labelled_metrics(run_metrics, custom)
        if not chosen:
            raise ConfigError(
                f"run {record.run_id} has no metric people can label (its metrics: {', '.join(run_metrics)})"
            )
        return [spec for name in chosen if (spec := lookup(name, custom)) is not None]
    specs = []
    for name in names:
        spec = lookup(name, custom)
        if name not in run_metrics:
            raise ConfigError(f"--metrics: run {record.run_id} has no metric '{name}' (its: {', '.join(run_metrics)})")
        if spec is None or not spec.human_labels:
            labellable = ", ".join(labelled_metrics(run_metrics, custom)) or "none"
            raise ConfigError(f"--metrics: '{name}' takes no human label (labellable here: {labellable})")
        specs.append(spec)
    if not specs:
        raise ConfigError("--metrics: give at least one metric name")
    return specs


def check_queue_name(name: str) -> str:
    """Refuse, before any work, a queue name MLflow would refuse."""
    if not name.strip():
        raise ConfigError("--queue: empty name")
    if len(name) > QUEUE_NAME_MAX:
        raise ConfigError(f"--queue: at most {QUEUE_NAME_MAX} characters (MLflow's limit), got {len(name)}")
    if name.strip().lower() == RESERVED_QUEUE:
        raise ConfigError(f"--queue: '{name}' is reserved by MLflow for its default user queue")
    return name


def check_traced(record: RunRecord) -> None:
    """A run is labelled through its traces: all of its cases must have one."""
    scope = record.tag("traces")
    if not scope:
        raise TrackingError(
            f"run {record.run_id} has no traces (it ran with tracking.traces=false): ragexp label puts a run's "
            "traces in the review queue; run again with tracking.traces=true"
        )
    if scope != "all":
        raise TrackingError(
            f"run {record.run_id} traced only its errored and imperfect cases (more cases than "
            "tracking.traces_max_cases): a sample of them is not a random sample of the run; run again with "
            "tracking.traces_max_cases at least the number of cases"
        )


def run_language(store: Store, record: RunRecord) -> str:
    """The run's ``report.language`` (its config.yaml), else the default ``zh``."""
    import yaml

    try:
        config = yaml.safe_load(store.read_artifact(record.run_id, artifacts.CONFIG))
    except Exception:  # an older run without the artifact: the default language
        return "zh"
    language = (config or {}).get("report", {}).get("language") if isinstance(config, dict) else None
    return language if language in ("zh", "en") else "zh"


def schema_input(spec: MetricSpec, label_schemas: Any, language: str) -> Any:
    """Pass/fail for a 0/1 metric, a number on the metric's range otherwise."""
    if spec.pass_fail:
        positive, negative = PASS_FAIL[language]
        return label_schemas.InputPassFail(positive_label=positive, negative_label=negative)
    return label_schemas.InputNumeric(min_value=spec.low, max_value=spec.high)


def ensure_schemas(experiment_id: str, specs: list[MetricSpec], language: str) -> tuple[dict[str, str], list[str]]:
    """(metric -> schema id, names created): one feedback schema per metric, reused by name."""
    label_schemas, _ = review.api()
    ids: dict[str, str] = {}
    created: list[str] = []
    for spec in specs:
        instruction = spec.describe(language)[:INSTRUCTION_MAX]
        found = None
        for schema in review.label_schemas_of(label_schemas, experiment_id):
            if schema.name == spec.name:
                found = schema
                break
        if found is None:
            found = label_schemas.create_label_schema(
                spec.name,
                type="feedback",
                input=schema_input(spec, label_schemas, language),
                instruction=instruction,
                enable_comment=True,
                experiment_id=experiment_id,
            )
            created.append(spec.name)
        ids[spec.name] = found.schema_id
    return ids, created


def sample_traces(infos: list[Any], names: list[str], sample: int | None, seed: int) -> tuple[list[Any], int]:
    """(the traces to queue, in case order; how many already had a label on one of ``names``)."""
    labelled = [any(name in reviewed.human_feedback(info) for name in names) for info in infos]
    kept = int(sum(labelled))
    if sample is None or sample >= len(infos):
        return infos, kept
    rest = [i for i, done in enumerate(labelled) if not done]
    rng = np.random.default_rng(seed)
    drawn = rng.permutation(len(rest))[: max(sample - kept, 0)]
    chosen = sorted({i for i, done in enumerate(labelled) if done} | {rest[int(j)] for j in drawn})
    return [infos[i] for i in chosen], kept


def create_label_queue(
    store: Store,
    run_id: str,
    *,
    metrics: list[str] | None = None,
    sample: int | None = None,
    seed: int = 0,
    queue: str | None = None,
    cases: Collection[str] | None = None,
) -> LabelQueue:
    """Label schemas and a review queue holding (a sample of) the run's traces; ``cases``: the
    traces of these case ids instead of a sample (both runs of a shadow pair, the same cases)."""
    if sample is not None and sample < 1:
        raise ConfigError(f"--sample: expected at least 1 case, got {sample}")
    name = check_queue_name(queue if queue is not None else f"ragexp {run_id}")
    _, review_queues = review.api()
    record = store.get_run(run_id)
    if not record.tag("config_hash"):
        raise TrackingError(f"run {run_id} was not logged by ragexp run (no ragexp.config_hash tag)")
    specs = choose_metrics(record, metrics, custom_specs(store, record))
    check_traced(record)
    language = run_language(store, record)
    infos = [info for info in review.run_traces(store, record) if reviewed.case_id(info) is not None]
    if not infos:
        raise TrackingError(f"run {run_id} has no case traces in {store.uri}: nothing to put in a review queue")
    order = {case: i for i, case in enumerate(_case_order(store, record))}
    infos.sort(key=lambda info: order.get(reviewed.case_id(info) or "", len(order)))
    pool = infos if cases is None else [info for info in infos if reviewed.case_id(info) in cases]
    chosen, kept = sample_traces(pool, [s.name for s in specs], None if cases is not None else sample, seed)
    experiment_id = record.experiment_id
    with review.calls(store, f"creating the review queue of run {run_id}"):
        schemas, created = ensure_schemas(experiment_id, specs, language)
        wanted = list(schemas.values())
        found = _queue_named(review_queues, experiment_id, name)
        if found is None:
            found = review_queues.create_review_queue(
                name, queue_type="custom", schema_ids=wanted, experiment_id=experiment_id
            )
        elif missing := set(wanted) - set(found.schema_ids):
            if _has_items(review_queues, found.queue_id):
                raise ConfigError(
                    f"--queue {name!r}: that queue already holds traces and asks about "
                    f"{_schema_names(schemas, found.schema_ids)}, not {_schema_names(schemas, sorted(missing))}; "
                    "MLflow freezes a queue's questions once it has items: give another --queue name"
                )
            found = review_queues.update_review_queue(found.queue_id, schema_ids=[*found.schema_ids, *sorted(missing)])
        ids = [info.trace_id for info in chosen]
        for start in range(0, len(ids), 100):
            review_queues.add_items_to_review_queue(found.queue_id, item_ids=ids[start : start + 100])
    store.set_tags(run_id, {TAG_PREFIX + review.LABEL_TAG: found.queue_id})
    return LabelQueue(run_id, experiment_id, found.queue_id, name, schemas, ids, kept, len(infos), created)


def _case_order(store: Store, record: RunRecord) -> list[str]:
    from ragexp.compare.data import load_run

    return load_run(store, record).case_ids


def _queue_named(review_queues: Any, experiment_id: str, name: str) -> Any:
    token = None
    while True:
        page = review_queues.list_review_queues(experiment_id=experiment_id, max_results=100, page_token=token)
        for item in page:
            if item.name == name:
                return item
        token = page.token
        if not token or not page:
            return None


def _has_items(review_queues: Any, queue_id: str) -> bool:
    return bool(list(review_queues.list_review_queue_items(queue_id, max_results=1)))


def _schema_names(schemas: dict[str, str], ids: list[str]) -> str:
    by_id = {schema_id: name for name, schema_id in schemas.items()}
    return ", ".join(by_id.get(i, i) for i in ids) or "nothing"
