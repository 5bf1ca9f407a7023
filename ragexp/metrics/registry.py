"""Every metric ragexp knows, with its direction, range, required fields and source.

This is the one place that parses metric names. Per-case scorers are looked up here by name;
summaries, gates, diffs and reports read directions and populations from the same entries.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from ragexp.errors import MetricError

if TYPE_CHECKING:
    import numpy as np

    from ragexp.metrics.offline import OfflineInputs

MAX_JUDGE_METRICS = 14
"""MindSDK's evaluate() takes (0, 14] metrics; it applies to what is sent to the judge."""
MAX_NAME = 50
STREAMED = "ttft_seconds"
"""The output field a streamed system gives (the time to its first piece of answer): the
time-to-first-token metrics need it, so they are refused for a system that does not stream."""

Direction = Literal["higher", "lower"]
Population = Literal["answerable", "all", "answered"]
Stage = Literal["recall", "ranking", "answer", "citation", "latency", "errors"]
"""Where in a RAG pipeline a metric looks, as the diagnosis table reads it: ``recall`` (were the
relevant items found), ``ranking`` (in what order), ``answer`` (the generated answer), ``citation``,
``latency`` and ``errors`` (run-level health, not quality)."""
CaseValues = Literal["score", "latency", "ttft", "errored"]
"""What stands behind a metric case by case: its own per-case score, the case's latency (for a
latency percentile), its time to first token (for a streamed system's percentile) or the case's
error flag (for an error rate)."""
CustomKind = Literal["python", "judge"]


@dataclass(frozen=True)
class Custom:
    """How a metric of the user's own config (``metrics.custom``) is computed, and what
    identifies it: two runs whose metric of one name has another identity are not comparable on it."""

    kind: CustomKind
    """``python``: a function of the user's code; ``judge``: a rubric the configured judge scores."""
    identity: str
    """What its values depend on besides the fields it reads: the function's target and its
    distribution version or file hash, or a hash of the rubric, its scale, the fields the judge
    sees and the range."""
    key: str
    """Its config key (``metrics.custom[0]``), which messages name."""
    target: str | None = None
    """``package.module:attr`` of a Python metric."""
    rubric: str | None = None
    """A judge metric's rubric."""
    scale: tuple[int, int] | None = None
    """A judge metric's scale (None: pass/fail, the judge answers 1 or 0)."""


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
    definition_zh: str = ""
    """The same sentence in Chinese (the report's ``zh`` language)."""
    stage: Stage | None = None
    """The pipeline stage the diagnosis table attributes a move of this metric to (None: the
    metric takes no part in it)."""
    headline: bool = False
    """Shown in run tables and plotted case by case in reports."""
    case_values: CaseValues = "score"
    """What a run's per-case values of this metric are (see :data:`CaseValues`)."""
    per_case: bool = True
    """False for run-level figures (``p95_seconds``, ``error_rate``) with no per-case score."""
    population: Population = "all"
    """Which cases the run's mean is taken over; ``answerable`` falls back to all if none."""
    judge: bool = False
    """Needs an LLM judge."""
    human_labels: bool = False
    """People can score it by hand (a dataset's ``human`` field), so the automatic score can be
    calibrated against them and corrected by prediction-powered inference."""
    pass_fail: bool = False
    """Every per-case value is 0 or 1 (a person labels it pass/fail, not on a scale)."""
    aliases: tuple[str, ...] = ()
    """Other accepted spellings (``answer_similarity`` is logged as ``semantic_similarity``)."""
    scorer: Callable[[OfflineInputs], np.ndarray] | None = field(default=None, compare=False)
    """Offline per-case kernel: arrays in, one score per case out (NaN: no score)."""
    run_value: Callable[[OfflineInputs, np.ndarray], float | None] | None = field(default=None, compare=False)
    """Run-level figures: (inputs, errored mask) -> the run's value."""
    percentile: int | None = None
    """A run-level percentile (nearest rank) of its per-case values (``case_values``: latency or
    time to first token, NaN where the case got no answer), so a comparison restricted to some
    cases can take it over those; None for any other metric."""
    ragas_class: str | None = None
    """Judge metrics: the ``ragas.metrics.collections`` class that computes it."""
    ragas_args: tuple[str, ...] = ()
    """Judge metrics: the fields passed to the class's ``ascore``, in ragas' names."""
    custom: Custom | None = None
    """A metric of the user's own config (None: a metric of this registry)."""
    priced: bool = False
    """The run's tokens at ``cost.prices`` (``ragexp.metrics.cost``), not computed from the cases."""
    full_marks: bool = True
    """A case can score its best value (False for a count such as ``retrieval_calls``, where
    fewer is better but none is no goal): lists of the cases below full marks leave it out."""
    hop: int | None = None
    """The hop a per-hop metric scores (1-based: ``recall_at_k.hop2`` scores the second retrieval
    call against the second hop's gold); None: the case as a whole."""

    @property
    def official(self) -> bool:
        return self.source not in (PROJECT, YOURS)

    @property
    def needs(self) -> frozenset[str]:
        return self.needs_labels | self.needs_output

    @property
    def mean_of_cases(self) -> bool:
        """The run's value is a mean of per-case values, so a paired test applies to it (a
        percentile such as ``p95_seconds`` is not)."""
        return self.per_case or self.case_values == "errored"

    def describe(self, language: str) -> str:
        """The definition in ``language`` (``zh`` or ``en``; English where no translation exists)."""
        return self.definition_zh if language == "zh" and self.definition_zh else self.definition


PROJECT = "defined by this project (after the RAG evaluation article)"
RAGAS = "ragas 0.4.3 / MindSDK 26.1.0 evaluation module"
YOURS = "defined by you"
"""The source of a metric of the user's own config: never official."""

METRICS: dict[str, MetricSpec] = {}
_ALIASES: dict[str, str] = {}


def register(spec: MetricSpec) -> MetricSpec:
    METRICS[spec.name] = spec
    for alias in (spec.name, *spec.aliases):
        _ALIASES[alias] = spec.name
    return spec


def headline_metrics() -> list[str]:
    """The metrics run tables show and reports plot, in registry order."""
    return [spec.name for spec in METRICS.values() if spec.headline]


def case_values_metric(kind: CaseValues) -> MetricSpec:
    """The run-level metric whose per-case values are ``kind`` (``errored``: the error rate)."""
    return next(spec for spec in METRICS.values() if spec.case_values == kind and not spec.per_case)


def cost_metric() -> MetricSpec:
    """The run-level metric a price table gives."""
    return next(spec for spec in METRICS.values() if spec.priced)


def parse_metric_names(names: Sequence[str], custom: Sequence[MetricSpec] = ()) -> list[MetricSpec]:
    """Check a metric list: known names of 1 to 50 characters, no duplicates (an alias counts as its
    metric), at least one metric, at most 14 judge metrics; ``custom`` (built by :func:`custom_spec`)
    come after the named ones, each name once."""
    if not names and not custom:
        raise MetricError("metrics: give at least one metric name (metrics.names, or metrics.custom)")
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
    for spec in custom:
        if spec.name in seen:
            where = spec.custom.key if spec.custom is not None else "metrics.custom"
            raise MetricError(f"{where}.name: '{spec.name}' is already a metric of this run")
        seen[spec.name] = spec.name
        specs.append(spec)
    judged = [spec.name for spec in specs if spec.judge]
    if len(judged) > MAX_JUDGE_METRICS:
        raise MetricError(
            f"metrics: at most {MAX_JUDGE_METRICS} judge metrics per run (MindSDK's limit), got {len(judged)}"
        )
    return specs


def lookup(name: str, custom: Mapping[str, MetricSpec] | None = None) -> MetricSpec | None:
    """The metric logged as ``name``: one of ``custom`` (a run's own, read back with the run),
    else this registry's (a per-hop one too, ``recall_at_k.hop2``); None when neither knows it."""
    found = custom.get(name) if custom else None
    if found is not None:
        return found
    return METRICS.get(name) or hop_spec(name)


def is_metric_name(name: str) -> bool:
    """Whether ``name`` names a built-in metric (or one of its aliases)."""
    return name in _ALIASES


# --- multi-hop retrieval (a case's ``hops``, a system's ``retrievals``) ---------------------------

HOP_MARK = ".hop"
"""Between a metric and its hop in the name it is logged under: ``recall_at_k.hop2``."""
HOP_RULE_MARK = "@hop"
"""The same in a gate rule's key, as users write it: ``recall_at_k@hop2``."""
HOP_RECALL, HOP_MRR, HOP_EVIDENCE = "recall_at_k", "mrr", "evidence_recall"
HOP_SECONDS, HOP_TOKENS, HOP_COST = "hop_seconds", "hop_tokens", "hop_cost"
FIRST_FAILING_HOP = "first_failing_hop"
RETRIEVAL_CALLS = "retrieval_calls"
REDUNDANT_CALLS = "redundant_calls"
RETRIEVALS = "retrievals"
"""The output field the multi-hop metrics read: the system's retrieval calls, in order."""
MAX_HOP = 9


@dataclass(frozen=True)
class HopBase:
    """A metric computed for each hop of a multi-hop case."""

    direction: Direction
    high: float | None
    stage: Stage | None
    definition: str
    definition_zh: str
    scored: bool = True
    """A score the run averages and compares (False: a figure the system reported per hop,
    kept case by case: seconds, tokens, cost)."""
    reason: str | None = None
    """Which rationale builder of :mod:`ragexp.metrics.hops` explains its score."""


HOP_BASES: dict[str, HopBase] = {
    HOP_RECALL: HopBase(
        "higher",
        1.0,
        "recall",
        "Share of the hop's gold found in the top K of the hop's retrieval call.",
        "该跳检索调用的前 K 个结果中命中的该跳标注证据 / 该跳全部标注证据。",
        reason="recall",
    ),
    HOP_MRR: HopBase(
        "higher",
        1.0,
        "ranking",
        "Reciprocal rank of the hop's first gold item in the hop's retrieval call (uncut).",
        "该跳检索调用中第一个命中该跳标注证据的名次的倒数（不截断）。",
        reason="rank",
    ),
    HOP_EVIDENCE: HopBase(
        "higher",
        1.0,
        "recall",
        "Share of the hop's gold found anywhere in the hop's retrieval call (uncut).",
        "该跳检索调用的全部结果中（不截断）命中的该跳标注证据比例。",
        reason="evidence",
    ),
    HOP_SECONDS: HopBase(
        "lower",
        None,
        None,
        "Seconds the hop's retrieval call took, as the system reported.",
        "该跳检索调用耗时（秒，系统报告）。",
        scored=False,
    ),
    HOP_TOKENS: HopBase(
        "lower",
        None,
        None,
        "Tokens the hop's step used, as the system reported.",
        "该跳步骤所用 token 数（系统报告）。",
        scored=False,
    ),
    HOP_COST: HopBase(
        "lower",
        None,
        None,
        "What the hop's step cost, as the system reported.",
        "该跳步骤的费用（系统报告）。",
        scored=False,
    ),
}
"""Metric (or figure) -> what it is for each hop; logged as ``<name>.hop<n>``."""
_HOP_SPECS: dict[str, MetricSpec] = {}


def hop_name(base: str, hop: int) -> str:
    """The name a per-hop metric is logged under: ``recall_at_k.hop2``."""
    return f"{base}{HOP_MARK}{hop}"


def hop_of(name: str) -> tuple[str, int] | None:
    """``(base, hop)`` of a per-hop metric's name (``recall_at_k.hop2`` or, as a gate rule
    writes it, ``recall_at_k@hop2``); None for any other name."""
    for mark in (HOP_MARK, HOP_RULE_MARK):
        base, found, number = name.rpartition(mark)
        if found and base in HOP_BASES and number.isdigit() and 1 <= int(number) <= MAX_HOP and number[0] != "0":
            return base, int(number)
    return None


def rule_metric(name: str) -> str:
    """The logged name a gate rule's key stands for (``recall_at_k@hop2`` -> ``recall_at_k.hop2``)."""
    found = hop_of(name)
    return hop_name(*found) if found is not None else name


def hop_spec(name: str) -> MetricSpec | None:
    """The spec of a per-hop metric by its logged name; None for any other name."""
    found = hop_of(name)
    if found is None or HOP_RULE_MARK in name:
        return None
    spec = _HOP_SPECS.get(name)
    if spec is None:
        base, hop = found
        kind = HOP_BASES[base]
        spec = _HOP_SPECS[name] = MetricSpec(
            name=name,
            direction=kind.direction,
            low=0.0,
            high=kind.high,
            needs_labels=frozenset({"relevant_ids"}),
            needs_output=frozenset({RETRIEVALS}),
            source=PROJECT,
            definition=f"Hop {hop}: {kind.definition}",
            definition_zh=f"第 {hop} 跳：{kind.definition_zh}",
            stage=None,
            population="answerable",
            hop=hop,
        )
    return spec


def hop_metrics(hops: int) -> list[MetricSpec]:
    """The per-hop scores of a set whose cases have up to ``hops`` hops, hop by hop, and the
    case-level call counts: what a run of a multi-hop set adds to its metrics."""
    specs = [
        hop_spec(hop_name(base, hop)) for hop in range(1, hops + 1) for base, kind in HOP_BASES.items() if kind.scored
    ]
    return [*(spec for spec in specs if spec is not None), METRICS[RETRIEVAL_CALLS], METRICS[REDUNDANT_CALLS]]


def with_hop_metrics(specs: Sequence[MetricSpec], hops: int, outputs: frozenset[str]) -> list[MetricSpec]:
    """``specs``, and for a multi-hop set (``hops`` > 0) scored on a system that reports its
    retrieval calls, the per-hop metrics it does not name already."""
    if not hops or RETRIEVALS not in outputs:
        return list(specs)
    named = {spec.name for spec in specs}
    return [*specs, *(spec for spec in hop_metrics(hops) if spec.name not in named)]


def labelled_metric(name: object) -> MetricSpec | None:
    """The metric a ``human`` label names (aliases accepted), if it takes human scores."""
    canonical = _ALIASES.get(name) if isinstance(name, str) else None
    spec = METRICS.get(canonical) if canonical is not None else None
    return spec if spec is not None and spec.human_labels else None


def stream_metrics() -> list[MetricSpec]:
    """The metrics only a streamed system has (time to first token), which its runs add."""
    return [spec for spec in METRICS.values() if spec.case_values == "ttft"]


def with_stream_metrics(specs: Sequence[MetricSpec], outputs: frozenset[str]) -> list[MetricSpec]:
    """``specs``, and for a system that streams (its ``outputs`` hold :data:`STREAMED`) the
    time-to-first-token metrics it does not name already."""
    if STREAMED not in outputs:
        return list(specs)
    named = {spec.name for spec in specs}
    return [*specs, *(spec for spec in stream_metrics() if spec.name not in named)]


def _judge(
    name: str,
    direction: Direction,
    ragas_class: str,
    args: tuple[str, ...],
    definition: str,
    definition_zh: str,
    aliases: tuple[str, ...] = (),
    headline: bool = False,
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
            definition_zh=definition_zh,
            headline=headline,
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
        "结合事实准确性和语义相似度，衡量答案与标准答案之间的正确性。",
        headline=True,
    )
    _judge(
        "answer_relevancy",
        "higher",
        "AnswerRelevancy",
        (q, resp),
        "How relevant the answer is to the question; incomplete or redundant answers score lower.",
        "根据问题评估答案的相关性；不完整或有多余信息会扣分。",
    )
    _judge(
        "semantic_similarity",
        "higher",
        "SemanticSimilarity",
        (ref, resp),
        "Semantic closeness of the answer to the reference, from embeddings.",
        "生成答案与标准答案在语义上的接近程度（answer_similarity，返回键为 semantic_similarity）。",
        aliases=("answer_similarity",),
    )
    _judge(
        "context_precision",
        "higher",
        "ContextPrecision",
        (q, ref, ctx),
        "Share of relevant chunks among the retrieved contexts, averaged precision@k over their ranks.",
        "检索到的上下文中相关片段所占比例（对各片段的 precision@k 求平均）。",
    )
    _judge(
        "context_recall",
        "higher",
        "ContextRecall",
        (q, ctx, ref),
        "How much of the reference is supported by the retrieved contexts: nothing relevant left out.",
        "系统成功检索出多少相关内容，重点在不遗漏。",
        headline=True,
    )
    _judge(
        "context_entity_recall",
        "higher",
        "ContextEntityRecall",
        (ref, ctx),
        "Share of the reference's entities that appear in the retrieved contexts.",
        "按参考答案与检索上下文中的实体数量衡量召回。",
    )
    _judge(
        "context_utilization",
        "higher",
        "ContextUtilization",
        (q, resp, ctx),
        "Precision of the retrieved contexts judged against the answer rather than a reference.",
        "回答与检索上下文的相关性（以回答而非参考答案为准）。",
    )
    _judge(
        "faithfulness",
        "higher",
        "Faithfulness",
        (q, resp, ctx),
        "Share of the answer's claims that the retrieved contexts support.",
        "回答与检索上下文在事实层面的一致程度。",
        headline=True,
    )
    _judge(
        "noise_sensitivity",
        "lower",
        "NoiseSensitivity",
        (q, resp, ref, ctx),
        "How often the answer makes incorrect claims under relevant or irrelevant contexts (lower is better).",
        "使用相关或不相关的检索文档时，因给出错误回答而出错的频率（越低越好）。",
    )
    _judge(
        "nv_accuracy",
        "higher",
        "AnswerAccuracy",
        (q, resp, ref),
        "Agreement of answer and reference: two judge prompts rate 0/2/4, rescaled to [0,1] and averaged.",
        "两条判官提示各打 0/2/4 分，转到 [0,1] 后取平均，衡量回答与标准答案的一致程度。",
    )
    _judge(
        "nv_context_relevance",
        "higher",
        "ContextRelevance",
        (q, ctx),
        "Relevance of the retrieved contexts to the question: two judge prompts rate 0/1/2, rescaled and averaged.",
        "两条判官提示各打 0/1/2 分，转到 [0,1] 后取平均，衡量检索上下文与问题的相关性。",
    )
    _judge(
        "nv_response_groundedness",
        "higher",
        "ResponseGroundedness",
        (resp, ctx),
        "How far each claim of the answer is supported by the retrieved contexts.",
        "回答中的每条论断能否在检索上下文中找到依据。",
    )


def _register_offline_metrics() -> None:
    from ragexp.metrics import offline

    def offline_metric(
        name: str,
        scorer: Callable[[OfflineInputs], np.ndarray],
        labels: set[str],
        outputs: set[str],
        definition: str,
        definition_zh: str,
        population: Population,
        stage: Stage,
        *,
        headline: bool = False,
        human_labels: bool = False,
        pass_fail: bool = False,
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
                definition_zh=definition_zh,
                population=population,
                stage=stage,
                headline=headline,
                human_labels=human_labels,
                pass_fail=pass_fail,
                scorer=scorer,
            )
        )

    offline_metric(
        "recall_at_k",
        offline.score_recall,
        {"relevant_ids"},
        {"retrieved_ids"},
        "Share of the relevant ids found in the top K.",
        "前 K 个召回结果中命中的相关项数 / 全部相关项数。",
        "answerable",
        "recall",
        headline=True,
    )
    offline_metric(
        "mrr",
        offline.score_mrr,
        {"relevant_ids"},
        {"retrieved_ids"},
        "Reciprocal rank of the first relevant id anywhere in the ranking (uncut), averaged.",
        "第一个相关项名次的倒数（不截断，排在任何位置都算），再对问题取平均。",
        "answerable",
        "ranking",
        headline=True,
    )
    offline_metric(
        "ndcg_at_k",
        offline.score_ndcg,
        {"relevant_ids"},
        {"retrieved_ids"},
        "Binary-relevance nDCG of the top K (each id counted once).",
        "二元相关的 nDCG@K：命中位置的折损累计增益除以理想排序的增益；重复 id 只计一次。",
        "answerable",
        "ranking",
    )
    offline_metric(
        "citation_precision",
        offline.score_citation_precision,
        {"relevant_ids"},
        {"retrieved_ids", "citations"},
        "Share of the answer's citations that point at a relevant id.",
        "回答引用的位置中，指向相关项的比例。",
        "all",
        "citation",
    )
    offline_metric(
        "answer_accuracy",
        offline.score_answer_accuracy,
        {"expected_facts"},
        {"response"},
        "1 when every expected fact appears in the answer (a refusal for unanswerable cases).",
        "期望事实全部出现在回答中记 1；不可回答样本要求回答拒答。",
        "all",
        "answer",
        headline=True,
        human_labels=True,
        pass_fail=True,
    )
    register(
        MetricSpec(
            name="p95_seconds",
            definition_zh="得到回答的样本的延迟的第 95 百分位（nearest-rank）。",
            direction="lower",
            low=0.0,
            high=None,
            needs_labels=frozenset(),
            needs_output=frozenset(),
            source=PROJECT,
            per_case=False,
            population="answered",
            stage="latency",
            headline=True,
            case_values="latency",
            definition="95th percentile (nearest rank) of the latency of the cases that got an answer.",
            run_value=offline.run_p95,
            percentile=95,
        )
    )
    for percentile, run_value in ((50, offline.run_ttft_p50), (95, offline.run_ttft_p95)):
        register(
            MetricSpec(
                name=f"ttft_p{percentile}_seconds",
                definition_zh=(
                    f"流式回答的样本首个回答片段到达时间的第 {percentile} 百分位（nearest-rank），仅流式系统。"
                ),
                direction="lower",
                low=0.0,
                high=None,
                needs_labels=frozenset(),
                needs_output=frozenset({STREAMED}),
                source=PROJECT,
                per_case=False,
                population="answered",
                stage="latency",
                case_values="ttft",
                definition=(
                    f"{percentile}th percentile (nearest rank) of the time to the first piece of answer of the "
                    "streamed cases that got an answer; only for a streamed system."
                ),
                run_value=run_value,
                percentile=percentile,
            )
        )
    register(
        MetricSpec(
            name="error_rate",
            definition_zh="出错样本（系统调用或指标计算出错）的比例。",
            direction="lower",
            low=0.0,
            high=1.0,
            needs_labels=frozenset(),
            needs_output=frozenset(),
            source=PROJECT,
            per_case=False,
            stage="errors",
            headline=True,
            case_values="errored",
            definition="Share of cases with any error (system call or metric).",
            run_value=offline.run_error_rate,
        )
    )

    register(
        MetricSpec(
            name="cost",
            definition_zh=(
                "本次运行所用 token 按 cost.prices 计算的费用：系统回复报告的 token 加上评审模型的 token"
                "（每百万 token 的价格）。"
            ),
            direction="lower",
            low=0.0,
            high=None,
            needs_labels=frozenset(),
            needs_output=frozenset(),
            source=PROJECT,
            per_case=False,
            priced=True,
            definition=(
                "What the run's tokens cost at cost.prices (per million tokens, in cost.currency): the tokens "
                "the system's replies reported plus the judge's."
            ),
        )
    )


def _register_hop_metrics() -> None:
    for name, definition, definition_zh, full_marks in (
        (
            RETRIEVAL_CALLS,
            "Retrieval calls the system made for the case (an agent's retriever tool calls).",
            "系统为该问题发起的检索调用次数（智能体调用检索工具的次数）。",
            False,
        ),
        (
            REDUNDANT_CALLS,
            "Retrieval calls that repeat an earlier call's query or return nothing an earlier call had not.",
            "重复之前查询、或未返回任何新结果的检索调用次数。",
            True,
        ),
    ):
        register(
            MetricSpec(
                name=name,
                direction="lower",
                low=0.0,
                high=None,
                needs_labels=frozenset(),
                needs_output=frozenset({RETRIEVALS}),
                source=PROJECT,
                definition=definition,
                definition_zh=definition_zh,
                full_marks=full_marks,
            )
        )
    register(
        MetricSpec(
            name=FIRST_FAILING_HOP,
            direction="lower",
            low=0.0,
            high=float(MAX_HOP),
            needs_labels=frozenset({"relevant_ids"}),
            needs_output=frozenset({RETRIEVALS}),
            source=PROJECT,
            definition=(
                "The first hop whose gold is not all in the top K of its retrieval call (0: every hop's is); "
                "a category, tabulated hop by hop, never averaged."
            ),
            definition_zh="第一个其标注证据未全部进入该跳检索前 K 的跳（0 表示每跳都命中）；按跳分类统计，不取平均。",
            population="answerable",
            per_case=False,
        )
    )


_register_offline_metrics()
_register_judge_metrics()
_register_hop_metrics()


REASON_KINDS = {
    "recall_at_k": "recall",
    "mrr": "rank",
    "ndcg_at_k": "ndcg",
    "citation_precision": "citation",
    "answer_accuracy": "accuracy",
}
"""Offline metric -> which rationale builder of :mod:`ragexp.metrics.reasons` explains its score."""
