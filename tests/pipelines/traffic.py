"""Production traffic written by real ``mlflow.langchain.autolog()`` around a LangChain chain
(langchain_core alone) with a deterministic chat model, and a candidate system answering the
same questions, with a regression planted in one stratum.

Each question is about one topic (the stratum, set as the trace tag ``route``). Production's model
answers from the retrieved document, except for about one question in five (by a hash of the
question) where it answers off the documents; the candidate answers as production does, but in
the planted topic it answers off the documents for about one question in two more.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
from collections.abc import Iterator
from typing import Any

from langchain_core.callbacks import CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.language_models import SimpleChatModel
from langchain_core.messages import BaseMessage
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import RunnableConfig, RunnableLambda

from ragexp.records import Case, SystemOutput

TOPICS = [f"topic{j}" for j in range(10)]
OFF = "Our team will get back to you about that soon."
"""An answer that uses nothing retrieved."""
PLANTED = "topic3"
"""The topic where the candidate answers off the documents more often."""


def doc(topic: str) -> str:
    number = TOPICS.index(topic) + 2 if topic in TOPICS else 9
    return f"Requests about {topic} are handled within {number} days by the {topic} desk."


def topic_of(text: str) -> str:
    found = re.search(r"topic\d+", text)
    return found.group(0) if found else "topic0"


def bucket(text: str, salt: str = "") -> int:
    return int(hashlib.sha256((salt + text).encode()).hexdigest(), 16) % 100


def production_answer(question: str, context: str) -> str:
    return OFF if bucket(question) < 20 else f"{context.split(' by ')[0]}."


def candidate_answer(question: str, context: str) -> str:
    if topic_of(question) == PLANTED and bucket(question, "candidate") < 50:
        return OFF
    return production_answer(question, context)


class TopicRetriever(BaseRetriever):
    """Returns the document of the question's topic."""

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
        topic = topic_of(query)
        return [Document(page_content=doc(topic), id=f"doc-{topic}", metadata={"source": "policies"})]


class DeterministicModel(SimpleChatModel):
    """Answers the last human message from the system message's context."""

    def _call(
        self, messages: list[BaseMessage], stop: list[str] | None = None, run_manager: Any = None, **kw: Any
    ) -> str:
        context = str(messages[0].content).removeprefix("Context: ")
        return production_answer(str(messages[-1].content), context)

    @property
    def _llm_type(self) -> str:
        return "deterministic"


def _route(inputs: dict[str, Any]) -> str:
    """Tags the trace as production code does (route, session); passes the question on."""
    import mlflow

    metadata = {"mlflow.trace.session": inputs["session"]} if inputs.get("session") else {}
    tags = {"route": inputs["route"]} if inputs.get("route") else {}
    mlflow.update_current_trace(tags=tags, metadata=metadata)
    return str(inputs["question"])


def _context(documents: list[Document]) -> str:
    return " ".join(document.page_content for document in documents)


def _retrieve(question: str, config: RunnableConfig) -> dict[str, str]:
    # One branch after the other: MLflow's autologging session is shared by the threads of a
    # RunnableParallel's branches, and a branch ending can clear it under another (AttributeError
    # in autologging's safe_patch, seen about once in two thousand calls).
    return {"context": _context(TopicRetriever().invoke(question, config)), "question": question}


PROMPT = ChatPromptTemplate.from_messages([("system", "Context: {context}"), ("human", "{question}")])
chain = RunnableLambda(_route) | RunnableLambda(_retrieve) | PROMPT | DeterministicModel() | StrOutputParser()


def question(index: int, topic: str) -> str:
    return f"Question {index}: how long do requests about {topic} take?"


@contextlib.contextmanager
def _synchronous() -> Iterator[None]:
    # MLflow exports traces on a background queue that drops traces when it is full (about a
    # quarter of 2,000 quick calls): written one by one, every call is a trace.
    previous = os.environ.get(ASYNC)
    os.environ[ASYNC] = "false"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(ASYNC, None)
        else:
            os.environ[ASYNC] = previous


ASYNC = "MLFLOW_ENABLE_ASYNC_TRACE_LOGGING"


def write_production(uri: str, experiment: str, per_topic: int, topics: list[str] | None = None) -> None:
    """``per_topic`` questions for each topic through the autologged chain into ``experiment``."""
    with _synchronous():
        _write_production(uri, experiment, per_topic, topics)


def _write_production(uri: str, experiment: str, per_topic: int, topics: list[str] | None) -> None:
    import mlflow

    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment(experiment)
    mlflow.langchain.autolog()
    try:
        for index in range(per_topic):
            for topic in topics or TOPICS:
                chain.invoke({"question": question(index, topic), "route": topic})
        mlflow.flush_trace_async_logging()
    finally:
        mlflow.langchain.autolog(disable=True)


def write_sessions(uri: str, experiment: str, sessions: dict[str, list[str]]) -> None:
    """Conversations: each session's questions asked in order, traced with its session id."""
    with _synchronous():
        _write_sessions(uri, experiment, sessions)


def _write_sessions(uri: str, experiment: str, sessions: dict[str, list[str]]) -> None:
    import mlflow

    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment(experiment)
    mlflow.langchain.autolog()
    try:
        for session, questions in sessions.items():
            for text in questions:
                chain.invoke({"question": text, "route": topic_of(text), "session": session})
        mlflow.flush_trace_async_logging()
    finally:
        mlflow.langchain.autolog(disable=True)


ASKED: dict[str, list[dict[str, str]]] = {}
"""Question -> the history the candidate was given with it."""


def candidate(question: str, history: list[dict[str, str]]) -> dict[str, Any]:
    """The candidate system: the same retrieval, its own answers."""
    ASKED[question] = list(history)
    topic = topic_of(question)
    context = doc(topic)
    return {"ranked_ids": [f"doc-{topic}"], "contexts": [context], "answer": candidate_answer(question, context)}


def grounded(case: Case, output: SystemOutput) -> float:
    """A metric that needs no gold: the share of the answer's words found in what was retrieved."""
    words = re.findall(r"[a-z0-9]+", output.answer.lower())
    seen = set(re.findall(r"[a-z0-9]+", " ".join(output.contexts).lower()))
    return sum(word in seen for word in words) / len(words) if words else 0.0
