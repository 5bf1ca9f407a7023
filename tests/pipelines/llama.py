"""A query engine returning LlamaIndex's shapes (llama_index is not installed): ``Response`` is a
dataclass with ``response``, ``source_nodes`` and ``metadata``; ``NodeWithScore`` a pydantic
model with ``node`` and ``score``; ``TextNode`` one with ``id_``, ``text``, ``metadata`` and
``relationships`` (keyed by the ``NodeRelationship`` enum, whose ``SOURCE`` is the node's
document, as a node parser sets it)."""

from __future__ import annotations

import dataclasses
from enum import Enum, auto
from typing import Any

from pydantic import BaseModel, Field

from tests.pipelines.corpus import DOCS, retrieve


class NodeRelationship(str, Enum):  # noqa: UP042 - LlamaIndex's own definition
    SOURCE = auto()
    PREVIOUS = auto()
    NEXT = auto()


class RelatedNodeInfo(BaseModel):
    node_id: str


class TextNode(BaseModel):
    id_: str
    text: str = ""
    metadata: dict[str, Any] = Field(default_factory=dict)
    relationships: dict[NodeRelationship, RelatedNodeInfo] = Field(default_factory=dict)

    @property
    def node_id(self) -> str:
        return self.id_


class NodeWithScore(BaseModel):
    node: TextNode
    score: float | None = None


@dataclasses.dataclass
class Response:
    response: str | None
    source_nodes: list[NodeWithScore] = dataclasses.field(default_factory=list)
    metadata: dict[str, Any] | None = None


class QueryEngine:
    def __init__(self, top_k: int) -> None:
        self.top_k = top_k

    def query(self, str_or_query_bundle: str) -> Response:
        ranked = retrieve(str_or_query_bundle, self.top_k)
        nodes = [
            NodeWithScore(
                node=TextNode(
                    id_=doc_id,
                    text=DOCS[doc_id],
                    metadata={"file_name": "faq.md"},
                    relationships={NodeRelationship.SOURCE: RelatedNodeInfo(node_id=f"{doc_id}.md")},
                ),
                score=1.0 / rank,
            )
            for rank, doc_id in enumerate(ranked, start=1)
        ]
        return Response(DOCS[ranked[0]], nodes, {doc_id: {} for doc_id in ranked})


engine = QueryEngine(top_k=2)
