"""Production traffic written by real ``mlflow.llama_index.autolog()`` around a LlamaIndex query
engine (llama-index-core alone): a retriever returning the question's topic document and a
deterministic LLM answering from it as :func:`tests.pipelines.traffic.production_answer` does.
The retriever tags the trace with the question's topic (``route``), as production code would."""

from __future__ import annotations

import re
from typing import Any

from llama_index.core.base.llms.types import CompletionResponse, CompletionResponseGen, LLMMetadata
from llama_index.core.llms.callbacks import llm_completion_callback
from llama_index.core.llms.custom import CustomLLM
from llama_index.core.query_engine import RetrieverQueryEngine
from llama_index.core.retrievers import BaseRetriever
from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode

from tests.pipelines.traffic import _synchronous, doc, production_answer, topic_of


class TopicRetriever(BaseRetriever):
    """The document of the question's topic; tags the trace with the topic."""

    def _retrieve(self, query_bundle: QueryBundle) -> list[NodeWithScore]:
        import mlflow

        topic = topic_of(query_bundle.query_str)
        mlflow.update_current_trace(tags={"route": topic})
        return [NodeWithScore(node=TextNode(id_=f"doc-{topic}", text=doc(topic)), score=1.0)]


class DeterministicLLM(CustomLLM):
    """Answers the prompt's query from its context, the same answer for the same question."""

    @property
    def metadata(self) -> LLMMetadata:
        return LLMMetadata(model_name="deterministic")

    @llm_completion_callback()
    def complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponse:
        query = re.search(r"Query: (.*)\n", prompt)
        question = query.group(1) if query else prompt
        return CompletionResponse(text=production_answer(question, doc(topic_of(question))))

    @llm_completion_callback()
    def stream_complete(self, prompt: str, formatted: bool = False, **kwargs: Any) -> CompletionResponseGen:
        yield self.complete(prompt, formatted, **kwargs)


def engine() -> RetrieverQueryEngine:
    return RetrieverQueryEngine.from_args(TopicRetriever(), llm=DeterministicLLM())


def write_production(uri: str, experiment: str, questions: list[str]) -> None:
    """Each question asked through the autologged query engine into ``experiment``."""
    import mlflow

    with _synchronous():
        mlflow.set_tracking_uri(uri)
        mlflow.set_experiment(experiment)
        mlflow.llama_index.autolog()
        try:
            query_engine = engine()
            for text in questions:
                query_engine.query(text)
            mlflow.flush_trace_async_logging()
        finally:
            mlflow.llama_index.autolog(disable=True)
