"""``ragexp run``: plan (validate everything), then execute (evaluate, score, log).

Everything that can be wrong with the input is found in :func:`plan_run`, before an MLflow run
exists, so bad input never leaves a half-written run behind.
"""

from __future__ import annotations

import contextlib
import dataclasses
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from ragexp import __version__, limits
from ragexp.checkpoint import Checkpoint, SpaceReserve, checkpoint_path, read_checkpoint, run_lock
from ragexp.config.compose import compose, metric_sets
from ragexp.config.identity import config_hash, resolved_config, run_params
from ragexp.config.models import RagexpConfig
from ragexp.config.tracking import chosen_uri
from ragexp.conversations import ask_in_turns, check_history, complete, histories
from ragexp.datasets.audit import Finding, audit, load_chunks, shares_ids
from ragexp.datasets.evidence import resolve_evidence, shares_documents
from ragexp.datasets.loader import Dataset, load_dataset, only_cases, resolve_path
from ragexp.datasets.screening import DRAFT_TAG, refuse_unscreened, unscreened
from ragexp.errors import (
    AllCasesErrored,
    ConfigError,
    Interrupted,
    MetricError,
    NotFinished,
    RagexpError,
    StorageError,
    StoreLost,
    StoreUnreachable,
)
from ragexp.metrics.calibration import Trust, assess
from ragexp.metrics.canaries import Canaries, agreement_metrics, load_canaries
from ragexp.metrics.canaries import Graded as GradedCanaries
from ragexp.metrics.canaries import grade as grade_canaries
from ragexp.metrics.conversation import ConversationFigures, score_conversations
from ragexp.metrics.cost import COST, check_prices, run_cost, system_tokens, with_cost
from ragexp.metrics.custom import CustomMetrics, load_custom, score_python_guarded
from ragexp.metrics.evidence import returned_documents, textless, unmatchable_gold
from ragexp.metrics.hops import count_hops, fill_hop_rationales, hop_columns, hop_scores
from ragexp.metrics.judge import identity as judge_identity
from ragexp.metrics.missed import Missed, missed_cases
from ragexp.metrics.offline import OfflineInputs, build_inputs, nearest_rank
from ragexp.metrics.population import Population, population
from ragexp.metrics.reasons import fill_rationales
from ragexp.metrics.registry import (
    MetricSpec,
    can_score,
    check_evidence,
    check_requirements,
    needed_outputs,
    parse_metric_names,
    with_hop_metrics,
    with_stream_metrics,
)
from ragexp.metrics.summary import score_cases, summarize
from ragexp.outputs import info
from ragexp.paths import data_roots, packaged_trees
from ragexp.progress import Phase, Progress
from ragexp.providers.base import Provider, RunSettings, build_provider
from ragexp.records import Case, CaseResult
from ragexp.secrets import holds, register_url, scrub
from ragexp.workflows.traffic import Traffic, load_traffic, traffic_json

if TYPE_CHECKING:
    from ragexp.case_traces import TracePlan
    from ragexp.metrics.judge.scorer import Judging

from ragexp import artifacts
from ragexp.artifacts import error_text, nullable
from ragexp.tracking.store import FAILED, FINISHED, KILLED, TAG_PREFIX, Store

TEXT_IN_TABLE = 300
SHORT_HASH = 12
"""Characters of the config hash the CLI prints, tags and searches by."""
CHECKPOINT_ARTIFACT = "checkpoint/results.jsonl"
TIMING_PREFIX = "timing."
TIMING_FIGURES = ("p50_seconds", "p95_seconds", "cases")
"""The figures logged per stage, as ``timing.<stage>.<figure>``."""


@dataclass
class Plan:
    """A validated run, ready to execute."""

    config: RagexpConfig
    dataset: Dataset
    specs: list[MetricSpec]
    provider: Provider
    config_hash: str
    judge: str
    """Judge identity (``none`` without judge metrics)."""
    scorer: Judging | None = None
    findings: list[Finding] | None = None
    """Label audit against ``dataset.corpus`` (None: no corpus configured)."""
    custom: CustomMetrics = field(default_factory=CustomMetrics)
    """The metrics of ``metrics.custom``, their Python functions loaded (their specs are in ``specs`` too)."""
    canaries: Canaries | None = None
    """``judge.canaries``, read and checked (None: none configured, or no judge metric)."""
    traffic: Traffic | None = None
    """What reading production traces found (``dataset=traces``); None for a dataset file."""

    def run_name(self) -> str:
        """The configured name, else the short config hash, then provider, dataset and k (the end
        cut if the names are long). The hash comes first: the MLflow UI's run lists show only a
        name's first few characters, and two runs of one system differ in their hash alone."""
        cfg = self.config
        if cfg.run_name:
            return cfg.run_name
        return f"{self.config_hash[:SHORT_HASH]}-{cfg.provider.name}-{cfg.dataset.name}-k{cfg.k}"[
            : limits.RUN_NAME.chars
        ]

    def tags(self) -> dict[str, str]:
        cfg = self.config
        audit = {} if self.findings is None else {TAG_PREFIX + "audit.findings": str(len(self.findings))}
        if self.traffic is not None:
            audit[TAG_PREFIX + "traffic.experiment"] = self.traffic.experiment
            audit[TAG_PREFIX + "traffic.unreadable"] = str(len(self.traffic.unreadable))
        return {
            **audit,
            TAG_PREFIX + "cases_hash": self.dataset.cases_hash,
            TAG_PREFIX + "config_hash": self.config_hash,
            TAG_PREFIX + "config_hash_short": self.config_hash[:SHORT_HASH],
            TAG_PREFIX + "dataset_hash": self.dataset.dataset_hash,
            TAG_PREFIX + "dataset": cfg.dataset.name,
            TAG_PREFIX + "provider": cfg.provider.name,
            TAG_PREFIX + "metrics": ",".join(spec.name for spec in self.specs),
            TAG_PREFIX + "metric_set": cfg.metrics.set,
            TAG_PREFIX + "k": str(cfg.k),
            TAG_PREFIX + "judge": self.judge,
            TAG_PREFIX + "case_count": str(len(self.dataset.cases)),
            TAG_PREFIX + "version": __version__,
            # The language the cases' rationales are written in (report.language), for readers
            # that print them in a language of their own.
            TAG_PREFIX + "language": cfg.report.language,
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
    scored: dict[str, Population]
    """Per-case metric -> the cases its value covers and how many of them have a score."""
    specs: list[MetricSpec]
    timings: dict[str, dict[str, float]]
    """Stage -> p50/p95 seconds, from the timings the system reported."""
    trust: Trust = field(default_factory=lambda: Trust({}, {}))
    """Judge calibration and prediction-powered means from the dataset's human scores."""
    missed: Missed = field(default_factory=Missed)
    """The cases scored below full marks (the first few described)."""
    conversations: ConversationFigures | None = None
    labels_note: str | None = None
    """The dataset's human scores this run left out and what to do (shown with the human-score figures)."""
    """Per-conversation figures (None: the dataset has no conversation)."""

    def to_json(self) -> dict[str, Any]:
        extra = {} if self.conversations is None else {"conversations": self.conversations.to_json()}
        return {
            "run_id": self.run_id,
            "experiment": self.experiment,
            "config_hash": self.config_hash,
            "dataset_hash": self.dataset_hash,
            "case_count": self.case_count,
            "error_count": self.error_count,
            "summary": self.summary,
            "populations": {name: population.to_json() for name, population in self.scored.items()},
            **extra,
            **self.trust.to_json(),
            "labels_note": self.labels_note,
        }


def plan_run(
    config: RagexpConfig, state_dir: Path | None = None, *, store: Store | None = None, traffic: Traffic | None = None
) -> Plan:
    """Load and check everything a run needs; raises a RagexpError on any bad input.

    ``state_dir`` holds the judge's cache and adapted prompts (the tracking store's folder).
    With ``dataset.experiment`` the cases are that experiment's traces, read from ``store`` (else
    the configured one), unless ``traffic`` gives them already read (a shadow's two runs share one
    sample).
    """
    custom = load_custom(config.metrics.custom)
    specs = with_cost(parse_metric_names(config.metrics.names, custom.specs), config.cost)
    check_store_fields(config)
    if config.dataset.experiment is not None and traffic is None:
        traffic = load_traffic(config.dataset, store or Store(config.tracking.uri, timeout_s=config.tracking.timeout_s))
        info(traffic.describe())
    if traffic is not None:
        dataset = traffic.dataset
    else:
        dataset = load_dataset(resolve_path(config.dataset.path, data_roots()), config.dataset.format)
    if config.dataset.case_ids is not None:
        dataset = only_cases(dataset, config.dataset.case_ids)
    corpus = None
    if config.dataset.corpus is not None:
        corpus = load_chunks(resolve_path(config.dataset.corpus, data_roots()))
    documents = corpus
    if corpus is not None and not shares_documents(dataset, corpus):
        info(f"warning: evidence not checked: the configured corpus {corpus.path} holds none of the documents it names")
        documents = None
    dataset = resolve_evidence(dataset, documents, config.dataset.match, corpus_key="dataset.corpus")
    check_history(dataset.cases, config.conversation.history, str(dataset.path))
    provider = check_config(config, dataset, specs)
    check_no_secret_names(config)  # the system's secrets are read: before it is contacted
    specs = with_stream_metrics(specs, provider.output_fields(dataset))
    specs = with_hop_metrics(specs, dataset.hop_count, provider.output_fields(dataset))
    if dataset.hop_count and not any(spec.hop for spec in specs):
        info(
            f"warning: the cases of {config.dataset.name} give gold per hop, and provider {config.provider.name} "
            "reports no retrieval calls (response.retrievals): only the case-level metrics are scored"
        )
    provider.preflight(dataset)
    scorer, judge = None, "none"
    if any(spec.judge for spec in specs) and config.provider.judge is not None:
        from ragexp.metrics.judge.scorer import JudgeScorer

        scorer = JudgeScorer(config.provider.judge, specs, state_dir or Path("mlruns"), warn=info)
        scorer.preflight()
        judge = scorer.identity
        limits.check(limits.TAG_VALUE, judge, "provider.judge (its identity, the ragexp.judge tag)")
    findings = None
    # A corpus sharing no id with the cases belongs to another set (a dataset.path override under
    # a group that names its corpus): no audit, rather than one finding per case.
    if corpus is not None and shares_ids(dataset, corpus.texts):
        findings = audit(dataset, corpus.texts)
    canaries = None
    if scorer is not None and config.provider.judge is not None and config.provider.judge.canaries:
        canaries = load_canaries(config.provider.judge.canaries)
    check_no_secret_names(config)  # and the judge's
    digest = config_hash(config, dataset.file_sha256, judge, provider.identity(), custom.identities())
    return Plan(config, dataset, specs, provider, digest, judge, scorer, findings, custom, canaries, traffic)


def check_config(
    config: RagexpConfig, dataset: Dataset, specs: Sequence[MetricSpec], *, concurrency: int | None = None
) -> Provider:
    """Every check of a run's config against its dataset that contacts nothing and runs no
    code of the system (``run`` makes them, and ``validate`` without ``--probe``): a judge for
    the judge metrics, the system's own config (expressions, templates, secrets, files), and
    each metric's fields against what the dataset and the system give. The provider it built."""
    judge_specs = [spec for spec in specs if spec.judge]
    if judge_specs and config.provider.judge is None:
        first = judge_specs[0]
        who = f"{first.custom.key}: the rubric '{first.name}'" if first.custom else f"metric '{first.name}'"
        raise MetricError(
            f"{who} needs an LLM judge, and provider {config.provider.name} has none "
            "(use provider=npu, provider=replay_judge or provider=http_judge, or set provider.judge)"
        )
    settings = RunSettings(
        k=config.k,
        concurrency=config.concurrency if concurrency is None else concurrency,
        dataset=config.dataset,
        outputs=needed_outputs(specs),
    )
    provider = build_provider(config.provider.system, settings)
    outputs = provider.output_fields(dataset)
    if dataset.has_evidence:
        outputs = check_evidence(
            specs, dataset.cases, outputs, dataset=config.dataset.name, provider=config.provider.name
        )
    try:
        check_requirements(
            specs, dataset.label_fields, outputs, dataset=config.dataset.name, provider=config.provider.name
        )
    except MetricError as exc:
        fit = metrics_that_fit(config, specs, dataset.label_fields, outputs)
        raise MetricError(f"{exc}{fit}{datasets_that_fit(config, specs, provider)}") from None
    check_prices(
        config.cost,
        reports_usage=provider.reports_usage(),
        judged=bool(judge_specs),
        provider=config.provider.name,
    )
    provider.check(dataset)
    return provider


def metrics_that_fit(
    config: RagexpConfig, specs: Sequence[MetricSpec], labels: frozenset[str], outputs: frozenset[str]
) -> str:
    """The fix for a metric set the dataset or system cannot be scored on: the named sets that
    fit, and the chosen metrics that do."""
    judged = config.provider.judge is not None

    def fits(chosen: Sequence[MetricSpec]) -> bool:
        return all(can_score(spec, labels, outputs) and (judged or not spec.judge) for spec in chosen)

    unfit_own = [spec for spec in specs if spec.custom is not None and not fits([spec])]
    if unfit_own:  # a named set would not help: the metric of the user's is what cannot be scored
        return f"; leave {unfit_own[0].custom.key} out of metrics.custom for this system"  # type: ignore[union-attr]
    ways = []
    for name, names in metric_sets().items():
        try:
            if fits(parse_metric_names(list(names))):
                ways.append(f"metrics={name}")
        except MetricError:
            continue
    kept = [spec.name for spec in specs if fits([spec]) and spec.custom is None]
    if kept and len(kept) < len(specs):
        ways.append(f"metrics.names=[{','.join(kept)}]")
    return f"; metrics that fit: {' or '.join(ways)}" if ways else ""


def datasets_that_fit(config: RagexpConfig, specs: Sequence[MetricSpec], provider: Provider) -> str:
    """The other fix, when the dataset is one of the bundled ones: the other bundled datasets
    (``dataset/`` options) on which this system can score every chosen metric, e.g. for a
    replaying preset on the default set, which records no outputs."""
    import yaml

    trees = packaged_trees()
    if not any((tree / "dataset" / f"{config.dataset.name}.yaml").is_file() for tree in trees):
        return ""  # a set of the user's own: a bundled sample set is no fix for it
    judged = config.provider.judge is not None
    ways = []
    for tree in trees:
        for option in sorted((tree / "dataset").glob("*.yaml")):
            try:
                group = yaml.safe_load(option.read_text(encoding="utf-8"))
                if group.get("name") == config.dataset.name:
                    continue
                other = load_dataset(resolve_path(group["path"], data_roots()), group.get("format", "auto"))
                outputs, labels = provider.output_fields(other), other.label_fields
                if not all(can_score(spec, labels, outputs) and (judged or not spec.judge) for spec in specs):
                    continue
                provider.check(other)
            except (RagexpError, OSError, KeyError, AttributeError, yaml.YAMLError):
                continue  # a dataset that cannot be read or scored here is no fix
            ways.append(f"dataset={option.stem}")
    return f"; datasets that fit: {' or '.join(ways)}" if ways else ""


def check_store_fields(config: RagexpConfig) -> None:
    """Refuse, naming the config key, every configured value an MLflow store would refuse as
    the run's experiment, name, tags, params or dataset name (before anything is evaluated)."""
    limits.check(limits.EXPERIMENT_NAME, config.experiment, "experiment")
    if config.run_name:
        limits.check(limits.RUN_NAME, config.run_name, "run_name")
    limits.check(limits.DATASET_NAME, config.dataset.name, "dataset.name")
    for key, value in config.tags.items():
        limits.check(limits.TAG_KEY, key, f"tags.{key} (the tag's name)")
        limits.check(limits.TAG_VALUE, str(value), f"tags.{key}")
    for name, text in {"provider.name": config.provider.name, "metrics.set": config.metrics.set}.items():
        limits.check(limits.TAG_VALUE, text, name)
    for key, value in run_params(config).items():
        limits.check(limits.PARAM_KEY, key, f"{key} (an MLflow param name)")
        # Longer values are cut to the param's length when logged (the config.yaml artifact has them whole).
        limits.check(limits.PARAM_VALUE, value[: limits.PARAM_VALUE.chars], key)


def check_no_secret_names(config: RagexpConfig) -> None:
    """Refuse an experiment name that holds a secret's value (``${oc.env:...}`` of a variable the
    config also reads as a credential): masked it would merge with other experiments, in clear it
    would show the secret on every page. Called once the secrets are read (the system built, the
    judge built); everything else a run records is masked instead."""
    if holds(config.experiment):
        raise ConfigError(
            f"experiment: {scrub(config.experiment)!r} holds the value of a secret this config reads "
            "from the environment (*** above); name the experiment without it"
        )


def timing_prefix(stage: str) -> str:
    """The metric key prefix of a stage's timings: ``timing.<stage>`` when MLflow takes the name
    as part of a key, else its safe characters and a short hash (see :func:`limits.safe_segment`);
    the stage's own name is in the run's ``timings.json``."""
    longest = max(map(len, TIMING_FIGURES)) + 1
    budget = limits.METRIC_KEY.chars - len(TIMING_PREFIX) - longest
    return TIMING_PREFIX + limits.safe_segment(stage, budget)


def finish_run(store: Store, run_id: str) -> None:
    """Mark the run finished, the call retried within the store's ``timeout_s``: a run whose data
    is complete is never left RUNNING by one failed call, nor said to be finished when it is not."""
    from ragexp.transport import backoff

    deadline = time.monotonic() + store.timeout_s
    attempt = 0
    while True:
        try:
            store.end_run(run_id, FINISHED)
            return
        except RagexpError as exc:
            pause = backoff(0.5, attempt)
            if time.monotonic() + pause >= deadline:
                raise NotFinished(
                    f"run {run_id}: every case was evaluated and logged (its data is complete), but the store did "
                    f"not mark it finished ({exc}); it stays RUNNING until a resume finishes it, which asks no case "
                    "again",
                    run_id,
                ) from None
        time.sleep(pause)
        attempt += 1


def execute(
    plan: Plan,
    store: Store,
    *,
    resume: str | None = None,
    retry_errors: bool = False,
    parent: str | None = None,
    tags: dict[str, str] | None = None,
    evaluate: Evaluate | None = None,
) -> RunOutcome:
    """Create (or resume) the MLflow run, evaluate every case, score, log; mark the real status.

    ``parent`` nests the run under another (a sweep) in the MLflow UI; ``tags`` are added to it.
    ``evaluate`` replaces the evaluation of every case (``run --until-decided`` evaluates batches
    until the gate is decided): it returns the plan of the cases it evaluated, and their results.
    While a process evaluates a run it holds the run's lock: a second ``--resume`` is refused.
    """
    cfg = plan.config
    if resume is None:
        run_name = plan.run_name()
        user_tags = {
            key: str(value).lower() if isinstance(value, bool) else str(value) for key, value in cfg.tags.items()
        }
        all_tags = {**user_tags, **plan.tags(), **(tags or {})}
        if parent is not None:
            all_tags["mlflow.parentRunId"] = parent
        run_id = store.create_run(cfg.experiment, run_name, all_tags, run_params(cfg))
    else:
        run_id = resume
    with run_lock(store.state_dir(), run_id), SpaceReserve(store.sqlite_folder()) as reserve:
        done = _resume_state(plan, store, resume, retry_errors) if resume is not None else {}
        if resume is not None:
            store.set_running(run_id)
        return _execute(plan, store, run_id, done, resumed=resume is not None, reserve=reserve, evaluate=evaluate)


@dataclass(frozen=True)
class Evaluation:
    """A finished ``ragexp run``: what was planned and what came of it."""

    plan: Plan
    outcome: RunOutcome


def run_config(
    overrides: Sequence[str],
    *,
    resume: str | None = None,
    retry_errors: bool = False,
    allow_draft: bool = False,
    tracking_uri: str | None = None,
) -> Evaluation:
    """``ragexp run``: compose the config, plan (every check before an MLflow run exists),
    evaluate every case and log one run; ``resume`` continues an interrupted one;
    ``tracking_uri`` is ``--tracking-uri`` (:mod:`ragexp.config.tracking`)."""
    if retry_errors and not resume:
        raise ConfigError("--retry-errors goes with --resume RUN_ID")
    config = compose(list(overrides))
    uri = chosen_uri(tracking_uri, overrides, config.tracking.uri)
    store = Store(uri, timeout_s=config.tracking.timeout_s)
    register_url(store.uri)  # a tracking server's password is masked wherever a secret is
    if resume is not None and store.get_run(resume).tag("sequential.total"):
        # Its cases are a prefix of a seeded order, decided batch by batch: asking the rest at
        # once would leave its ragexp.sequential.* tags describing a stop it no longer made.
        raise ConfigError(
            f"run {resume} is a run of --until-decided: continue it with --until-decided --resume {resume}"
        )
    with Phase("loading and checking the dataset, the system and the judge", enabled=config.progress):
        plan = plan_run(config, store.state_dir(), store=store)
    if not allow_draft:
        refuse_unscreened(plan.dataset)
    draft_tags = {DRAFT_TAG: "true"} if unscreened(plan.dataset) else None
    return Evaluation(plan, execute(plan, store, resume=resume, retry_errors=retry_errors, tags=draft_tags))


class Evaluate(Protocol):
    """An evaluation of a run's cases other than all of them at once (see :func:`execute`)."""

    def __call__(
        self,
        plan: Plan,
        run_id: str,
        done: dict[str, CaseResult],
        checkpoint: Checkpoint | None,
        arrived: list[CaseResult],
    ) -> tuple[Plan, list[CaseResult]]:
        """(plan, run id, results kept from a stopped attempt, checkpoint, the new results as they
        arrive) -> (the plan of the cases evaluated, their results in that plan's order)."""
        ...


def _execute(
    plan: Plan,
    store: Store,
    run_id: str,
    done: dict[str, CaseResult],
    *,
    resumed: bool,
    reserve: SpaceReserve,
    evaluate: Evaluate | None = None,
) -> RunOutcome:
    checkpoint = Checkpoint(checkpoint_path(store.state_dir(), run_id)) if plan.provider.remote else None
    status = FAILED
    store_alive = True
    ended = False
    arrived: list[CaseResult] = []
    try:
        if not resumed:
            _log_dataset(plan, store, run_id)
        started = time.perf_counter()
        logged = plan
        if evaluate is None:
            results = _evaluate(plan, done, checkpoint, arrived)
        else:
            logged, results = evaluate(plan, run_id, done, checkpoint, arrived)
        store.log_metrics(run_id, {"evaluation_seconds": time.perf_counter() - started})
        outcome = _score_and_log(logged, store, run_id, results, resumed=resumed)
        if outcome.case_count and outcome.error_count == outcome.case_count:
            first = next(r for r in results if r.error or r.metric_errors)
            raise AllCasesErrored(
                f"every case errored ({outcome.error_count} of {outcome.case_count}; the first: "
                f"{error_text(first)}); run {run_id} is logged and marked failed",
                outcome,
            )
        store.set_tags(run_id, {TAG_PREFIX + "status": "finished"})
        store.delete_tags(run_id, [TAG_PREFIX + "stopped_because"])
        status = FINISHED
        finish_run(store, run_id)
        ended = True
        if checkpoint is not None:  # only now: a run not marked finished is resumed from it
            checkpoint.remove()
        return outcome
    except KeyboardInterrupt:
        status = KILLED
        store_alive = _save_for_resume(store, run_id, checkpoint, "interrupted", "interrupted (Ctrl-C or SIGTERM)")
        raise Interrupted(run_id, len(done) + len(arrived), len(plan.dataset.cases)) from None
    except NotFinished:
        store_alive = False  # its end was tried, within the store's timeout; the checkpoint stays
        raise
    except StoreUnreachable as exc:
        # The store stopped answering: every further call would wait for its own timeout.
        store_alive = False
        kept = f"; results so far are kept in {checkpoint.path}" if checkpoint is not None else ""
        raise StoreLost(f"{exc}{kept}; when the store answers again", run_id) from None
    except RagexpError as exc:
        status_tag = "failed" if isinstance(exc, AllCasesErrored) else "aborted"
        if isinstance(exc, StorageError):
            # The disk is full: the reserve gives room to mark the run; the checkpoint stays local.
            reserve.release()
            store_alive = _save_for_resume(store, run_id, None, status_tag, str(exc))
        else:
            store_alive = _save_for_resume(store, run_id, checkpoint, status_tag, str(exc))
        raise
    finally:
        if checkpoint is not None:
            checkpoint.close()
        if store_alive and not ended:
            with contextlib.suppress(RagexpError):  # the first error is the one worth a line
                store.end_run(run_id, status)


def _log_dataset(plan: Plan, store: Store, run_id: str) -> None:
    dataset = plan.dataset
    store.log_dataset(
        run_id,
        name=plan.config.dataset.name,
        digest=dataset.dataset_hash[:SHORT_HASH],
        source=str(dataset.path),
        profile={
            "dataset_hash": dataset.dataset_hash,
            "cases": len(dataset.cases),
            "answerable": dataset.answerable_count,
            "format": dataset.format,
        },
    )
    if plan.traffic is not None:
        store.log_files(run_id, {TRAFFIC_ARTIFACT: traffic_json(plan.traffic)})


TRAFFIC_ARTIFACT = "traffic.json"


def _save_for_resume(store: Store, run_id: str, checkpoint: Checkpoint | None, status: str, reason: str) -> bool:
    """Mark why the run stopped and upload what was done, so another machine can resume it too.

    False when the store stopped answering meanwhile: nothing more is sent to it."""
    try:
        store.set_tags(
            run_id,
            {
                TAG_PREFIX + "status": status,
                TAG_PREFIX + "stopped_because": limits.fit(limits.TAG_VALUE, scrub(reason)[:500]),
            },
        )
        if checkpoint is not None:
            checkpoint.close()
            if checkpoint.path.exists():
                store.log_files(run_id, {CHECKPOINT_ARTIFACT: checkpoint.path.read_bytes()})
    except StoreUnreachable:
        return False
    except RagexpError:  # a full disk: the reason is already on its way
        pass
    return True


def _resume_state(plan: Plan, store: Store, run_id: str, retry_errors: bool) -> dict[str, CaseResult]:
    """What a resumed run keeps: the checkpoint's results, less those asked again.

    Transport failures (refused, timed out, 5xx after retries) say nothing about a case and are
    always asked again; other errors (a contract violation, HTTP 4xx) only with ``retry_errors``.
    """
    record = store.get_run(run_id)
    if record.status == FINISHED:
        raise RagexpError(f"run {run_id} is finished: there is nothing to resume")
    if record.tag("config_hash") != plan.config_hash:
        raise ConfigError(
            f"run {run_id} was made with config hash {record.tag('config_hash')[:12]}, these overrides give "
            f"{plan.config_hash[:12]}: resume with the same config and dataset"
        )
    if not plan.provider.remote:
        return {}  # local providers are recomputed: deterministic and instant
    local = checkpoint_path(store.state_dir(), run_id)
    if local.exists():
        saved = read_checkpoint(local.read_bytes())
    elif CHECKPOINT_ARTIFACT in store.list_artifacts(run_id, "checkpoint"):
        saved = read_checkpoint(store.read_artifact(run_id, CHECKPOINT_ARTIFACT))
    else:
        saved = {}
    # A checkpoint an older ragexp wrote may hold a number that cannot be recorded.
    checked = {case_id: recordable(result) for case_id, result in saved.items()}
    kept = {
        case_id: result
        for case_id, result in checked.items()
        if result.error is None or not (result.retryable or retry_errors)
    }
    return complete(plan.dataset.cases, kept) if plan.dataset.has_conversations else kept


def evaluate_cases(
    plan: Plan,
    cases: Sequence[Case],
    done: dict[str, CaseResult],
    checkpoint: Checkpoint | None,
    arrived: list[CaseResult],
) -> list[CaseResult]:
    """The results of ``cases`` (a part of the plan's dataset), in their order: those in ``done``
    kept, the others asked of the system with the run's concurrency, retries and checkpoint."""
    part = dataclasses.replace(plan, dataset=dataclasses.replace(plan.dataset, cases=list(cases)))
    return _evaluate(part, {case.id: done[case.id] for case in cases if case.id in done}, checkpoint, arrived)


def _evaluate(
    plan: Plan, done: dict[str, CaseResult], checkpoint: Checkpoint | None, arrived: list[CaseResult]
) -> list[CaseResult]:
    """Every case's result, in dataset order; ``arrived`` collects the new ones as they come."""
    cases = plan.dataset.cases
    if done:
        results: list[CaseResult | None] = [done.get(case.id) for case in cases]
        todo = [i for i, result in enumerate(results) if result is None]
    else:
        results, todo = [None] * len(cases), list(range(len(cases)))
    if done:
        info(f"resuming: {len(cases) - len(todo)} of {len(cases)} cases kept, {len(todo)} to evaluate")
    progress = Progress(len(todo), "evaluating", enabled=plan.config.progress)

    def on_result(position: int, result: CaseResult) -> None:
        result = recordable(result)
        results[todo[position]] = result
        arrived.append(result)
        if checkpoint is not None:
            checkpoint.add(result)
        progress.advance(error=result.error is not None)

    def keep(position: int, result: CaseResult) -> None:
        result = recordable(result)
        results[todo[position]] = result
        arrived.append(result)

    # Nothing to save or draw per case (a local provider, no terminal): at 100,000 cases that
    # bookkeeping costs about half as much as the fake provider's own work.
    callback = keep if checkpoint is None and not progress.enabled else on_result

    try:
        if todo:
            asked = [cases[i] for i in todo] if done else cases
            if plan.dataset.has_conversations:
                ask_in_turns(asked, plan.provider, callback, plan.config.conversation.history)
            else:
                plan.provider.run(asked, callback)
    finally:
        progress.close()
    missing = [cases[i].id for i, result in enumerate(results) if result is None]
    if missing:  # a provider bug, not a user error: never score a missing case as anything
        raise RuntimeError(f"provider {plan.config.provider.name} returned no result for case {missing[0]}")
    return [result for result in results if result is not None]


def recordable(result: CaseResult) -> CaseResult:
    """``result``, or an error for its case when a number in its output cannot be recorded (in
    the checkpoint, a trace, the store): the case's error, never the run's. A long error is cut
    to what a case's error holds."""
    if result.error is not None and len(result.error) > limits.CASE_ERROR.chars:
        result.error = limits.fit(limits.CASE_ERROR, result.error)
    if result.output is None:
        return result
    reason = limits.output_problem(result.output)
    if reason is None:
        return result
    return CaseResult(result.case_id, None, f"the system's output cannot be recorded: {reason}")


@dataclass
class Scored:
    """A run's per-case scores and what they add up to (the inputs of every later step)."""

    inputs: OfflineInputs
    scores: dict[str, np.ndarray]
    """Metric -> per-case scores (NaN: no score)."""
    errored: np.ndarray
    """(n,) bool: the case's system call or one of its metrics failed."""
    summary: dict[str, float | None]
    spread: dict[str, list[float | None]] = field(default_factory=dict)
    """Judge metric -> per-case spread over repeats."""
    judge_metrics: dict[str, float] = field(default_factory=dict)
    """The judge's run-level figures: token usage, cache hits, seconds, mean spread."""
    system_tokens: dict[str, float] = field(default_factory=dict)
    """The tokens the system's replies reported (none when no reply reported usage)."""
    judge_served: str = ""
    """The judge's served identities (the ``ragexp.judge.served`` tag; empty: none named)."""
    canaries: GradedCanaries | None = None
    """The run's judge on ``judge.canaries`` (None: no canaries)."""

    @property
    def error_count(self) -> int:
        return int(self.errored.sum())

    def columns(self) -> dict[str, list[float | None]]:
        return {name: nullable(values) for name, values in self.scores.items()}

    def populations(self, specs: Sequence[MetricSpec]) -> dict[str, Population]:
        """Per-case metric -> the cases its run value covers (:mod:`ragexp.metrics.population`)."""
        known = {spec.name: spec for spec in specs}
        return {
            name: population(known.get(name), values, self.inputs.unanswerable) for name, values in self.scores.items()
        }


def _score_and_log(
    plan: Plan, store: Store, run_id: str, results: list[CaseResult], resumed: bool = False
) -> RunOutcome:
    """Score every case, weigh the scores against people's, log metrics, artifacts and traces."""
    shown = plan.config.progress
    scored = score_results(plan, results)
    chats = score_conversations(plan.specs, scored.scores, plan.dataset.cases, scored.errored)
    with Phase(f"logging the run's metrics and artifacts ({len(results):,} cases)", enabled=shown):
        human, labels_note = _human_scores(plan, store, run_id, results, scored, resumed)
        trust = assess(plan.specs, scored.scores, human, scored.inputs.unanswerable, plan.config.calibration)
        timings = stage_timings(results)
        figures = run_metrics(plan, results, scored, trust, timings)
        if chats is not None:
            figures.update(chats.as_metrics())
        store.log_metrics(run_id, figures)
        if scored.judge_served:
            store.set_tags(run_id, served_tags(scored.judge_served))
        if scored.canaries is not None:
            store.set_tags(run_id, {TAG_PREFIX + "judge.canaries": scored.canaries.canaries.digest[:SHORT_HASH]})
        _log_artifacts(plan, store, run_id, results, scored, human, trust, timings, chats)
    if plan.config.tracking.traces:
        with Phase("logging the cases' traces", enabled=shown):
            _log_case_traces(plan, store, run_id, results, scored, resumed=resumed)
    return RunOutcome(
        run_id,
        plan.config.experiment,
        store.uri,
        plan.config_hash,
        plan.dataset.dataset_hash,
        len(plan.dataset.cases),
        scored.error_count,
        scored.summary,
        scored.populations(plan.specs),
        plan.specs,
        timings,
        trust,
        missed_cases(plan.specs, scored.scores, plan.dataset.cases, results, plan.config.k),
        chats,
        labels_note,
    )


def served_tags(served: str) -> dict[str, str]:
    """The tags naming what served the run's judge grades (``ragexp.judge.served``: each served
    identity, sorted; ``ragexp.judge.served_count``: how many, more than one a judge that changed)."""
    return {
        TAG_PREFIX + "judge.served": limits.fit(limits.TAG_VALUE, served),
        TAG_PREFIX + "judge.served_count": str(len(judge_identity.split(served))),
    }


def score_results(plan: Plan, results: list[CaseResult]) -> Scored:
    """The offline metrics, then the judge's; a judge metric that failed for a case is recorded
    on the case (``metric_errors``), never scored."""
    cfg = plan.config
    cases = plan.dataset.cases
    if not plan.dataset.has_evidence:
        unmatched = unmatchable_gold(cases, results, cfg.k)
        if unmatched is not None:
            raise MetricError(unmatched.message(str(plan.dataset.path)))
    with Phase(f"scoring {len(cases):,} cases", enabled=cfg.progress):  # the judge draws a bar of its own
        inputs = build_inputs(cases, results, cfg.k, cfg.dataset.refusal_phrases, cfg.dataset.match)
        scores = score_cases(plan.specs, inputs)
        if any(spec.hop for spec in plan.specs):
            _score_hops(plan, results, scores)
        if plan.dataset.has_evidence:
            _evidence_unread(plan, results, scores)
        fill_rationales(
            plan.specs,
            cases,
            results,
            scores,
            inputs,
            refusal_phrases=cfg.dataset.refusal_phrases,
            language=cfg.report.language,
            match=cfg.dataset.match,
        )
    spread: dict[str, list[float | None]] = {}
    judge_metrics: dict[str, float] = {}
    served = ""
    graded: GradedCanaries | None = None
    if plan.scorer is not None:
        started = time.perf_counter()
        asked_after = histories(cases, results, cfg.conversation.history) if plan.dataset.has_conversations else None
        judged = plan.scorer.score(cases, results, progress=cfg.progress, histories=asked_after)
        judge_seconds = time.perf_counter() - started
        scores.update(judged.scores)
        for index, reasons in judged.errors.items():
            results[index].metric_errors.update(reasons)
        for index, texts in judged.rationales.items():
            results[index].rationale.update(texts)
        if plan.canaries is not None:
            graded = grade_canaries(plan.scorer, plan.canaries, plan.specs, cfg.calibration, progress=cfg.progress)
            judged.usage.add(graded.outcome.usage)
            judged.cache_hits += graded.outcome.cache_hits
            judged.served |= graded.outcome.served
            judge_seconds = time.perf_counter() - started
        usage = judged.usage.as_metrics()
        for name, value in plan.scorer.adaptation_usage.as_metrics().items():
            usage[name] += value
        judge_metrics = {**usage, "judge.cache_hits": float(judged.cache_hits), "judge.seconds": judge_seconds}
        judge_metrics["judge.cache_refused"] = float(max(judged.stale, graded.outcome.stale if graded else 0))
        if graded is not None:
            judge_metrics.update(agreement_metrics(graded.agreement))
        served = judge_identity.joined(judged.served)
        if len(judge_identity.split(served)) > 1:
            info(f"warning: the judge's grades were served by {len(judge_identity.split(served))} identities: {served}")
        for name, values in judged.spread.items():
            spread[name] = nullable(values)
            if np.isfinite(values).any():
                judge_metrics[f"judge_spread.{name}"] = float(np.nanmean(values))
    if plan.custom.python:
        scores.update(score_python_guarded(plan.custom.python, cases, results, inputs.ok, workers=cfg.concurrency))
    errored = np.array([not r.ok or bool(r.metric_errors) for r in results], dtype=bool)
    summary = summarize(plan.specs, scores, inputs, errored)
    tokens = system_tokens(results)
    if cfg.cost.prices is not None:
        summary[COST], why_not = run_cost(cfg.cost, tokens, judge_metrics)
        if why_not is not None:
            info(f"warning: {why_not}")
    return Scored(inputs, scores, errored, summary, spread, judge_metrics, tokens.as_metrics(), served, graded)


def _score_hops(plan: Plan, results: list[CaseResult], scores: dict[str, np.ndarray]) -> None:
    """The per-hop metrics the run names, with ``first_failing_hop`` and the figures the system
    reported per hop (seconds, tokens, cost) as per-case columns beside them."""
    cfg = plan.config
    counts = count_hops(plan.dataset.cases, results, cfg.k, cfg.dataset.match)
    named = {spec.name for spec in plan.specs}
    scores.update((name, values) for name, values in hop_scores(counts).items() if name in named)
    scores.update(hop_columns(counts))
    fill_hop_rationales(plan.specs, plan.dataset.cases, results, counts, cfg.report.language)


def _evidence_unread(plan: Plan, results: list[CaseResult], scores: dict[str, np.ndarray]) -> None:
    """Evidence is matched by text: a reply that named chunks without their texts cannot be
    scored on it (an error for the case's retrieval metrics, never a 0); document ids of another
    kind than the evidence's are worth a warning, as they would match nothing."""
    retrieval = [spec.name for spec in plan.specs if "relevant_ids" in spec.needs_labels and spec.name in scores]
    for index in textless(plan.dataset.cases, results):
        count = len(results[index].output.ranked_ids)  # type: ignore[union-attr]  # textless: an output
        for name in retrieval:
            scores[name][index] = np.nan
            results[index].metric_errors[name] = (
                f"the reply named {count} retrieved chunks without their texts: evidence is matched by text"
            )
    docs = {item.doc for case in plan.dataset.cases for item in case.relevant}
    named, shared = returned_documents(docs, [result.output for result in results])
    if named and not shared and plan.config.dataset.match.same_doc:
        info(
            f"warning: the system named documents for {named} cases, none of them a document of the evidence "
            f"(e.g. {next(iter(sorted(docs)))!r}): every chunk is refused by document; map the same document ids "
            "(response.doc_ids), or set dataset.match.same_doc=false to let text alone decide"
        )


def _human_scores(
    plan: Plan, store: Store, run_id: str, results: list[CaseResult], scored: Scored, resumed: bool
) -> tuple[dict[str, np.ndarray], str | None]:
    """People's scores of this run's cases: the dataset's ``human`` field where it graded this
    run's output (:mod:`ragexp.labels.graded`), then the review queues' labels of this run (as
    ``ragexp calibrate`` reads them); and the line on the dataset's scores it left out, if any."""
    from ragexp.labels.collect import run_labels, with_run_labels
    from ragexp.labels.graded import dataset_labels

    cases = plan.dataset.cases
    names = list(scored.scores)
    graded = dataset_labels(cases, results, names)
    human = graded.human
    custom = {spec.name: spec for spec in plan.custom.specs}
    labels = run_labels(store, run_id, cases, results, names, resumed=resumed, info=info, custom=custom)
    return with_run_labels(human, labels), graded.unmatched_line(run_id)


def run_metrics(
    plan: Plan, results: Sequence[CaseResult], scored: Scored, trust: Trust, timings: dict[str, dict[str, float]]
) -> dict[str, float]:
    """Every figure the run logs as an MLflow metric."""
    metrics = {name: value for name, value in scored.summary.items() if value is not None}
    for name, covered in scored.populations(plan.specs).items():
        metrics[f"population.{name}.scored"] = float(covered.scored)
        metrics[f"population.{name}.cases"] = float(covered.cases)
    metrics["case_count"] = float(len(plan.dataset.cases))
    metrics["error_count"] = float(scored.error_count)
    metrics.update(scored.judge_metrics)
    metrics.update(scored.system_tokens)
    metrics.update(trust.as_metrics())
    for stage in stage_rows(timings):
        for figure in TIMING_FIGURES:
            metrics[f"{stage['metric_prefix']}.{figure}"] = stage[figure]
    return metrics


def stage_rows(timings: dict[str, dict[str, float]]) -> list[dict[str, Any]]:
    """``timings.json``'s rows: each stage's name, the key prefix of its metrics, its figures."""
    return [{"stage": stage, "metric_prefix": timing_prefix(stage), **figures} for stage, figures in timings.items()]


def _log_artifacts(
    plan: Plan,
    store: Store,
    run_id: str,
    results: list[CaseResult],
    scored: Scored,
    human: dict[str, np.ndarray],
    trust: Trust,
    timings: dict[str, dict[str, float]],
    chats: ConversationFigures | None = None,
) -> None:
    cfg = plan.config
    cases = plan.dataset.cases
    columns = scored.columns()
    latency = nullable(scored.inputs.latency)
    summary = {
        "summary": scored.summary,
        "case_count": len(cases),
        "error_count": scored.error_count,
        "populations": {name: covered.to_json() for name, covered in scored.populations(plan.specs).items()},
        "config_hash": plan.config_hash,
        "dataset_hash": plan.dataset.dataset_hash,
        **trust.to_json(),
    }
    with tempfile.TemporaryDirectory(prefix="ragexp-run-") as tmp:
        folder = Path(tmp)
        artifacts.write_cases(folder / artifacts.CASES, cases, results, columns, latency, scored.spread)
        artifacts.write_config(folder / artifacts.CONFIG, resolved_config(cfg))
        artifacts.write_summary(folder / artifacts.SUMMARY, summary)
        artifacts.write_table(folder / artifacts.TABLE, _table(plan, results, columns, latency))
        if timings:
            artifacts.write_timings(folder / artifacts.TIMINGS, stage_rows(timings))
        artifacts.write_scores(
            folder / artifacts.SCORES, cases, scored.errored, latency, columns, human, scored.inputs.ttft
        )
        if plan.findings is not None:
            artifacts.write_audit(folder / artifacts.AUDIT, [finding.to_json() for finding in plan.findings])
        if plan.custom.specs:
            artifacts.write_custom_metrics(folder / artifacts.CUSTOM_METRICS, plan.custom.specs)
        if scored.canaries is not None:
            artifacts.write_canaries(folder / artifacts.CANARIES, scored.canaries.artifact())
        if chats is not None:
            artifacts.write_conversations(folder / artifacts.CONVERSATIONS, [row.to_json() for row in chats.rows])
        store.log_dir(run_id, folder, tables=[artifacts.TABLE])


def _log_case_traces(
    plan: Plan, store: Store, run_id: str, results: list[CaseResult], scored: Scored, *, resumed: bool
) -> None:
    from ragexp.case_traces import build_traces

    traced = build_traces(
        plan.dataset.cases,
        results,
        plan.specs,
        scored.scores,
        scored.inputs.latency,
        scored.errored,
        judge=plan.judge,
        cap=plan.config.tracking.traces_max_cases,
        language=plan.config.report.language,
        histories=histories(plan.dataset.cases, results, plan.config.conversation.history)
        if plan.dataset.has_conversations
        else None,
    )
    _log_traces(store, run_id, plan.config.experiment, traced, resumed=resumed, info=info)


def stage_timings(results: Sequence[CaseResult]) -> dict[str, dict[str, float]]:
    """p50 and p95 (nearest rank) of each stage the system reported timings for, by stage name
    (secrets masked: a service may echo a token as a stage name)."""
    per_stage: dict[str, list[float]] = {}
    for result in results:
        if result.output is not None and result.output.timings:
            for stage, seconds in result.output.timings.items():
                per_stage.setdefault(scrub(stage), []).append(seconds)
    figures: dict[str, dict[str, float]] = {}
    for stage, values in sorted(per_stage.items()):
        array = np.array(values, dtype=np.float64)
        p50, p95, cases = TIMING_FIGURES
        figures[stage] = {
            p50: nearest_rank(array, 50) or 0.0,
            p95: nearest_rank(array, 95) or 0.0,
            cases: float(array.size),
        }
    return figures


def _table(
    plan: Plan, results: Sequence[CaseResult], columns: dict[str, list[float | None]], latency: list[float | None]
) -> dict[str, list[Any]]:
    cases = plan.dataset.cases
    return {
        "id": [case.id for case in cases],
        "question": [case.question[:TEXT_IN_TABLE] for case in cases],
        "answer": [(r.output.answer[:TEXT_IN_TABLE] if r.output else None) for r in results],
        "error": [error_text(r) for r in results],
        **columns,
        "latency_seconds": latency,
    }


def _log_traces(
    store: Store,
    run_id: str,
    experiment: str,
    plan: TracePlan,
    *,
    resumed: bool,
    info: Any,
) -> int:
    """Write the planned traces (replacing any a stopped attempt of this run left) and tag the
    run with what was traced. A store error propagates as a TrackingError: the caller marks the
    run failed rather than finished with half its traces."""
    from ragexp.tracking.traces import TraceWriter

    experiment_id = store.experiment_id(experiment, create=False)
    if experiment_id is None:  # pragma: no cover - the run was just created in it
        raise RuntimeError(f"experiment {experiment} vanished")
    writer = TraceWriter(store, experiment_id, run_id)
    if resumed:
        writer.delete_all()
    written = writer.write(plan.traces)
    scope = "all" if not plan.capped else "errored_and_imperfect"
    if plan.capped:
        info(
            f"traces: {written} of {plan.case_count} cases traced (errored and imperfect only, over "
            "tracking.traces_max_cases); cases.jsonl holds every case"
        )
    store.set_tags(run_id, {TAG_PREFIX + "traces": scope, TAG_PREFIX + "traces.count": str(written)})
    return written
