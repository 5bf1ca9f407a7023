"""``provider=sample``: the bundled sample RAG system (:mod:`ragexp.sample`), run in-process.

No server to start: the retriever, reranker and answerer that ``experiments/kb_zh/service.py``
serves over HTTP answer each case here directly, with the knobs of ``provider.system.sample``.
Deterministic; latency is measured around each call and the system's stage timings are kept.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from time import perf_counter
from typing import Any

from ragexp.config.models import SampleConfig, SampleSystemConfig
from ragexp.datasets.loader import Dataset, resolve_path
from ragexp.errors import ProviderError
from ragexp.metrics.registry import RETRIEVALS
from ragexp.paths import data_roots
from ragexp.providers.base import OnResult, Provider, Retrieval
from ragexp.records import Case, CaseResult, HopRetrieval, SystemOutput
from ragexp.sample import DocsError, SampleSystem, Settings, load_docs


def unmatchable_gold(path: str) -> str:
    """Why window chunks cannot be scored on chunk-id gold, and the two ways out."""
    return (
        f"provider.system.sample.chunking=window returns windows ('<doc>#<n>'), which can never equal a "
        f"relevant id of {path} (gold as chunk ids): every retrieval metric would score 0 whatever was "
        "retrieved. Score windows on evidence gold (text spans of documents, which survive re-chunking): "
        "dataset=kb_zh_spans, or turn this dataset's gold into evidence with "
        "`ragexp validate --corpus CHUNKS --anchor --out FILE` (docs/datasets.md)"
    )


class SampleProvider(Provider):
    config: SampleSystemConfig

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.knobs = self.config.sample or SampleConfig.model_validate({})
        self._system: SampleSystem | None = None
        self._docs_sha256: str | None = None

    def output_fields(self, dataset: Dataset) -> frozenset[str]:
        # The two-step mode reports each of its searches as a hop.
        fields = super().output_fields(dataset)
        return fields | {RETRIEVALS} if self.knobs.hops > 1 else fields

    def check(self, dataset: Dataset) -> None:
        path = resolve_path(self.knobs.docs, data_roots())
        try:
            docs = load_docs(path)
            self._docs_sha256 = hashlib.sha256(path.read_bytes()).hexdigest()
        except DocsError as exc:
            raise ProviderError(f"provider.system.sample.docs: {exc}") from None
        knobs = self.knobs
        settings = Settings(
            knobs.top_k,
            knobs.rerank,
            knobs.citations,
            knobs.chunking,
            knobs.threshold,
            knobs.chunk_chars,
            knobs.overlap,
            knobs.hops,
        )
        self._system = SampleSystem(docs, settings)
        labelled = {doc_id for case in dataset.cases for doc_id in case.relevant_ids}
        labelled.update(item.doc for case in dataset.cases for item in case.relevant)
        if labelled and not labelled & self._system.doc_ids:
            what = "documents its evidence names" if dataset.has_evidence else "relevant ids"
            # Retrieving from another dataset's documents would score every case 0, silently.
            raise ProviderError(
                f"provider.system.sample.docs: none of the {len(labelled)} {what} of {dataset.path} is a "
                f"document of {path}: point it at that dataset's documents, or evaluate another system "
                "(provider=http, provider=replay)"
            )

        if knobs.chunking == "window" and not dataset.has_evidence and labelled:
            raise ProviderError(unmatchable_gold(str(dataset.path)))

    def identity(self) -> str | None:
        return f"sample-docs:{self._docs_sha256}" if self._docs_sha256 else None

    def run(self, cases: Sequence[Case], on_result: OnResult) -> None:
        system = self._system
        if system is None:  # run() before preflight() is a programming error, not bad input
            raise RuntimeError("SampleProvider.run called before preflight")
        k = self.settings.k
        for index, case in enumerate(cases):
            started = perf_counter()
            try:
                reply = system.answer(system.in_context(case.question, case.history), k)
            except Exception as exc:  # a bug in the system under test fails its case, not the run
                on_result(index, CaseResult(case.id, None, f"sample system: {type(exc).__name__}: {exc}"))
                continue
            latency = perf_counter() - started
            output = SystemOutput(
                reply["ranked_ids"], reply["contexts"], reply["answer"], reply["citations"], latency, reply["timings"]
            )
            output.doc_ids = reply["doc_ids"]
            output.stages = reply["stages"]
            if "retrievals" in reply:
                output.retrievals = [
                    HopRetrieval(step["query"], step["ranked_ids"], step["contexts"], step["doc_ids"])
                    for step in reply["retrievals"]
                ]
            on_result(index, CaseResult(case.id, output))

    def generation_missing(self) -> str | None:
        return None

    def retrieval(self, case: Case, output: SystemOutput) -> Retrieval:
        # Recomputed (deterministic): a refusal empties the recorded contexts, and the answer
        # stage reads the retrieval score too.
        found = self._built().retrieve(case.question, self.settings.k)
        return Retrieval(tuple(found["ranked_ids"]), tuple(found["contexts"]), tuple(found["doc_ids"]), found["score"])

    def generate(self, cases: Sequence[Case], retrievals: Sequence[Retrieval], on_result: OnResult) -> None:
        system = self._built()
        for index, (case, given) in enumerate(zip(cases, retrievals, strict=True)):
            started = perf_counter()
            found = {
                "ranked_ids": list(given.ranked_ids),
                "contexts": list(given.contexts),
                "doc_ids": list(given.doc_ids),
                "score": given.score,
            }
            try:
                reply = system.generate(case.question, found)
            except Exception as exc:  # a bug in the system under test fails its case, not the run
                on_result(index, CaseResult(case.id, None, f"sample system: {type(exc).__name__}: {exc}"))
                continue
            output = SystemOutput(
                reply["ranked_ids"],
                reply["contexts"],
                reply["answer"],
                reply["citations"],
                perf_counter() - started,
                reply["timings"],
            )
            output.doc_ids = reply["doc_ids"]
            on_result(index, CaseResult(case.id, output))

    def _built(self) -> SampleSystem:
        if self._system is None:  # a programming error, not bad input
            raise RuntimeError("SampleProvider used before check")
        return self._system
