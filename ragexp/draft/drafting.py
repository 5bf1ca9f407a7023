"""Drafting cases with the configured judge model: plan, ask, check, keep or drop with a reason.

Calls go through the judge's client (:mod:`ragexp.metrics.judge.client`): the same OpenAI-
compatible / MindIE settings, the one bound on calls in flight, the transport's retries, the
re-ask of a reply that is not the expected JSON, and its token accounting.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import random
from collections import Counter
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from ragexp import secrets
from ragexp.config.models import JudgeConfig
from ragexp.datasets.evidence import anchor_span
from ragexp.draft.cache import DraftCache
from ragexp.draft.corpus import Chunk
from ragexp.draft.rules import (
    RETRIEVE_K,
    Retriever,
    found_in,
    loosely_written,
    missing_facts,
    near_duplicates,
    stratified,
)
from ragexp.errors import ConfigError, ProviderError
from ragexp.escape import prompt_attribute, prompt_block
from ragexp.metrics.judge.cache import cache_key
from ragexp.metrics.judge.scorer import JSON_MODE
from ragexp.metrics.judge.usage import Usage
from ragexp.transport import check_reachable, ssl_context

KINDS = ("single", "multi", "unanswerable")
KIND_WORDS = {"single": "single-chunk", "multi": "two-chunk (--multi)", "unanswerable": "unanswerable"}
REFUSAL_REFERENCE = {"english": "The documents do not answer this question.", "chinese": "知识库中没有相关信息。"}
"""The reference of an unanswerable case: the refusal a system should give."""

REASONS = {
    "unusable_reply": "the model's reply was not the expected JSON, twice",
    "fact_not_in_source": "an expected fact was not a verbatim span of its chunk, twice",
    "fact_not_verbatim": "an expected fact was in its chunk only rewritten (width, case or white space), twice",
    "no_fact_from_each_chunk": "a two-chunk question without a fact from each chunk, twice",
    "answer_in_corpus": "an 'unanswerable' question whose answer candidate the corpus holds",
    "near_duplicate": "a near-duplicate of an earlier question",
    "no_related_chunk": "no other chunk shares a term with it (no two-chunk question)",
    "call_failed": "no reply: the call failed after retries, or was not made once the model stopped "
    "answering (rerun to ask again; the cache keeps the rest)",
}
"""Why a planned case gave no case, as the closing summary words it."""


class NotAsked(Exception):
    """A call not made: the model had stopped answering (``provider.judge.abort_after``)."""


class DraftCase(BaseModel):
    """A question the chunk(s) answer, with verbatim facts."""

    question: str = Field(min_length=1)
    expected_facts: list[str]
    reference: str


class DraftUnanswerable(BaseModel):
    """A question near the chunk's topic that the corpus does not answer."""

    question: str = Field(min_length=1)
    answer_candidates: list[str]


@dataclass(frozen=True)
class Options:
    n: int = 100
    """Cases to plan (before drops)."""
    unanswerable: float = 0.1
    """Share of unanswerable questions."""
    multi: float = 0.2
    """Share of two-chunk questions."""
    seed: int = 0
    """Seed of the chunk sampling."""

    def counts(self) -> dict[str, int]:
        if self.n < 1:
            raise ConfigError(f"--n: at least 1, got {self.n}")
        for name, share in (("--unanswerable", self.unanswerable), ("--multi", self.multi)):
            if not 0 <= share <= 1:
                raise ConfigError(f"{name}: a share between 0 and 1, got {share}")
        if self.unanswerable + self.multi > 1:
            raise ConfigError(f"--unanswerable {self.unanswerable} + --multi {self.multi}: more than 1")
        unanswerable, multi = round(self.n * self.unanswerable), round(self.n * self.multi)
        return {"single": self.n - unanswerable - multi, "multi": multi, "unanswerable": unanswerable}


@dataclass(frozen=True)
class Task:
    kind: str
    sources: tuple[int, ...]
    """Corpus positions: one chunk, or the seed chunk and its related chunk."""


@dataclass
class Summary:
    chunks: int
    planned: int
    written: int = 0
    by_kind: Counter[str] = field(default_factory=Counter)
    dropped: Counter[str] = field(default_factory=Counter)
    chunks_with_cases: int = 0
    first_failure: str | None = None
    usage: Usage = field(default_factory=Usage)
    cache_hits: int = 0
    planned_by_kind: dict[str, int] = field(default_factory=dict)
    dropped_by_kind: dict[str, Counter[str]] = field(default_factory=dict)
    """Kind of case -> why its planned cases gave none (the counts of ``dropped``, split)."""
    examples: dict[str, str] = field(default_factory=dict)
    """Reason -> the first fact it rejected, as the model wrote it."""

    def drop(self, kind: str, reason: str, example: str | None = None, count: int = 1) -> None:
        """Count ``count`` planned cases of ``kind`` that gave no case, for ``reason``."""
        if count:
            self.dropped[reason] += count
            self.dropped_by_kind.setdefault(kind, Counter())[reason] += count
            if example is not None:
                self.examples.setdefault(reason, example)

    def none_of(self, kind: str) -> str | None:
        """Why no case of ``kind`` was drafted though some were planned (None: some were)."""
        planned = self.planned_by_kind.get(kind, 0)
        if not planned or self.by_kind[kind]:
            return None
        reasons = self.dropped_by_kind.get(kind, Counter())
        why = "; ".join(f"{count} {REASONS[reason]}" for reason, count in reasons.most_common())
        return f"no {KIND_WORDS[kind]} case of the {planned} planned: {why or 'none was asked'}"

    def to_json(self) -> dict[str, Any]:
        return {
            "chunks": self.chunks,
            "planned": self.planned,
            "written": self.written,
            "by_kind": dict(self.by_kind),
            "dropped": dict(self.dropped),
            "dropped_by_kind": {kind: dict(reasons) for kind, reasons in self.dropped_by_kind.items() if reasons},
            "rejected_facts": dict(self.examples),
            "chunks_with_cases": self.chunks_with_cases,
            "model_calls": self.usage.chat_calls,
            "prompt_tokens": self.usage.prompt_tokens,
            "completion_tokens": self.usage.completion_tokens,
            "cache_hits": self.cache_hits,
        }

    def lines(self) -> list[str]:
        out = [
            f"drafted {self.written} case(s) from {self.chunks_with_cases} of {self.chunks} chunk(s) "
            f"({', '.join(f'{k} {self.by_kind[k]}' for k in KINDS)}); {self.planned} planned",
        ]
        for reason, count in sorted(self.dropped.items()):
            example = self.examples.get(reason)
            out.append(f"  {count} not kept: {REASONS[reason]}" + (f" (the first: {example!r})" if example else ""))
        out.extend(f"  {line}" for kind in KINDS if (line := self.none_of(kind)) is not None)
        out.append(
            f"model calls {self.usage.chat_calls} (cache hits {self.cache_hits}), tokens "
            f"{self.usage.prompt_tokens} prompt + {self.usage.completion_tokens} completion"
        )
        return out


@dataclass
class Drafted:
    cases: list[dict[str, Any]]
    summary: Summary


@functools.cache
def prompt_text(language: str, name: str) -> str:
    """A prompt file's text, read once per process (every call of a pass uses it)."""
    return files("ragexp.draft").joinpath("prompts", language, f"{name}.txt").read_text(encoding="utf-8")


@functools.cache
def retry_text(language: str) -> str:
    return files("ragexp.draft").joinpath("prompts", f"retry_facts_{language}.txt").read_text(encoding="utf-8")


def prompt_hash(language: str) -> str:
    """sha256 over the prompt files of one language: what the cases and the cache key record."""
    digest = hashlib.sha256()
    for name in (*KINDS, "retry_facts"):
        text = retry_text(language) if name == "retry_facts" else prompt_text(language, name)
        digest.update(name.encode() + b"\0" + text.encode("utf-8") + b"\0")
    return digest.hexdigest()


def render(template: str, chunks: list[Chunk]) -> str:
    """The prompt: ``template`` with each chunk in a ``<chunk id="...">`` block; ids and texts
    escaped (:func:`ragexp.escape.prompt_block`), so a document cannot forge a block."""
    block = "\n\n".join(
        f'<chunk id="{prompt_attribute(chunk.id)}">\n{prompt_block(chunk.text, "chunk")}\n</chunk>' for chunk in chunks
    )
    return template.replace("{{chunks}}", block)


def picks(total: int, options: Options) -> dict[str, list[int]]:
    """Corpus positions per kind of case, spread over the corpus (seeded; see ``stratified``).
    A two-chunk case's position is its seed chunk; its partner comes from :func:`pairs`."""
    counts = options.counts()
    rng = random.Random(options.seed)
    return {kind: stratified(total, counts[kind], rng) for kind in KINDS}


def pairs(retriever: Retriever, seeds: list[int]) -> tuple[list[Task], int]:
    """Two-chunk tasks: each seed with its most related chunk; and how many seeds had none."""
    tasks = []
    for seed in seeds:
        partner = retriever.related(seed)
        if partner is not None:
            tasks.append(Task("multi", (seed, partner)))
    return tasks, len(seeds) - len(tasks)


class Drafter:
    """One drafting pass over a corpus with one judge configuration."""

    def __init__(self, config: JudgeConfig, cache_path: Path | None) -> None:
        self.config = config
        self.cache = DraftCache(cache_path if config.cache else None)
        self.language = config.language
        self.hash = prompt_hash(self.language)
        self.identity = f"{config.kind}:{config.model}|draft|language={self.language}|prompts={self.hash[:12]}"
        self.api_key: str | None = None
        self.verify = ssl_context("provider.judge", None)
        self._failures_in_a_row = 0
        self._turn = asyncio.Semaphore(config.concurrency)
        self.stopped: str | None = None
        """Why drafting stopped asking (``abort_after`` transport failures in a row), if it did."""

    def preflight(self) -> None:
        """Secrets, TLS and reachability, before any call."""
        cfg = self.config
        if not cfg.base_url:
            raise ProviderError("provider.judge.base_url: required to draft (choose judge=openai or judge=mindie)")
        secrets.register_url(cfg.base_url)
        if cfg.api_key_env is not None:
            self.api_key = secrets.from_env(cfg.api_key_env, "provider.judge.api_key_env")
        if cfg.ca_file and not Path(cfg.ca_file).is_file():
            raise ProviderError(f"provider.judge.ca_file: no such file: {cfg.ca_file}")
        self.verify = ssl_context("provider.judge", cfg.ca_file)
        check_reachable("provider.judge.base_url", cfg.base_url, cfg.timeout_s, self.verify)

    def draft(self, chunks: list[Chunk], options: Options) -> Drafted:
        planned = picks(len(chunks), options)
        try:
            return asyncio.run(self._draft(chunks, planned, sum(map(len, planned.values()))))
        finally:
            self.cache.close()

    async def _draft(self, chunks: list[Chunk], planned: dict[str, list[int]], total: int) -> Drafted:
        from ragexp.metrics.judge.client import JudgeHTTP, JudgeLLM

        summary = Summary(chunks=len(chunks), planned=total)
        summary.planned_by_kind = {kind: len(positions) for kind, positions in planned.items()}
        self._turn = asyncio.Semaphore(self.config.concurrency)
        # The BM25 index (pairs and the unanswerable check need it) is built on the loop, a slice
        # at a time, while the single-chunk questions, which do not need it, are being asked.
        retriever = asyncio.ensure_future(Retriever.build([chunk.text for chunk in chunks]))
        async with JudgeHTTP(self.config, self.api_key, self.verify) as http:
            llm = JudgeLLM(http, self.config, JSON_MODE[self.config.kind])

            def start(task: Task) -> asyncio.Task[dict[str, Any] | None]:
                return asyncio.ensure_future(self._one(llm, chunks, retriever, task, summary))

            tasks = [Task("single", (i,)) for i in planned["single"]]
            running = [start(task) for task in tasks]
            multi, lonely = pairs(await retriever, planned["multi"])
            summary.drop("multi", "no_related_chunk", count=lonely)
            tasks += multi + [Task("unanswerable", (i,)) for i in planned["unanswerable"]]
            running += [start(task) for task in tasks[len(running) :]]
            results = await asyncio.gather(*running)
            summary.usage = http.usage
        summary.cache_hits = self.cache.hits
        kept = [(task, case) for task, case in zip(tasks, results, strict=True) if case is not None]
        duplicates = near_duplicates([case["question"] for _, case in kept])
        for position in duplicates:
            summary.drop(kept[position][0].kind, "near_duplicate")
        cases = [case for position, (_, case) in enumerate(kept) if position not in duplicates]
        summary.written = len(cases)
        summary.by_kind = Counter(case["draft"]["kind"] for case in cases)
        summary.chunks_with_cases = len({source for case in cases for source in case["draft"]["source_ids"]})
        for key in list(summary.dropped):
            if not summary.dropped[key]:
                del summary.dropped[key]
        return Drafted(cases, summary)

    async def _ask(self, llm: Any, kind: str, prompt: str, model: type[BaseModel]) -> dict[str, Any]:
        key = cache_key(f"draft.{kind}", self.identity, {"prompt": prompt}, 0)
        cached = self.cache.get(key)
        if cached is not None:
            return cached
        async with self._turn:
            # Checked once this call's turn comes: the calls queued behind the ones that failed
            # are not made once the model stopped answering.
            if self.stopped is not None:
                raise NotAsked
            reply: dict[str, Any] = (await llm.agenerate(prompt, model)).model_dump()
        self._failures_in_a_row = 0
        self.cache.put(key, reply)
        return reply

    async def _one(
        self, llm: Any, chunks: list[Chunk], retriever: asyncio.Future[Retriever], task: Task, summary: Summary
    ) -> dict[str, Any] | None:
        from ragexp.metrics.judge.client import JudgeCallError, JudgeUnreachable

        sources = [chunks[i] for i in task.sources]
        prompt = render(prompt_text(self.language, task.kind), sources)
        try:
            if task.kind == "unanswerable":
                return await self._unanswerable(llm, prompt, sources, await retriever, chunks, summary)
            return await self._answerable(llm, task.kind, prompt, sources, summary)
        except NotAsked:
            reason = "call_failed"
        except JudgeUnreachable as exc:
            reason = "call_failed"
            summary.first_failure = summary.first_failure or str(exc)
            self._failures_in_a_row += 1
            if self._failures_in_a_row >= self.config.abort_after and self.stopped is None:
                self.stopped = f"stopped asking after {self._failures_in_a_row} calls in a row failed"
        except JudgeCallError as exc:
            unusable = "output unusable" in str(exc)
            reason = "unusable_reply" if unusable else "call_failed"
            if not unusable:
                summary.first_failure = summary.first_failure or str(exc)
        summary.drop(task.kind, reason)
        return None

    async def _answerable(
        self, llm: Any, kind: str, prompt: str, sources: list[Chunk], summary: Summary
    ) -> dict[str, Any] | None:
        texts = [chunk.text for chunk in sources]
        reason, example = "", None
        for attempt in range(2):
            reply = await self._ask(llm, kind, prompt, DraftCase)
            facts = [fact.strip() for fact in reply["expected_facts"] if fact.strip()]
            missing = missing_facts(facts, texts) if facts else ["(no fact given)"]
            if missing:
                rewritten = loosely_written(missing, texts)
                reason = "fact_not_verbatim" if rewritten else "fact_not_in_source"
                example = (rewritten or missing)[0]
            elif kind == "multi" and any(len(missing_facts(facts, [text])) == len(facts) for text in texts):
                reason, example = "no_fact_from_each_chunk", None
            else:
                return self._case(kind, sources, reply["question"], facts, reply["reference"], False)
            if attempt == 0:
                named = ", ".join(repr(fact) for fact in missing) or "(none from one of the chunks)"
                prompt = prompt + "\n\n" + retry_text(self.language).replace("{{missing}}", named)
        summary.drop(kind, reason, example)
        return None

    async def _unanswerable(
        self,
        llm: Any,
        prompt: str,
        sources: list[Chunk],
        retriever: Retriever,
        chunks: list[Chunk],
        summary: Summary,
    ) -> dict[str, Any] | None:
        reply = await self._ask(llm, "unanswerable", prompt, DraftUnanswerable)
        candidates = [text for text in reply["answer_candidates"] if text.strip()]
        retrieved = [chunks[i].text for i in retriever.search(reply["question"], RETRIEVE_K)]
        # The retriever's top chunks first, then every chunk: a candidate written anywhere in the
        # corpus means the corpus may hold the answer.
        if not candidates:
            summary.drop("unanswerable", "unusable_reply")
            return None
        if found_in(candidates, retrieved) or retriever.holds(candidates):
            summary.drop("unanswerable", "answer_in_corpus")
            return None
        return self._case(
            "unanswerable", sources, reply["question"], [], REFUSAL_REFERENCE[self.language], True, candidates
        )

    def _case(
        self,
        kind: str,
        sources: list[Chunk],
        question: str,
        facts: list[str],
        reference: str,
        unanswerable: bool,
        candidates: list[str] | None = None,
    ) -> dict[str, Any]:
        source_ids = [chunk.id for chunk in sources]
        digest = hashlib.sha256("\0".join([kind, *source_ids, question]).encode("utf-8")).hexdigest()[:12]
        draft: dict[str, Any] = {
            "source_ids": source_ids,
            "model": self.config.model,
            "prompt_hash": self.hash,
            "status": "draft",
            "kind": kind,
        }
        if candidates is not None:
            draft["answer_candidates"] = candidates
        evidence: list[dict[str, str]] = []
        for chunk in [] if unanswerable else sources:
            # Anchored to the chunk's document, not its id: the case survives re-chunking.
            item = {"doc": chunk.document, "span": anchor_span(chunk.text, facts)}
            if item not in evidence:
                evidence.append(item)
        case: dict[str, Any] = {
            "id": f"draft-{digest}",
            "question": question.strip(),
            **({"relevant": evidence} if evidence else {}),
            "expected_facts": facts,
            "reference": reference.strip() or None,
            "unanswerable": unanswerable,
            "draft": draft,
        }
        if case["reference"] is None:
            del case["reference"]
        return case
