"""A four-document corpus and a word-overlap retriever shared by the stand-in pipelines."""

from __future__ import annotations

import re

DOCS = {
    "d1": "Refunds arrive within 3 business days.",
    "d2": "Overseas shipping takes 5 days.",
    "d3": "Passwords are reset from the account page.",
    "d4": "Support is open from 9 to 5 on weekdays.",
}

CASES = [
    {
        "id": "refund",
        "question": "when do refunds arrive",
        "relevant_ids": ["d1"],
        "expected_facts": ["3 business days"],
    },
    {
        "id": "password",
        "question": "how are passwords reset",
        "relevant_ids": ["d3"],
        "expected_facts": ["account page"],
    },
    {
        "id": "shipping",
        "question": "how long is overseas shipping",
        "relevant_ids": ["d2"],
        "expected_facts": ["5 days"],
    },
]
"""Cases whose relevant document the retriever ranks first (the answer is its text)."""


def words(text: str) -> set[str]:
    return set(re.findall(r"[a-z0-9]+", text.lower()))


def retrieve(question: str, k: int = 2) -> list[str]:
    """Ids of the ``k`` documents sharing most words with the question, best first (ties by id)."""
    asked = words(question)
    scored = sorted(DOCS, key=lambda doc_id: (-len(asked & words(DOCS[doc_id])), doc_id))
    return scored[:k]
