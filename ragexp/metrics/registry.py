"""Every metric ragexp knows, with its direction, range, required fields and source.

This is the one place that parses metric names. Per-case scorers are looked up here by name;
summaries, gates, diffs and reports read directions and populations from the same entries.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from ragexp.errors import MetricError

if TYPE_CHECKING:
    import numpy as np

    from ragexp.metrics.offline import OfflineInputs

MAX_JUDGE_METRICS = 14
"""MindSDK's evaluate() takes (0, 14] metrics; it applies to what is sent to the judge."""
MAX_NAME = 50

Direction = Literal["higher", "lower"]
Population = Literal["answerable", "all", "answered"]


@dataclass(frozen=True)
class MetricSpec:
    """What a metric is; how it is computed lives in ``scorer`` (offline) or the judge module."""

    name: str
    """The name it is logged under."""
    direction: Direction
    """Which way is better."""
    low: float
    """Smallest possible value."""
    high: float | None
    """Largest possible value (None: unbounded, e.g. seconds)."""
    needs_labels: frozenset[str]
    """Dataset fields the metric reads (``relevant_ids``, ``reference``...)."""
    needs_output: frozenset[str]
    """System output fields the metric reads (``response``, ``retrieved_contexts``...)."""
    source: str
    """Who defines it: ``ragas`` / ``MindSDK evaluation module`` (official) or this project."""
    definition: str
    """One sentence: what it measures."""
    per_case: bool = True
    """False for run-level figures (``p95_seconds``, ``error_rate``) with no per-case score."""
    population: Population = "all"
    """Which cases the run's mean is taken over; ``answerable`` falls back to all if none."""
    judge: bool = False
    """Needs an LLM judge."""
    human_labels: bool = False
    """People can score it by hand (a dataset's ``human`` field), so the automatic score can be
    calibrated against them and corrected by prediction-powered inference."""
    aliases: tuple[str, ...] = ()
    """Other accepted spellings (``answer_similarity`` is logged as ``semantic_similarity``)."""
    scorer: Callable[[OfflineInputs], np.ndarray] | None = field(default=None, compare=False)
    """Offline per-case kernel: arrays in, one score per case out (NaN: no score)."""
    run_value: Callable[[OfflineInputs, np.ndarray], float | None] | None = field(default=None, compare=False)
    """Run-level figures: (inputs, errored mask) -> the run's value."""
    ragas_class: str | None = None
    """Judge metrics: the ``ragas.metrics.collections`` class that computes it."""
    ragas_args: tuple[str, ...] = ()
    """Judge metrics: the fields passed to the class's ``ascore``, in ragas' names."""

    @property
    def official(self) -> bool:
        return self.source != PROJECT

    @property
    def needs(self) -> frozenset[str]:
        return self.needs_labels | self.needs_output


PROJECT = "defined by this project (after the first seed)"
RAGAS = "ragas 0.4.3 / MindSDK 26.1.0 evaluation module"

METRICS: dict[str, MetricSpec] = {}
_ALIASES: dict[str, str] = {}


def register(spec: MetricSpec) -> MetricSpec:
    METRICS[spec.name] = spec
    for alias in (spec.name, *spec.aliases):
        _ALIASES[alias] = spec.name
    return spec


def parse_metric_names(names: Sequence[str]) -> list[MetricSpec]:
    """Check a metric list: known names of 1 to 50 characters, no duplicates (an alias counts as its
    metric), at least one metric, at most 14 judge metrics."""
    if not names:
        raise MetricError("metrics: give at least one metric name")
    specs: list[MetricSpec] = []
    seen: dict[str, str] = {}
    for name in names:
        if not isinstance(name, str) or not 1 <= len(name) <= MAX_NAME:
            raise MetricError(f"metrics: metric names have 1 to {MAX_NAME} characters, got {name!r}")
        canonical = _ALIASES.get(name)
        if canonical is None:
            close = difflib.get_close_matches(name, sorted(_ALIASES), n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise MetricError(f"metrics: unknown metric '{name}'{hint} (known: {', '.join(sorted(METRICS))})")
        if canonical in seen:
            raise MetricError(f"metrics: '{name}' repeats '{seen[canonical]}'")
        seen[canonical] = name
        specs.append(METRICS[canonical])
    judged = [spec.name for spec in specs if spec.judge]
    if len(judged) > MAX_JUDGE_METRICS:
        raise MetricError(
            f"metrics: at most {MAX_JUDGE_METRICS} judge metrics per run (MindSDK's limit), got {len(judged)}"
        )
    return specs


def labelled_metric(name: object) -> MetricSpec | None:
    """The metric a ``human`` label names (aliases accepted), if it takes human scores."""
    canonical = _ALIASES.get(name) if isinstance(name, str) else None
    spec = METRICS.get(canonical) if canonical is not None else None
    return spec if spec is not None and spec.human_labels else None


def check_requirements(
    specs: Iterable[MetricSpec], labels: frozenset[str], outputs: frozenset[str], *, dataset: str, provider: str
) -> None:
    """Refuse, before any work, a metric whose fields the dataset or provider cannot give."""
    for spec in specs:
        missing_labels = sorted(spec.needs_labels - labels)
        if missing_labels:
            raise MetricError(
                f"metric '{spec.name}' needs field '{missing_labels[0]}', which dataset {dataset} does not "
                "give for every case"
            )
        missing_outputs = sorted(spec.needs_output - outputs)
        if missing_outputs:
            raise MetricError(
                f"metric '{spec.name}' needs output field '{missing_outputs[0]}', which provider {provider} "
                f"does not give for every case of {dataset}"
            )


def _judge(
    name: str,
    direction: Direction,
    ragas_class: str,
    args: tuple[str, ...],
    definition: str,
    aliases: tuple[str, ...] = (),
) -> None:
    outputs = {"response", "retrieved_contexts"} & set(args)
    register(
        MetricSpec(
            name=name,
            direction=direction,
            low=0.0,
            high=1.0,
            needs_labels=frozenset(set(args) - outputs),
            needs_output=frozenset(outputs),
            source=RAGAS,
            definition=definition,
            judge=True,
            human_labels=True,
            aliases=aliases,
            ragas_class=ragas_class,
            ragas_args=args,
        )
    )


def _register_judge_metrics() -> None:
    # (the ascore arguments of each ragas class; MindSDK's table gives the same fields)
    q, ref, resp, ctx = "user_input", "reference", "response", "retrieved_contexts"
    _judge(
        "answer_correctness",
        "higher",
        "AnswerCorrectness",
        (q, resp, ref),
        "Correctness of the answer against the reference: factual overlap combined with semantic similarity.",
    )
    _judge(
        "answer_relevancy",
        "higher",
        "AnswerRelevancy",
        (q, resp),
        "How relevant the answer is to the question; incomplete or redundant answers score lower.",
    )
    _judge(
        "semantic_similarity",
        "higher",
        "SemanticSimilarity",
        (ref, resp),
        "Semantic closeness of the answer to the reference, from embeddings.",
        aliases=("answer_similarity",),
    )
    _judge(
        "context_precision",
        "higher",
        "ContextPrecision",
        (q, ref, ctx),
        "Share of relevant chunks among the retrieved contexts, averaged precision@k over their ranks.",
    )
    _judge(
        "context_recall",
        "higher",
        "ContextRecall",
        (q, ctx, ref),
        "How much of the reference is supported by the retrieved contexts: nothing relevant left out.",
    )
    _judge(
        "context_entity_recall",
        "higher",
        "ContextEntityRecall",
        (ref, ctx),
        "Share of the reference's entities that appear in the retrieved contexts.",
    )
    _judge(
        "context_utilization",
        "higher",
        "ContextUtilization",
        (q, resp, ctx),
        "Precision of the retrieved contexts judged against the answer rather than a reference.",
    )
    _judge(
        "faithfulness",
        "higher",
        "Faithfulness",
        (q, resp, ctx),
        "Share of the answer's claims that the retrieved contexts support.",
    )
    _judge(
        "noise_sensitivity",
        "lower",
        "NoiseSensitivity",
        (q, resp, ref, ctx),
        "How often the answer makes incorrect claims under relevant or irrelevant contexts (lower is better).",
    )
    _judge(
        "nv_accuracy",
        "higher",
        "AnswerAccuracy",
        (q, resp, ref),
        "Agreement of answer and reference: two judge prompts rate 0/2/4, rescaled to [0,1] and averaged.",
    )
    _judge(
        "nv_context_relevance",
        "higher",
        "ContextRelevance",
        (q, ctx),
        "Relevance of the retrieved contexts to the question: two judge prompts rate 0/1/2, rescaled and averaged.",
    )
    _judge(
        "nv_response_groundedness",
        "higher",
        "ResponseGroundedness",
        (resp, ctx),
        "How far each claim of the answer is supported by the retrieved contexts.",
    )


def _register_offline_metrics() -> None:
    from ragexp.metrics import offline

    def offline_metric(
        name: str,
        scorer: Callable[[OfflineInputs], np.ndarray],
        labels: set[str],
        outputs: set[str],
        definition: str,
        population: Population,
        human_labels: bool = False,
    ) -> None:
        register(
            MetricSpec(
                name=name,
                direction="higher",
                low=0.0,
                high=1.0,
                needs_labels=frozenset(labels),
                needs_output=frozenset(outputs),
                source=PROJECT,
                definition=definition,
                population=population,
                human_labels=human_labels,
                scorer=scorer,
            )
        )

    offline_metric(
        "recall_at_k",
        offline.score_recall,
        {"relevant_ids"},
        {"retrieved_ids"},
        "Share of the relevant ids found in the top K.",
        "answerable",
    )
    offline_metric(
        "mrr",
        offline.score_mrr,
        {"relevant_ids"},
        {"retrieved_ids"},
        "Reciprocal rank of the first relevant id anywhere in the ranking (uncut), averaged.",
        "answerable",
    )
    offline_metric(
        "ndcg_at_k",
        offline.score_ndcg,
        {"relevant_ids"},
        {"retrieved_ids"},
        "Binary-relevance nDCG of the top K (each id counted once).",
        "answerable",
    )
    offline_metric(
        "citation_precision",
        offline.score_citation_precision,
        {"relevant_ids"},
        {"retrieved_ids", "citations"},
        "Share of the answer's citations that point at a relevant id.",
        "all",
    )
    offline_metric(
        "answer_accuracy",
        offline.score_answer_accuracy,
        {"expected_facts"},
        {"response"},
        "1 when every expected fact appears in the answer (a refusal for unanswerable cases).",
        "all",
        human_labels=True,
    )
    register(
        MetricSpec(
            name="p95_seconds",
            direction="lower",
            low=0.0,
            high=None,
            needs_labels=frozenset(),
            needs_output=frozenset(),
            source=PROJECT,
            per_case=False,
            population="answered",
            definition="95th percentile (nearest rank) of the latency of the cases that got an answer.",
            run_value=offline.run_p95,
        )
    )
    register(
        MetricSpec(
            name="error_rate",
            direction="lower",
            low=0.0,
            high=1.0,
            needs_labels=frozenset(),
            needs_output=frozenset(),
            source=PROJECT,
            per_case=False,
            definition="Share of cases with any error (system call or metric).",
            run_value=offline.run_error_rate,
        )
    )


_register_offline_metrics()
_register_judge_metrics()
