"""A real LangChain agent (``langchain.agents.create_agent``) over the kb_zh_hops knowledge base,
driven by a deterministic chat model: it calls its retriever tool with the question, reads the
maker named on the product page it got back (the bridge), calls the tool again with that name,
and answers from the second result. ``RETURNED`` keeps what each tool call returned, by query,
so a test can score the hops from it directly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain.agents import create_agent
from langchain_core.callbacks import CallbackManagerForLLMRun, CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.retrievers import BaseRetriever
from langchain_core.tools import create_retriever_tool

from tests.pipelines.hops import DOCS, MAKER

TOOL = "search_kb"
K = 3
RETURNED: dict[str, list[Document]] = {}


class TitleRetriever(BaseRetriever):
    """The documents whose title the query names, then the rest in file order; top 3."""

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
        hits = [doc for doc in DOCS if doc["title"] in query]
        ranked = (hits + [doc for doc in DOCS if doc not in hits])[:K]
        found = [Document(page_content=doc["text"], id=doc["id"], metadata={"doc_id": doc["id"]}) for doc in ranked]
        RETURNED[query] = found
        return found


class TwoHopModel(BaseChatModel):
    """Calls the retriever tool with the question, then with the bridge it read, then answers."""

    @property
    def _llm_type(self) -> str:
        return "two-hop-fake"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> TwoHopModel:  # type: ignore[override]
        return self

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        question = next(str(m.content) for m in messages if isinstance(m, HumanMessage))
        results = [m for m in messages if isinstance(m, ToolMessage)]
        if not results:
            reply = AIMessage(content="", tool_calls=[{"name": TOOL, "args": {"query": question}, "id": "call-1"}])
        elif len(results) == 1:
            found = MAKER.search(str(results[0].content))
            bridge = found.group(1) if found else question
            reply = AIMessage(content="", tool_calls=[{"name": TOOL, "args": {"query": bridge}, "id": "call-2"}])
        else:
            reply = AIMessage(content=str(results[-1].content).split("\n\n")[0])
        return ChatResult(generations=[ChatGeneration(message=reply)])


search = create_retriever_tool(TitleRetriever(), TOOL, "Search the kb.", response_format="content_and_artifact")
agent = create_agent(TwoHopModel(), [search])
