"""A LangChain retrieval chain with ``create_retrieval_chain``'s exact output shape:
``{"input", "context": [Document], "answer"}``, built from langchain_core alone (the chain
helper lives in langchain-classic, which is not installed)."""

from __future__ import annotations

import threading
from typing import Any

from langchain_core.callbacks import CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import RunnableLambda, RunnablePassthrough

from tests.pipelines.corpus import DOCS, retrieve


class CorpusRetriever(BaseRetriever):
    """An in-memory retriever returning Documents with their ids, as vector stores do."""

    k: int = 2

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
        return [
            Document(page_content=DOCS[doc_id], id=doc_id, metadata={"source": "faq"})
            for doc_id in retrieve(query, self.k)
        ]


def _stuff(inputs: dict[str, Any]) -> str:
    """The combine-documents step: answers with the first document's text."""
    return inputs["context"][0].page_content


# create_retrieval_chain(retriever, combine_docs_chain), step for step:
chain = (
    RunnablePassthrough.assign(
        context=(RunnableLambda(lambda x: x["input"]) | CorpusRetriever()).with_config(run_name="retrieve_documents")
    )
    .assign(answer=RunnableLambda(_stuff))
    .with_config(run_name="retrieval_chain")
)


def _stuck_on_passwords(inputs: dict[str, Any]) -> str:
    if "passwords" in inputs["input"]:
        threading.Event().wait()  # a sync step that never returns, run by ainvoke in an executor thread
    return _stuff(inputs)


hanging = RunnablePassthrough.assign(context=RunnableLambda(lambda x: x["input"]) | CorpusRetriever()).assign(
    answer=RunnableLambda(_stuck_on_passwords)
)
