"""``ragexp run``: plan (validate everything, :mod:`~ragexp.workflows.run_plan`), then execute:
evaluate every case (here), score the results (:mod:`~ragexp.workflows.run_score`) and log them
(:mod:`~ragexp.workflows.run_log`).

Everything that can be wrong with the input is found in :func:`plan_run`, before an MLflow run
exists, so bad input never leaves a half-written run behind.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ragexp import limits
from ragexp.artifacts import error_text
from ragexp.checkpoint import Checkpoint, SpaceReserve, checkpoint_path, read_checkpoint, run_lock
from ragexp.config.compose import compose
from ragexp.config.identity import run_params
from ragexp.config.tracking import chosen_uri
from ragexp.conversations import ask_in_turns, complete
from ragexp.datasets.screening import DRAFT_TAG, refuse_unscreened, unscreened
from ragexp.errors import (
    AllCasesErrored,
    ConfigError,
    Interrupted,
    NotFinished,
    RagexpError,
    StorageError,
    StoreLost,
    StoreUnreachable,
)
from ragexp.metrics.calibration import Trust, assess
from ragexp.metrics.conversation import ConversationFigures, score_conversations
from ragexp.metrics.missed import Missed, missed_cases
from ragexp.metrics.population import Population
from ragexp.metrics.registry import MetricSpec
from ragexp.outputs import info
from ragexp.progress import Phase, Progress
from ragexp.records import Case, CaseResult
from ragexp.secrets import register_url, scrub
from ragexp.tracking.store import FAILED, FINISHED, KILLED, TAG_PREFIX, Store
from ragexp.workflows.run_log import (
    log_artifacts,
    log_case_traces,
    log_dataset,
    log_served_params,
    run_metrics,
    served_tags,
    stage_timings,
)
from ragexp.workflows.run_plan import SHORT_HASH, Plan, plan_run
from ragexp.workflows.run_score import human_scores, score_results

CHECKPOINT_ARTIFACT = "checkpoint/results.jsonl"


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


def finish_run(store: Store, run_id: str) -> None:
    """Mark the run finished, the call retried within the store's ``timeout_s``: a run whose data
    is complete is never left RUNNING by one failed call, nor said to be finished when it is not."""
    from ragexp.transport import retry_within

    try:
        retry_within(
            lambda: store.end_run(run_id, FINISHED),
            timeout_s=store.timeout_s,
            base=0.5,
            again=lambda exc: isinstance(exc, RagexpError),
        )
    except RagexpError as exc:
        raise NotFinished(
            f"run {run_id}: every case was evaluated and logged (its data is complete), but the store did "
            f"not mark it finished ({exc}); it stays RUNNING until a resume finishes it, which asks no case "
            "again",
            run_id,
        ) from None


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
            log_dataset(plan, store, run_id)
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


def _score_and_log(
    plan: Plan, store: Store, run_id: str, results: list[CaseResult], resumed: bool = False
) -> RunOutcome:
    """Score every case, weigh the scores against people's, log metrics, artifacts and traces."""
    shown = plan.config.progress
    scored = score_results(plan, results)
    chats = score_conversations(plan.specs, scored.scores, plan.dataset.cases, scored.errored)
    with Phase(f"logging the run's metrics and artifacts ({len(results):,} cases)", enabled=shown):
        human, labels_note = human_scores(plan, store, run_id, results, scored, resumed)
        trust = assess(plan.specs, scored.scores, human, scored.inputs.unanswerable, plan.config.calibration)
        timings = stage_timings(results)
        figures = run_metrics(plan, results, scored, trust, timings)
        if chats is not None:
            figures.update(chats.as_metrics())
        store.log_metrics(run_id, figures)
        if scored.judge_served:
            store.set_tags(run_id, served_tags(scored.judge_served))
            log_served_params(store, run_id, scored.judge_served, resumed)
        if scored.canaries is not None:
            store.set_tags(run_id, {TAG_PREFIX + "judge.canaries": scored.canaries.canaries.digest[:SHORT_HASH]})
        log_artifacts(plan, store, run_id, results, scored, human, trust, timings, chats)
    if plan.config.tracking.traces:
        with Phase("logging the cases' traces", enabled=shown):
            log_case_traces(plan, store, run_id, results, scored, resumed=resumed)
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
