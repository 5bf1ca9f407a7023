"""``ragexp run``, the scoring of a run's results: every metric of the plan over the cases, the
judge's, the custom metrics', the human labels', and the rationales of each case's scores."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from ragexp.artifacts import nullable
from ragexp.conversations import histories
from ragexp.errors import MetricError
from ragexp.metrics.canaries import Graded as GradedCanaries
from ragexp.metrics.canaries import agreement_metrics
from ragexp.metrics.canaries import grade as grade_canaries
from ragexp.metrics.cost import COST, run_cost, system_tokens
from ragexp.metrics.custom import score_python_guarded
from ragexp.metrics.evidence import returned_documents, textless, unmatchable_gold
from ragexp.metrics.hops import count_hops, fill_hop_rationales, hop_columns, hop_scores
from ragexp.metrics.judge import identity as judge_identity
from ragexp.metrics.offline import OfflineInputs, build_inputs
from ragexp.metrics.population import Population, population
from ragexp.metrics.reasons import fill_rationales
from ragexp.metrics.registry import MetricSpec
from ragexp.metrics.summary import score_cases, summarize
from ragexp.outputs import info
from ragexp.progress import Phase
from ragexp.records import CaseResult
from ragexp.tracking.store import Store
from ragexp.workflows.run_plan import Plan


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


def human_scores(
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
