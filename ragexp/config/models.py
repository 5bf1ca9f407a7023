"""Typed models of the composed config. Everything after composition works on these.

Fields marked ``runtime_only`` change how a run executes, not what it measures, so they are
left out of the config hash (see :mod:`ragexp.config.identity`).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictFloat, field_validator, model_validator

RUNTIME_ONLY: dict[str, Any] = {"runtime_only": True}


LATENCY_FLOOR_SECONDS = 0.001
"""The default latency noise floor (``gates.latency_floor_seconds``): a millisecond, above the
microseconds an in-process call takes and below any served system's latency."""


def runtime(default: Any, **kwargs: Any) -> Any:
    """A field that does not enter the config hash."""
    return Field(default, json_schema_extra=dict(RUNTIME_ONLY), **kwargs)


class Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


class MatchConfig(Model):
    """How a retrieved chunk is matched to a case's evidence (``relevant``): it matches a span
    when it comes from the span's document (when the system names documents) and its text
    overlaps the span. Texts are compared as written and, failing that, after NFKC, case folding
    and removing white space. Enters the dataset hash of a set with evidence."""

    min_overlap: float = Field(default=0.5, gt=0, le=1)
    """A chunk matches a span it overlaps by at least this share of the span's characters (a
    chunk holding the whole span always matches)."""
    min_chunk_chars: int = Field(default=20, ge=1)
    """A chunk lying wholly inside a span matches when it has at least this many characters, however
    small a share of the span it is."""
    same_doc: bool = True
    """When the system says which document a chunk comes from (``response.doc_ids``), a chunk
    matches only spans of that document; false: text alone decides."""


class DatasetConfig(Model):
    name: str = runtime(..., min_length=1)
    """Short name of the evaluation set, logged as the ``ragexp.dataset`` tag. Derived from the
    file when ``dataset.path`` is overridden alone. A label, not identity: the file's content
    enters the config hash, so a copy of the set elsewhere keeps its hash."""
    path: str = runtime(..., min_length=1)
    """JSONL or MindSDK column file. Relative paths are tried against the working directory, then
    the folder holding the user's ``conf/``, then the bundled data (``ragexp/data``). Its content,
    not its location, enters the config hash."""
    format: Literal["auto", "jsonl", "columns"] = "auto"
    """File format; ``auto`` picks ``columns`` for a single JSON object, else JSONL."""
    refusal_phrases: list[str] = Field(
        default_factory=lambda: ["没有足够证据", "无法回答", "证据不足", "cannot answer"]
    )
    """An answer to an unanswerable case is correct when it contains one of these
    (case-insensitive, after Unicode normalisation)."""
    author: str = runtime("unknown")
    """Who wrote the cases: the report states that the dataset is self-defined."""
    description: str = runtime("")
    """One sentence on what the cases cover."""
    corpus: str | None = runtime(None)
    """JSONL of ``{"id", "text"}`` chunks the labels point at: the run audits the labels against
    it (findings are logged and reported, never fatal). Relative paths as for ``path``. For a set
    with evidence, the documents it is anchored to: an unknown document, a span not in its
    document's text or offsets past its end stop the run."""
    match: MatchConfig = Field(MatchConfig(), json_schema_extra={"identity_omit_default": True})
    """How retrieved chunks are matched to evidence (``relevant``); unused by ``relevant_ids``."""
    case_ids: list[str] | None = Field(None, json_schema_extra={"identity_omit_null": True})
    """Evaluate only these cases of the file, by id (null: every case); a conversation's id
    chooses all its turns, and a turn chosen without the turns before it is refused (naming
    them). ``ragexp sweep --confirm`` sets it for its confirm run (the held-out cases)."""
    experiment: str | None = Field(None, min_length=1, json_schema_extra={"identity_omit_null": True})
    """Read the cases from this MLflow experiment's traces (production traffic, ``dataset=traces``)
    instead of ``path``: each trace's root span input is the question, its output the answer
    production gave, its RETRIEVER spans what production retrieved; a session is a conversation."""
    filter: str | None = Field(None, min_length=1, json_schema_extra={"identity_omit_null": True})
    """MLflow's trace filter string (``tags.route = 'refund'``) applied when reading
    ``dataset.experiment``; traces ragexp wrote are always left out."""
    start: str | None = Field(None, json_schema_extra={"identity_omit_null": True})
    """Earliest trace time read (ISO 8601, UTC when it names no zone; or epoch milliseconds), inclusive."""
    end: str | None = Field(None, json_schema_extra={"identity_omit_null": True})
    """Latest trace time read (as ``start``), exclusive: a window closed at both ends reads the
    same traces again, so a rerun draws the same sample."""
    sample: int | None = Field(None, ge=1, json_schema_extra={"identity_omit_null": True})
    """Draw this many traces (conversations for sessions) at random (null: every one read),
    spread over the strata of ``stratify_by`` in proportion to their size, at least one each."""
    stratify_by: str | None = Field(None, min_length=1, json_schema_extra={"identity_omit_null": True})
    """A trace tag or metadata key whose value is the case's stratum (a route, a topic); a trace
    without it is in stratum ``unknown``. Comparisons are then given per stratum."""
    seed: int = Field(0, json_schema_extra={"identity_omit_default": True})
    """Seed of the random sample drawn from the traces. Enters the hash (and the params) only when it
    differs from its default."""


def _unit_range() -> list[float | None]:
    return [0.0, 1.0]


class CustomMetric(Model):
    """What every metric of the team's own (``metrics.custom``) declares, whatever computes it."""

    name: str
    """The name it is logged under: an MLflow metric key of at most 50 characters without ``.``,
    ``/``, ``:`` or spaces, and no built-in metric's name."""
    direction: Literal["higher", "lower"] = "higher"
    """Which way is better."""
    range: list[float | None] = Field(default_factory=_unit_range)
    """``[low, high]``: every per-case value lies in it (null high: unbounded); a value outside
    is an error for that case, never clipped."""
    needs: list[str] = Field(default_factory=list)
    """The fields it reads (``question``, ``answer``, ``contexts``, ``ranked_ids``,
    ``citations``, ``reference``, ``expected_facts``, ``relevant_ids``): refused before the run
    when the dataset or the system does not give them."""
    over: Literal["all", "answerable"] = "all"
    """Which cases it is computed on and averaged over (``answerable``: the unanswerable cases
    get no score, as recall's mean leaves them out)."""
    description: str = runtime("")
    """One sentence on what it checks, for the report and the review queue's question (default:
    the rubric, or the target); a label, not identity."""


class PythonMetricConfig(CustomMetric):
    kind: Literal["python"]
    """``python``: a function of the team's own code, ``(case, output) -> float | bool |
    {"score", "rationale"}``, or an MLflow ``@scorer``."""
    target: str = Field(min_length=1)
    """``package.module:attr``, imported as ``provider.system.target`` is; the module's
    distribution version or file hash identifies the metric."""
    path: str | None = runtime(None)
    """A folder put on the import path before the target is imported."""
    timeout_s: float = runtime(30.0, gt=0)
    """Deadline in seconds for one call: a call past it is an error for that case."""


class JudgeMetricConfig(CustomMetric):
    kind: Literal["judge"]
    """``judge``: a rubric the configured judge (``provider.judge``) scores case by case."""
    rubric: str
    """What the judge checks, in the team's words; its text and the scale identify the metric."""
    scale: Any = "pass_fail"
    """``pass_fail`` (the judge answers 1 or 0) or ``[low, high]``, integers from 0 to 10 (e.g.
    ``[1, 5]``); the judge's score is mapped linearly onto ``range``."""


CUSTOM_METRIC_KINDS = ("python", "judge")
"""The ``kind`` tags of :data:`CustomMetricConfig`."""

CustomMetricConfig = Annotated[PythonMetricConfig | JudgeMetricConfig, Field(discriminator="kind")]
"""A metric of the team's own: one model per ``kind``."""


class MetricsConfig(Model):
    set: str = Field(min_length=1)
    """Name of the metric set (the ``metrics`` config group option), logged as a tag."""
    names: list[str]
    """Metric names, checked against the registry (no duplicates; at most 14 judge metrics, the
    rubrics of ``custom`` counted; at least one metric here or in ``custom``)."""
    custom: list[CustomMetricConfig] = Field([], json_schema_extra={"identity_omit_default": True})
    """The team's own metrics (docs/metrics.md#your-own-metrics), scored beside ``names``."""


class SampleConfig(Model):
    """Knobs of the bundled sample system (``ragexp.sample``); part of the config hash."""

    docs: str = runtime("kb_zh/docs.jsonl", min_length=1)
    """Knowledge base, JSONL ``{"id", "text", "title"?}``. Relative paths are resolved as for
    ``dataset.path``. Its content, not its location, enters the config hash."""
    top_k: int | None = Field(None, ge=1)
    """Documents the system returns and answers from; null: as many as ``k`` asks for."""
    rerank: bool = True
    """Rerank BM25's candidates by how much of the question they cover; false: BM25 order."""
    citations: Literal["source", "all", "none"] = "source"
    """What the answer cites: the document it was taken from, every returned document, or nothing."""
    chunking: Literal["doc", "sentence", "window"] = "doc"
    """Index one chunk per document (title + text), one per sentence, or windows of
    ``chunk_chars`` characters (``window``: the chunks themselves are returned, ids ``doc#n``)."""
    chunk_chars: int = Field(120, ge=10, json_schema_extra={"identity_omit_default": True})
    """Characters per window of ``chunking=window`` (other chunkings ignore it)."""
    overlap: int = Field(0, ge=0, json_schema_extra={"identity_omit_default": True})
    """Characters each window of ``chunking=window`` shares with the one before it (less than
    ``chunk_chars``)."""
    threshold: float = Field(3.0, ge=0)
    """Refuse to answer when the BM25 score of the chunk ranked first is below this."""
    hops: Literal[1, 2] = Field(1, json_schema_extra={"identity_omit_default": True})
    """Retrieval steps: ``1`` searches once; ``2`` searches, takes the bridge from the first
    evidence found (its text), and searches again for the question with the bridge, leaving out
    that document; each search is reported as a hop (``retrievals``)."""

    @model_validator(mode="after")
    def _window_overlap(self) -> SampleConfig:
        if self.chunking == "window" and self.overlap >= self.chunk_chars:
            raise ValueError(f"overlap ({self.overlap}) must be less than chunk_chars ({self.chunk_chars})")
        return self


class ResponseMapping(Model):
    """Where each output field is in a system's decoded reply: JMESPath expressions, null when
    the system does not give that field (a metric needing it is then refused before the run). An
    expression that finds nothing in a reply is an error for that case when a chosen metric reads
    that output."""

    answer: str | None = None
    """JMESPath of the answer text (a string)."""
    ranked_ids: str | None = None
    """JMESPath of the retrieved chunk ids, best first (a list of strings; numbers are taken as
    their decimal text)."""
    contexts: str | None = None
    """JMESPath of the retrieved texts, aligned with ``ranked_ids`` (a list of strings)."""
    citations: str | None = None
    """JMESPath of what the answer cites: positions in ``ranked_ids`` or ids (``citations_as``)."""
    doc_ids: str | None = Field(default=None, json_schema_extra={"identity_omit_null": True})
    """JMESPath of the document each retrieved chunk comes from, aligned with ``ranked_ids`` (a
    list of strings); evidence (``relevant``) is matched within a chunk's document."""
    timings: str | None = None
    """JMESPath of per-stage seconds (an object of non-negative numbers)."""
    scores: str | None = Field(default=None, json_schema_extra={"identity_omit_null": True})
    """JMESPath of the retrieval scores, aligned with ``ranked_ids`` (a list of numbers): shown
    on the case's retrieval span, never scored."""
    prompt_tokens: str | None = Field(default=None, json_schema_extra={"identity_omit_null": True})
    """JMESPath of the prompt (input) tokens the system's model used for the reply (a
    non-negative integer; OpenAI-compatible ``usage.prompt_tokens``); summed into the run's
    ``system.prompt_tokens`` and priced by ``cost.prices.system``. Finding nothing is no error:
    the case reported no usage."""
    completion_tokens: str | None = Field(default=None, json_schema_extra={"identity_omit_null": True})
    """JMESPath of the completion (output) tokens of the reply, as ``prompt_tokens``."""
    stages: str | None = Field(default=None, json_schema_extra={"identity_omit_null": True})
    """JMESPath of what each stage produced: ``{stage: {"ids", "scores", "ids_in"}}`` (stage
    names as in ``timings``), shown on the case's stage spans, never scored."""
    conversation_id: str | None = Field(default=None, json_schema_extra={"identity_omit_null": True})
    """JMESPath of the service's id of the conversation (Dify's ``conversation_id``, RAGFlow's
    ``data.session_id``): sent with the conversation's next turn as ``{conversation_id}``."""
    retrievals: str | None = Field(default=None, json_schema_extra={"identity_omit_null": True})
    """JMESPath of a multi-hop system's retrieval calls, in order (a list of ``{"query",
    "ranked_ids", "contexts", "doc_ids"}`` objects, with ``latency_seconds``, ``tokens`` and
    ``cost`` where the system reports them): each hop's gold is scored against its call."""
    tool_calls: str | None = Field(default=None, json_schema_extra={"identity_omit_null": True})
    """JMESPath of an agent's messages (LangChain's ``messages``): its tool calls are read from
    them, and with ``retriever_tool`` its retrievals, one per call of that tool."""
    retriever_tool: str | None = Field(default=None, json_schema_extra={"identity_omit_null": True})
    """The name of the agent's retriever tool: each of its calls in ``tool_calls`` is a hop's
    retrieval (its query, and the documents its tool message returned)."""
    error: str | None = None
    """JMESPath that yields the error message on an error envelope (e.g.
    ``code != `0` && message``): a truthy result makes the reply an error for that case."""
    citations_as: Literal["index", "id"] = "index"
    """``index``: citations are positions in ``ranked_ids``; ``id``: they are chunk ids."""
    citation_base: Literal[0, 1] = 1
    """Whether index citations count from 1 (the first retrieved chunk is 1) or from 0."""
    citation_pattern: str | None = None
    """Regular expression with one group, read over the answer text for citation markers
    (``\\[ID:(\\d+)\\]``, ``\\[(\\d+)\\]``); the group is an index or an id, as ``citations_as``."""


class StreamConfig(Model):
    """How a streamed reply is read: events, each decoded as JSON and mapped like a whole reply."""

    format: Literal["none", "sse", "ndjson"] = "none"
    """``none``: one JSON body; ``sse``: server-sent events (``data:`` lines); ``ndjson``: one
    JSON object per line."""
    delta: str | None = None
    """JMESPath of each event's piece of answer text; the pieces are joined into the answer.
    Null: the ``response.answer`` expression is read from the events instead."""
    cumulative: bool = False
    """Each event repeats the whole answer so far: the last non-empty one is the answer."""


class FakeSystemConfig(Model):
    kind: Literal["fake"]
    """``fake``: outputs built from the labels; proves the chain end to end, not the semantics."""


class ReplaySystemConfig(Model):
    kind: Literal["replay"]
    """``replay``: the outputs recorded in the dataset, with their recorded latency."""


class SampleSystemConfig(Model):
    kind: Literal["sample"]
    """``sample``: the bundled sample RAG system, in-process."""
    sample: SampleConfig | None = Field(None, json_schema_extra={"identity_omit_null": True})
    """Knobs of the sample system (null: its defaults)."""


class GenerateResponse(Model):
    """Where the answer is in a ``generate`` endpoint's reply."""

    answer: str = Field("answer", min_length=1)
    """JMESPath of the answer text (a string)."""
    citations: str | None = None
    """JMESPath of what the answer cites: positions in the contexts it was given, from 1 (null:
    the endpoint gives no citations; a metric reading them is then an error for each case)."""


class GenerateEndpoint(Model):
    """An HTTP system's answer stage, asked to answer from given contexts (``diff --attribute``)."""

    url: str = Field(min_length=1)
    """Endpoint that answers a question from the contexts in the request (POST, JSON body); the
    system's ``headers_env``, TLS files, timeout and retries apply to it too."""
    request: Any = Field(default_factory=lambda: {"question": "{question}", "contexts": "{contexts}"})
    """The JSON body. Strings may hold ``{question}``, ``{contexts}`` (a string that is exactly
    ``"{contexts}"`` is sent as the list of texts), ``{ranked_ids}``, ``{k}``, ``{case_id}`` and the
    case's ``metadata`` fields."""
    response: GenerateResponse = Field(default_factory=lambda: GenerateResponse.model_validate({}))
    """Where the answer (and the citations) are in the reply."""


class HttpSystemConfig(Model):
    kind: Literal["http"]
    """``http``: a RAG service under test over HTTP."""
    url: str | None = None
    """Endpoint of the RAG service under test (the full URL, query string included)."""
    method: Literal["POST", "GET"] = Field("POST", json_schema_extra={"identity_omit_default": True})
    """``POST``: ``request`` is the JSON body; ``GET``: ``request`` is the query parameters."""
    request: Any | None = Field(None, json_schema_extra={"identity_omit_null": True})
    """The JSON body (POST) or the query parameters (GET), any structure. Strings may hold
    ``{question}``, ``{k}``, ``{case_id}`` and the case's ``metadata`` fields; a string that is
    exactly ``"{k}"`` is sent as a number. Null: ``{"question", "k", "case_id"}``."""
    response: ResponseMapping | None = Field(None, json_schema_extra={"identity_omit_null": True})
    """Where each output field is in the reply. Null: ragexp's own contract
    (``{"ranked_ids", "contexts", "answer", "citations", "timings", "doc_ids"}``); a mapping that
    names none of those (only usage, an error envelope, a conversation id) adds to the contract."""
    stream: StreamConfig | None = Field(None, json_schema_extra={"identity_omit_null": True})
    """How a streamed reply is read (null: one JSON body)."""
    timeout_s: float = runtime(30.0, gt=0)
    """Deadline in seconds for one whole attempt: connecting, sending and reading the reply
    (a stream that stalls runs into it)."""
    max_retries: int = runtime(3, ge=0)
    """HTTP retries after the first attempt, on connect errors, timeouts, 429 and 5xx."""
    max_response_bytes: int = runtime(10_000_000, ge=1)
    """A larger reply (a whole stream, for a streamed one) is a case error, and is not read past
    this size."""
    headers_env: dict[str, str] = Field(default_factory=dict)
    """Header name -> environment variable holding its value (values never enter config);
    ``provider.system.headers_env={}`` sends none, whatever the preset sets."""
    ca_file: str | None = runtime(None)
    """PEM bundle of a private CA for TLS."""
    client_cert: str | None = runtime(None)
    """PEM file with a client certificate (and key) for mutual TLS."""
    client_key: str | None = runtime(None)
    """PEM file with the client certificate's key, when it is not inside ``client_cert``."""
    backoff_s: float = runtime(0.5, ge=0)
    """First retry delay; doubles per attempt (capped at 30 s) with random jitter."""
    abort_after: int = runtime(8, ge=1)
    """Stop the run when this many cases in a row failed at the transport level (refused,
    reset, timed out, 5xx or 429 after every retry) with no answer between them."""
    generate: GenerateEndpoint | None = runtime(None)
    """The system's answer stage over given contexts, for ``diff --attribute`` (null: the
    system cannot answer from contexts it is given, and cannot be attributed)."""


class PythonSystemConfig(Model):
    kind: Literal["python"]
    """``python``: a function or object of the team's own Python package, called in-process."""
    target: str = Field(min_length=1)
    """``package.module:attr``; ``attr`` may be dotted (``app:engine.query``)."""
    path: str | None = runtime(None)
    """A folder put on the import path before the target is imported (a location: the
    target's package version or file hash is what identifies the system)."""
    input: Any | None = Field(None, json_schema_extra={"identity_omit_null": True})
    """A request-like template (placeholders as in ``request`` of an HTTP system) passed as one
    positional argument; null: keyword arguments by parameter name."""
    response: ResponseMapping | None = Field(None, json_schema_extra={"identity_omit_null": True})
    """Where each output field is in the return value (turned into plain data first). Null:
    ragexp's own contract field names; a mapping that names none of them (only usage, say) adds to
    the contract."""
    timeout_s: float = runtime(30.0, gt=0)
    """Deadline in seconds for one call, and for the import of the target."""
    generate: str | None = runtime(None)
    """``package.module:attr`` of the system's answer stage over given contexts, for ``diff
    --attribute``: a function called as ``f(question, contexts)`` (contexts: a list of strings;
    may be async), or an object whose ``invoke``/``ainvoke`` takes ``{"question", "contexts"}``.
    It returns the answer text, or an object with ``answer`` (and ``citations``, positions in the
    contexts from 1). Null: the system cannot be attributed."""


SYSTEM_KINDS = ("fake", "replay", "sample", "http", "python")
"""The ``kind`` tags of :data:`SystemConfig`, in the order of its members."""

SystemConfig = Annotated[
    FakeSystemConfig | ReplaySystemConfig | SampleSystemConfig | HttpSystemConfig | PythonSystemConfig,
    Field(discriminator="kind"),
]
"""The system under test: one model per ``kind``, each with only its own keys."""


class EmbeddingsConfig(Model):
    kind: Literal["openai", "tei"] = "openai"
    """``openai``: an OpenAI-compatible ``/embeddings`` API; ``tei``: text-embeddings-inference."""
    url: str | None = runtime(None)
    """Base URL of the embeddings server (ragexp adds ``/embed`` for TEI)."""
    model: str = "embed-model"
    """Embeddings model name; part of the judge identity."""


class JudgeConfig(Model):
    kind: Literal["openai", "mindie"] = "openai"
    """``openai``: any OpenAI-compatible chat server; ``mindie``: MindIE on Ascend."""
    base_url: str | None = runtime(None)
    """Chat-completions base URL (ending in ``/v1``); not part of the judge identity."""
    model: str = "judge-model"
    """Judge model name; part of the judge identity."""
    api_key_env: str | None = "RAGEXP_JUDGE_API_KEY"
    """Environment variable holding the API key; null for a server without authentication."""
    embeddings: EmbeddingsConfig = Field(default_factory=EmbeddingsConfig)
    """Embeddings endpoint used by embedding-based metrics."""
    ca_file: str | None = runtime(None)
    """PEM bundle of a private CA, for chat and embeddings alike."""
    language: Literal["english", "chinese"] = "english"
    """Prompt language; ``chinese`` adapts each metric's prompts once and caches them."""
    prompts_path: str | None = runtime(None)
    """Folder for adapted prompts (default: inside the store folder)."""
    concurrency: int = runtime(16, ge=1)
    """Judge calls in flight at once, across all cases and metrics."""
    timeout_s: float = runtime(120.0, gt=0)
    """Deadline in seconds for one whole attempt of a judge call."""
    max_retries: int = runtime(3, ge=0)
    """HTTP retries per judge call."""
    max_response_bytes: int = runtime(10_000_000, ge=1)
    """A larger judge reply is an error for that metric, and is not read past this size."""
    abort_after: int = runtime(8, ge=1)
    """Stop the run when this many judge calls in a row failed with no answer between them."""
    max_tokens: int = Field(4096, ge=1)
    """Completion budget per judge call (long Chinese answers need more than 1024)."""
    repeats: int = Field(1, ge=1, le=100)
    """Score each case this many times; the case's score is the mean, the spread is kept."""
    cache: bool = runtime(True)
    """Keep judge results in a persistent cache, so an unchanged case costs no call on a rerun."""
    canaries: str | None = runtime(None)
    """A JSONL file of human-graded answers (``id``, ``question``, ``contexts``, ``answer``,
    ``reference``, ``human: {metric: score}``) the judge grades again in every judged run: its
    agreement with people (``judge_agreement.*``) shows a judge that drifted. Its content is
    tagged (``ragexp.judge.canaries``), not hashed into the config."""
    temperature: float = Field(0.01, ge=0, le=2)
    """Sampling temperature of judge calls (ragas' default)."""


class ProviderConfig(Model):
    name: str = Field(min_length=1)
    """Preset name (the ``provider`` config group option), logged as a tag."""
    system: SystemConfig
    """The RAG system whose outputs are evaluated."""
    judge: JudgeConfig | None = None
    """LLM judge for ragas metrics; null when no judge metric is asked for."""


class GateRule(Model):
    max_drop: float | None = Field(None, ge=0)
    """Largest allowed regression in the metric's bad direction (0: no regression)."""
    max_increase: float | None = Field(None, ge=0, json_schema_extra={"identity_omit_null": True})
    """Largest allowed rise of a metric where lower is better (``cost``, ``p95_seconds``), in the
    metric's own unit (``ttft_p95_seconds: {max_increase: 0.2}``: at most 0.2 s slower to the first
    token); on a metric where higher is better the rule cannot be checked."""
    max_increase_ratio: float | None = Field(None, ge=0)
    """Largest allowed relative move in the bad direction (0.2: at most 20% worse)."""
    min: float | None = None
    """Absolute floor on the candidate's value."""
    max: float | None = None
    """Absolute ceiling on the candidate's value (e.g. on ``error_rate``)."""
    statistical: bool = False
    """``max_drop`` fails only when the confidence interval of the paired difference lies
    wholly beyond the bound, so noise alone does not fail the gate. On a metric with human
    scores shared by both runs, the prediction-powered interval is used."""
    min_kappa: float | None = Field(None, ge=-1, le=1)
    """The candidate's judge must agree with the human scores at least this well (Cohen's κ at
    ``calibration.threshold``); no calibration at all fails too."""
    max_abs_bias: float | None = Field(None, ge=0)
    """The candidate's judge may be at most this far from the human scores on average
    (|mean judge - human|); no calibration at all fails too."""


class JudgeAgreementRules(Model):
    min_kappa: float | None = Field(default=None, ge=-1, le=1)
    """The candidate's judge must agree with people on the canaries at least this well (Cohen's κ
    at ``calibration.threshold``), on every judge metric it graded them for."""
    max_kappa_drop: float | None = Field(default=None, ge=0)
    """Largest allowed fall of that κ from the baseline's: a larger one is a judge that changed."""


class JudgeBiasRules(Model):
    max_abs: float | None = Field(default=None, ge=0)
    """The candidate's judge may be at most this far from people on the canaries on average
    (|mean judge - human|)."""
    max_change: float | None = Field(default=None, ge=0)
    """Largest allowed move of that bias from the baseline's, either way: a larger one is a judge
    that changed."""


class GatesConfig(Model):
    name: str = Field(min_length=1)
    """Preset name (the ``gates`` config group option)."""
    rules: dict[str, GateRule] = Field(default_factory=dict)
    """Metric name -> rule. Metrics not named here are compared but never fail the gate."""
    max_error_rate: float | None = Field(0.0, ge=0, le=1)
    """The candidate fails when more than this share of its cases errored (null: no cap)."""
    confidence: float = Field(0.95, gt=0, lt=1)
    """Confidence level of the intervals used by statistical rules and by ``ragexp diff``."""
    resamples: int = Field(10_000, ge=100)
    """Sign-flip draws of the randomization test (its p-value and its inverted interval)."""
    seed: int = 0
    """Random seed of the sign-flip draws, so results repeat."""
    # Left out of the hashes while unset, so configs without these rules keep their identity.
    judge_agreement: JudgeAgreementRules = Field(
        JudgeAgreementRules(), json_schema_extra={"identity_omit_default": True}
    )
    """Rules on the judge's agreement with people on ``judge.canaries`` (``min_kappa``, ``max_kappa_drop``)."""
    judge_bias: JudgeBiasRules = Field(JudgeBiasRules(), json_schema_extra={"identity_omit_default": True})
    """Rules on the judge's bias on ``judge.canaries`` (``max_abs``, ``max_change``)."""
    latency_floor_seconds: float = runtime(LATENCY_FLOOR_SECONDS, ge=0)
    """The latency noise floor, in seconds: a latency figure (``p95_seconds``, a stage's timing)
    below it in both runs is timer and scheduler noise (an in-process system answers in
    microseconds), reported as below the floor, never as better or worse: a rule on it passes,
    ``diff`` says ``below noise floor``, and a sweep leaves it out of the front. 0: no floor."""
    on_underpowered: Literal["warn", "fail"] = runtime("warn")
    """What a rule that cannot tell does: an underpowered ``max_drop`` / ``max_increase_ratio``
    rule, or a rule a sequential run (``run --until-decided``) left inconclusive. ``warn``: a
    note beside its verdict; ``fail``: the rule fails the gate (exit 2)."""


class SequentialConfig(Model):
    """``ragexp run --baseline RUN --until-decided``: evaluate in batches until the gate is decided."""

    batch: float = runtime(0.1, gt=0)
    """Cases per batch: a share of the dataset below 1 (0.1: a tenth), a number of cases from 1 up."""
    seed: int = runtime(0)
    """Seed of the random order the cases are evaluated in."""


class CalibrationConfig(Model):
    threshold: float = Field(default=0.5, ge=0, le=1)
    """A score at or above this is a pass, for the accuracy and Cohen's κ of judge vs human."""
    min_labelled: int = Field(default=10, ge=2)
    """Fewest labelled, scored cases for a metric's calibration and prediction-powered mean."""
    confidence: float = Field(default=0.95, gt=0, lt=1)
    """Confidence level of the κ interval and the prediction-powered interval."""
    resamples: int = runtime(2000, ge=100)
    """Bootstrap resamples of the κ interval."""


class TrackingConfig(Model):
    uri: str | None = runtime(None)
    """MLflow tracking URI (``--tracking-uri`` is the same setting); null: ``MLFLOW_TRACKING_URI``, else
    ``sqlite:///mlruns/mlflow.db``."""
    timeout_s: float = runtime(60.0, gt=0)
    """How long a tracking server may fail to answer one logging call before the run stops
    (checkpoint kept for ``--resume``)."""
    traces: bool = runtime(True)
    """Log every case as an MLflow trace with one assessment per metric (the UI's per-case
    comparison of runs); ``cases.jsonl`` is the complete record either way."""
    traces_max_cases: int = runtime(5000, ge=0)
    """Above this many cases, only the errored and imperfect cases get a trace (up to this many)."""


class ReportConfig(Model):
    language: Literal["zh", "en"] = runtime("zh")
    """Language of ``ragexp report`` (Chinese by default)."""


class ConversationConfig(Model):
    """How the turns of a conversation (a case with ``turns``) are asked."""

    history: Literal["own", "reference"] = "own"
    """What a turn's history holds after each earlier question: ``own``, the system's own answers
    (what a user of the chat app sees); ``reference``, the turns' reference answers, so each turn
    is judged apart from the system's earlier mistakes (every turn followed by another needs a
    ``reference``)."""


MAX_PRICE = 1e6
"""The highest price of a million tokens taken: far above any model's, low enough that a run's
cost stays a finite number (a price near the float limit times the tokens would be infinity)."""


class TokenPrices(Model):
    """What tokens cost, per million tokens, in ``cost.currency``."""

    prompt: StrictFloat = Field(ge=0, le=MAX_PRICE, allow_inf_nan=False)
    """Price of one million prompt (input) tokens (a number: ``true`` or ``"1"`` is refused)."""
    completion: StrictFloat = Field(ge=0, le=MAX_PRICE, allow_inf_nan=False)
    """Price of one million completion (output) tokens."""


class CostPrices(Model):
    """Prices of the two parts of a run that use tokens; a part left null costs nothing."""

    system: TokenPrices | None = None
    """The system under test's model, from the usage its replies report
    (``provider.system.response.prompt_tokens``/``completion_tokens``)."""
    judge: TokenPrices | None = None
    """The judge's model, from the usage its replies report (embedding tokens count as prompt
    tokens)."""


class CostConfig(Model):
    """How a run's tokens become its ``cost`` metric."""

    prices: CostPrices | None = runtime(None)
    """Price table; null: tokens are logged, no ``cost``."""
    currency: str = runtime("USD", min_length=1, max_length=10)
    """What the prices are in; shown beside ``cost``."""


class RagexpConfig(Model):
    experiment: str = Field("ragexp", min_length=1)
    """MLflow experiment the run is logged to (``experiment=`` stays this name; it is not a group)."""
    k: int = Field(ge=1, le=10_000, strict=True)
    """Cut-off of Recall@K and nDCG@K, and how many ids are asked of the system."""
    concurrency: int = runtime(8, ge=1, le=4096)
    """Requests to the system under test in flight at once; also the most threads a metric of
    your own (``metrics.custom``) is called on."""
    progress: bool | None = runtime(None)
    """Progress on stderr (a bar while evaluating and judging, a line for any other phase that takes
    over a second); null: only when stderr is a terminal."""
    dataset: DatasetConfig
    """The evaluation set."""
    metrics: MetricsConfig
    """What is measured."""
    provider: ProviderConfig
    """Who answers, and who judges."""
    gates: GatesConfig
    """Release-gate thresholds used by ``ragexp gate``."""
    sequential: SequentialConfig = runtime(SequentialConfig())
    """Batches of ``run --until-decided`` (not part of the config hash)."""
    run_name: str | None = runtime(None, min_length=1, max_length=250)
    """MLflow run name (default: ``<config hash[:12]>-<provider.name>-<dataset.name>-k<k>``, cut to
    250 characters; the hash first, as the UI shows a name's first characters)."""
    tags: dict[str, str | int | float | bool] = Field(default_factory=dict, json_schema_extra=dict(RUNTIME_ONLY))
    """Extra MLflow tags, e.g. ``+tags.role=baseline``; they label a run, never change its hash."""
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    """Where runs are logged."""
    report: ReportConfig = Field(default_factory=ReportConfig)
    """How ``ragexp report`` presents the run."""
    calibration: CalibrationConfig = Field(default_factory=lambda: CalibrationConfig())
    """How judge scores are compared with the dataset's human scores."""
    conversation: ConversationConfig = Field(
        default=ConversationConfig(), json_schema_extra={"identity_omit_default": True}
    )
    """How the turns of conversations are asked (single questions ignore it)."""
    cost: CostConfig = Field(default_factory=lambda: CostConfig(), json_schema_extra=dict(RUNTIME_ONLY))
    """Token prices, for the run's ``cost`` metric."""

    @field_validator("experiment")
    @classmethod
    def _no_slash(cls, value: str) -> str:
        if value.strip() != value:
            raise ValueError("must not start or end with white space")
        return value
