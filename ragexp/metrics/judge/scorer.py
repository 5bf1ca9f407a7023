"""Scoring cases with ragas judge metrics: bounded concurrency, a persistent cache, repeats,
and every failure kept as that case's error for that metric (never a score).

ragas (about 3 s to import here) and the HTTP client are imported only when a judge call is
needed: a rerun whose scores all come from the cache costs what an offline run costs.
"""

from __future__ import annotations

import asyncio
import inspect
import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from ragexp import secrets
from ragexp.config.models import JudgeConfig
from ragexp.conversations import transcript
from ragexp.errors import ProviderError
from ragexp.metrics.judge import identity
from ragexp.metrics.judge.cache import Graded, JudgeCache, cache_key
from ragexp.metrics.judge.prompts import (
    dump_prompt,
    fingerprint,
    load_prompt,
    prompts_of,
    read_saved,
    saved_path,
    write_saved,
)
from ragexp.metrics.judge.usage import Usage
from ragexp.metrics.registry import MetricSpec
from ragexp.progress import Progress
from ragexp.records import Case, CaseResult
from ragexp.secrets import scrub
from ragexp.transport import AbortWatch, check_reachable, run_interruptibly, ssl_context

JSON_MODE = {"openai": True, "mindie": False}
"""Judge kind -> send ``response_format: json_object`` (MindIE's OpenAI API does not take it)."""
SYNC_EMBEDDINGS = frozenset({"SemanticSimilarity"})
"""ragas classes whose ``ascore`` calls the synchronous ``embed_text``: run in a worker thread."""
RAGAS_VERSION = version("ragas")


class JudgeScoreError(Exception):
    """The judge answered, but the metric produced no usable score."""


@dataclass
class JudgeOutcome:
    scores: dict[str, np.ndarray]
    """Metric -> (n,) per-case score (mean over repeats), NaN where missing."""
    errors: dict[int, dict[str, str]]
    """Case index -> metric -> reason."""
    spread: dict[str, np.ndarray] = field(default_factory=dict)
    """Metric -> (n,) standard deviation over repeats (only when repeats > 1)."""
    usage: Usage = field(default_factory=Usage)
    cache_hits: int = 0
    rationales: dict[int, dict[str, str]] = field(default_factory=dict)
    """Case index -> metric -> the judge's rationale where the metric gives one (its first repeat):
    the rubrics of the user's, and any ragas metric whose result carries a ``reason``."""
    served: set[str] = field(default_factory=set)
    """The served identities of the grades used (:mod:`ragexp.metrics.judge.identity`); an empty
    string: grades whose server named nothing."""
    stale: int = 0
    """Cached grades refused because another served identity made them (graded again)."""


Item = tuple[int, MetricSpec, int, dict[str, Any], str]
"""One grade to make: case index, metric, repeat, the metric's inputs, its cache key."""

Turns = Sequence[list[dict[str, str]] | None] | None
"""Each case's earlier turns (``{"role", "content"}`` messages), None for a single-turn case; None
for a run without conversations."""


class Judging(Protocol):
    """What scores a run's judge metrics: :class:`JudgeScorer`, or what wraps one (the sequential
    run's judge, which asks it once per case)."""

    adaptation_usage: Usage
    """The judge's calls and tokens spent adapting its prompts before the run."""

    def score(
        self, cases: Sequence[Case], results: Sequence[CaseResult], *, progress: bool | None, histories: Turns = None
    ) -> JudgeOutcome:
        """The judge's scores of ``cases`` (and their errors, spread, usage and rationales);
        ``histories``: each turn's earlier turns, which the judge reads before its question."""
        ...


class JudgeScorer:
    def __init__(
        self, config: JudgeConfig, specs: Sequence[MetricSpec], state_dir: Path, warn: Callable[[str], None]
    ) -> None:
        self.config = config
        self.specs = [spec for spec in specs if spec.judge]
        self.state_dir = state_dir
        self.warn = warn
        self.api_key: str | None = None
        self.prompts: dict[str, dict[str, dict[str, Any]]] = {}
        self.identity = ""
        self.sources: dict[str, dict[str, Any]] = {}
        self._verify = ssl_context("provider.judge", None)
        self.adaptation_usage = Usage()
        self.served: set[str] = set()
        """The served identities of every grade this scorer used so far (its run's, across calls)."""
        self.stale = 0
        self.prompt_digest = ""

    # --- before the run --------------------------------------------------------------------------

    @property
    def ragas_specs(self) -> list[MetricSpec]:
        """The selected ragas metrics (the others are rubrics of the user's: ragexp's own prompt)."""
        return [spec for spec in self.specs if spec.custom is None]

    def _needs(self, what: str) -> bool:
        """Whether a selected metric takes an ``llm`` / ``embeddings`` (from the source dump)."""
        rubric = what == "llm" and len(self.ragas_specs) < len(self.specs)
        return rubric or any(what in self.sources[spec.name]["components"] for spec in self.ragas_specs)

    def identity_of(self, spec: MetricSpec) -> str:
        """What a metric's judge results depend on: the judge's identity, and a rubric's own."""
        return self.identity if spec.custom is None else f"{self.identity}|{spec.custom.identity}"

    def preflight(self) -> None:
        """Secrets, TLS, reachability and prompt adaptation: everything before a run exists."""
        cfg = self.config
        secrets.register_url(cfg.base_url)
        secrets.register_url(cfg.embeddings.url)
        if cfg.api_key_env is not None:
            self.api_key = secrets.from_env(cfg.api_key_env, "provider.judge.api_key_env")
            for key, url in (("base_url", cfg.base_url), ("embeddings.url", cfg.embeddings.url)):
                credential = secrets.url_credentials(url)
                if credential:
                    self.warn(
                        f"warning: provider.judge.{key} carries credentials ({credential}) and "
                        f"provider.judge.api_key_env is set: the API key from {cfg.api_key_env} is sent"
                    )
        if cfg.ca_file and not Path(cfg.ca_file).is_file():
            raise ProviderError(f"provider.judge.ca_file: no such file: {cfg.ca_file}")
        self._verify = ssl_context("provider.judge", cfg.ca_file)
        self.sources = self._source_prompts()
        if self._needs("llm"):
            if not cfg.base_url:
                raise ProviderError("provider.judge.base_url: required for the judge metrics asked for")
            check_reachable("provider.judge.base_url", cfg.base_url, cfg.timeout_s, self._verify)
        if self._needs("embeddings"):
            if not cfg.embeddings.url:
                raise ProviderError("provider.judge.embeddings.url: required for the embedding-based metrics")
            check_reachable("provider.judge.embeddings.url", cfg.embeddings.url, cfg.timeout_s, self._verify)
        self._prepare_prompts()
        self.prompt_digest = fingerprint(self.prompts)[:12]
        self.identity = (
            f"{cfg.kind}:{cfg.model}|embeddings={cfg.embeddings.kind}:{cfg.embeddings.model}|"
            f"language={cfg.language}|prompts={self.prompt_digest}|ragas={RAGAS_VERSION}"
        )

    def _prompts_folder(self) -> Path:
        return Path(self.config.prompts_path) if self.config.prompts_path else self.state_dir / "prompts"

    def _source_prompts(self) -> dict[str, dict[str, Any]]:
        """Each metric's English prompts as ragas ships them, dumped once per ragas version."""
        path = self._prompts_folder() / f"source-ragas-{RAGAS_VERSION}.json"
        known: dict[str, dict[str, Any]] = read_saved(path) or {}
        missing = [spec for spec in self.ragas_specs if spec.name not in known]
        if missing:
            from ragexp.metrics.judge.client import JudgeEmbeddings, JudgeHTTP, JudgeLLM

            http = JudgeHTTP(self.config, None, self._verify)  # never entered: no call is made
            llm, embeddings = JudgeLLM(http, self.config, True), JudgeEmbeddings(http, self.config)
            for spec in missing:
                metric = self._build(spec, llm, embeddings)
                components = [name for name in ("llm", "embeddings") if getattr(metric, name, None) is not None]
                known[spec.name] = {
                    "components": components,
                    "prompts": {name: dump_prompt(prompt) for name, prompt in prompts_of(metric).items()},
                }
            write_saved(path, known)
        return known

    def _prepare_prompts(self) -> None:
        """The prompts in use: the source ones, or their adaptation (saved once, then reused)."""
        cfg = self.config
        pending = []
        for spec in self.ragas_specs:
            source = self.sources[spec.name]["prompts"]
            if cfg.language == "english" or not source:
                self.prompts[spec.name] = source
                continue
            path = saved_path(
                self._prompts_folder(), cfg.language, cfg.model, spec.name, fingerprint({spec.name: source})
            )
            saved = read_saved(path)
            if saved is not None and "prompts" in saved:
                self._use_saved(spec, saved)
            else:
                pending.append((spec, path))
        if pending:
            run_interruptibly(self._adapt_all(pending))

    def _use_saved(self, spec: MetricSpec, saved: dict[str, Any]) -> None:
        if saved.get("unadaptable"):
            self.warn(
                f"warning: metric {spec.name}: ragas cannot adapt its prompts to {self.config.language} "
                f"({saved['unadaptable']}); its English prompts are used"
            )
        self.prompts[spec.name] = saved["prompts"]

    async def _adapt_all(self, pending: list[tuple[MetricSpec, Path]]) -> None:
        from ragexp.metrics.judge.client import JudgeEmbeddings, JudgeHTTP, JudgeLLM

        cfg = self.config
        async with JudgeHTTP(cfg, self.api_key, self._verify) as http:
            llm, embeddings = JudgeLLM(http, cfg, JSON_MODE[cfg.kind]), JudgeEmbeddings(http, cfg)
            for spec, path in pending:
                metric = self._build(spec, llm, embeddings)
                saved = await self._adapt(spec, prompts_of(metric), self.sources[spec.name]["prompts"], llm)
                write_saved(path, saved)
                self._use_saved(spec, saved)
            self.adaptation_usage.add(http.usage)

    async def _adapt(
        self, spec: MetricSpec, prompts: dict[str, Any], source: dict[str, Any], llm: Any
    ) -> dict[str, Any]:
        from ragexp.metrics.judge.client import JudgeCallError

        adapted: dict[str, Any] = {}
        for name, prompt in prompts.items():
            try:
                adapted[name] = dump_prompt(await prompt.adapt(self.config.language, llm))
            except JudgeCallError as exc:  # the judge is down: say so now, do not remember it
                raise ProviderError(f"provider.judge: adapting the prompts of {spec.name} failed: {exc}") from None
            except Exception as exc:
                return {"unadaptable": f"{type(exc).__name__}: {exc}"[:200], "prompts": source}
        return {"language": self.config.language, "prompts": adapted}

    def _build(self, spec: MetricSpec, llm: Any, embeddings: Any) -> Any:
        if spec.custom is not None:
            from ragexp.metrics.judge.rubric import RubricMetric

            return RubricMetric(llm, spec, self.config.language)
        import ragas.metrics.collections as collections

        cls = getattr(collections, spec.ragas_class or "")
        parameters = inspect.signature(cls.__init__).parameters
        kwargs: dict[str, Any] = {}
        if "llm" in parameters:
            kwargs["llm"] = llm
        if "embeddings" in parameters:
            kwargs["embeddings"] = embeddings
        metric = cls(**kwargs)
        for name, data in self.prompts.get(spec.name, {}).items():
            prompt = getattr(metric, name, None)
            if prompt is not None:
                load_prompt(prompt, data)
        return metric

    # --- during the run --------------------------------------------------------------------------

    def score(
        self, cases: Sequence[Case], results: Sequence[CaseResult], *, progress: bool | None, histories: Turns = None
    ) -> JudgeOutcome:
        """:meth:`Judging.score`."""
        # The collector stays off here (unlike the HTTP provider): measured, it cost a sixth of
        # the judging time, and judge runs are small enough that their cycles do not add up.
        return run_interruptibly(self._score(cases, results, progress, histories))

    async def _score(
        self,
        cases: Sequence[Case],
        results: Sequence[CaseResult],
        progress_on: bool | None,
        histories: Turns = None,
    ) -> JudgeOutcome:
        cfg = self.config
        repeats = cfg.repeats
        values = {spec.name: np.full((len(cases), repeats), np.nan) for spec in self.specs}
        errors: dict[int, dict[str, str]] = {}
        rationales: dict[int, dict[str, str]] = {}
        cache = JudgeCache(self.state_dir / "judge_cache.sqlite" if cfg.cache else None)
        todo: deque[Item] = deque()
        kept: list[tuple[Item, list[Graded]]] = []
        for index, (case, result) in enumerate(zip(cases, results, strict=True)):
            if not result.ok or result.output is None:
                continue  # the system call failed: every metric is already missing
            fields = {
                "user_input": transcript(case.question, histories[index] if histories is not None else None),
                "response": result.output.answer,
                "retrieved_contexts": result.output.contexts,
                "reference": case.reference or "",
            }
            for spec in self.specs:
                inputs = {name: fields[name] for name in spec.ragas_args}
                empty = [
                    name
                    for name, value in inputs.items()
                    if not value or not any(str(v).strip() for v in (value if isinstance(value, list) else [value]))
                ]
                if empty:  # ragas would refuse it too; saying so here needs no judge (and no ragas import)
                    errors.setdefault(index, {})[spec.name] = f"{empty[0]} is empty: the metric cannot be computed"
                    continue
                for repeat in range(repeats):
                    key = cache_key(spec.name, self.identity_of(spec), inputs, repeat)
                    item = (index, spec, repeat, inputs, key)
                    found = cache.graded(key)
                    if found:
                        kept.append((item, found))
                    else:
                        todo.append(item)
        usage = Usage()
        aborted: list[str] = []
        hits = 0
        try:
            if todo:
                usage = await self._call_judge(todo, values, errors, cache, aborted, progress_on, rationales)
            # Who serves the judge is known only from its replies: where cached grades name a
            # server (a channel: chat, embeddings, MindIE, TEI) this run has not heard from yet,
            # one of them is graded afresh first, so that a judge swapped since is seen, not trusted.
            probes: deque[Item] = deque()
            covered = set(identity.seen(self.served))
            for channel in sorted({c for _, found in kept for c in identity.channels(found[0].served)}):
                if channel in covered:
                    continue
                at = next(i for i, (_, found) in enumerate(kept) if channel in identity.channels(found[0].served))
                item, found = kept.pop(at)
                probes.append(item)
                covered |= set(identity.channels(found[0].served))
            if probes and not aborted:
                usage.add(await self._call_judge(probes, values, errors, cache, aborted, progress_on, rationales))
            stale: deque[Item] = deque()
            for item, found in kept:
                index, spec, repeat, _, key = item
                grade = self._matching(found)
                if grade is None:
                    stale.append(item)
                    continue
                hits += 1
                self.served.add(grade.served)
                values[spec.name][index, repeat] = grade.value
                if grade.rationale and repeat == 0:
                    rationales.setdefault(index, {})[spec.name] = grade.rationale
            self.stale += len(stale)
            if stale and not aborted:
                usage.add(await self._call_judge(stale, values, errors, cache, aborted, progress_on, rationales))
        finally:
            cache.close()
        if aborted:
            raise ProviderError(aborted[0])
        scores, spread = {}, {}
        for name, table in values.items():
            complete = np.isfinite(table).all(axis=1)
            scores[name] = np.where(complete, np.nanmean(np.where(complete[:, None], table, 0.0), axis=1), np.nan)
            if repeats > 1:
                spread[name] = np.where(complete, np.std(np.where(complete[:, None], table, 0.0), axis=1), np.nan)
        for index, reasons in errors.items():
            for name in reasons:
                scores[name][index] = np.nan
                rationales.get(index, {}).pop(name, None)
        return JudgeOutcome(scores, errors, spread, usage, hits, rationales, set(self.served), self.stale)

    def _matching(self, found: list[Graded]) -> Graded | None:
        """The cached grade of a key that this run may use: the newest whose every served part
        the run has heard so far (a part on a channel it has not heard from cannot disagree)."""
        seen = identity.seen(self.served)
        for grade in found:
            parts = identity.channels(grade.served)
            if all(channel not in seen or value in seen[channel] for channel, value in parts.items()):
                return grade
        return None

    async def _call_judge(
        self,
        todo: deque[Item],
        values: dict[str, np.ndarray],
        errors: dict[int, dict[str, str]],
        cache: JudgeCache,
        aborted: list[str],
        progress_on: bool | None,
        rationales: dict[int, dict[str, str]],
    ) -> Usage:
        from ragexp.metrics.judge.client import JudgeCallError, JudgeEmbeddings, JudgeHTTP, JudgeLLM

        cfg = self.config
        repeats = cfg.repeats
        progress = Progress(len(todo), "judging", enabled=progress_on)
        async with JudgeHTTP(cfg, self.api_key, self._verify) as http:
            llm, embeddings = JudgeLLM(http, cfg, JSON_MODE[cfg.kind]), JudgeEmbeddings(http, cfg)
            metrics = {spec.name: self._build(spec, llm, embeddings) for spec in self.specs}
            watch = AbortWatch(min(cfg.abort_after, len(todo)), "the judge")
            answered = 0

            async def worker() -> None:
                nonlocal answered
                while todo and not aborted:
                    index, spec, repeat, inputs, key = todo.popleft()
                    seen = identity.begin_grade()
                    try:
                        value, said = await self._one(metrics[spec.name], spec, inputs)
                    except JudgeCallError as exc:
                        reason = str(exc)
                        # A metric makes several calls: it is the HTTP layer that knows whether
                        # the judge has answered anything since the last failure. A judge that
                        # answered gave this case an unusable output: the case's error, no sign
                        # of a failing judge. Counted, it could stop a run on one case (a rerun
                        # whose cache leaves only that case sets the limit to 1).
                        if http.usage.successes > answered:
                            watch.success()
                        elif watch.failure(reason):
                            aborted.append(watch.aborted or reason)
                        answered = http.usage.successes
                    except Exception as exc:  # ragas raises anything; it is this case's error
                        reason = _reason(exc)
                    else:
                        values[spec.name][index, repeat] = value
                        served = identity.grade_identity(seen, self.prompt_digest)
                        self.served.add(served)
                        cache.put_graded(key, served, value, said)
                        if said and repeat == 0:
                            rationales.setdefault(index, {})[spec.name] = said
                        answered = http.usage.successes
                        watch.success()
                        progress.advance()
                        continue
                    prefix = f"repeat {repeat + 1}: " if repeats > 1 else ""
                    errors.setdefault(index, {}).setdefault(spec.name, prefix + reason)
                    progress.advance(error=True)

            try:
                await asyncio.gather(*(worker() for _ in range(min(len(todo), cfg.concurrency * 2))))
            finally:
                progress.close()
            return http.usage

    async def _one(self, metric: Any, spec: MetricSpec, inputs: dict[str, Any]) -> tuple[float, str | None]:
        """The metric's score of one case, and the judge's reason when it gives one."""
        if spec.ragas_class in SYNC_EMBEDDINGS:
            result = await asyncio.to_thread(asyncio.run, metric.ascore(**inputs))
        else:
            result = await metric.ascore(**inputs)
        value = float(getattr(result, "value", result))
        if not math.isfinite(value):
            raise JudgeScoreError("the judge gave no usable score (NaN)")
        high = spec.high if spec.high is not None else math.inf
        if not spec.low - 1e-9 <= value <= high + 1e-9:
            raise JudgeScoreError(f"score {value:g} is outside [{spec.low:g}, {high:g}]")
        reason = getattr(result, "reason", None)
        return min(max(value, spec.low), high), scrub(reason) if isinstance(reason, str) and reason else None


def _reason(exc: BaseException) -> str:
    from ragexp.metrics.judge.client import JudgeCallError
    from ragexp.metrics.judge.rubric import RubricScoreError

    if isinstance(exc, JudgeCallError | JudgeScoreError | RubricScoreError):
        return str(exc)
    text = scrub(str(exc)).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:300].rstrip(": ")
