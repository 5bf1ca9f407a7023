"""A chat pipeline that reads a follow-up in the light of the conversation's earlier questions,
and the same pipeline that ignores them (what a system without memory does)."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter
from typing import Any

DOCS = {
    "return-policy": "七天无理由退货：签收后七天内可申请退货。",
    "return-fee": "退货运费由买家承担，质量问题由商家承担。",
    "shipping-fee": "运费：订单满 99 元包邮，不满 99 元收取 8 元运费。",
    "invoice-types": "开发票可选电子普通发票或增值税专用发票。",
    "invoice-time": "电子发票即时收到，专用发票 5 个工作日内可收到。",
    "arrival": "包裹发货后一般 2-3 天可收到，偏远地区 5 天可收到。",
}

HISTORIES: dict[str, list[dict[str, str]]] = {}
"""Case id -> the history the last call received."""
FAIL: set[str] = set()
"""Case ids whose call raises (a turn that fails)."""
INTERRUPT: set[str] = set()
"""Case ids whose next call interrupts the run (Ctrl-C) while it is in flight, once."""
CALLS: Counter[str] = Counter()
"""Case id -> how many times it was asked."""
_LOCK = threading.Lock()


def _bigrams(text: str) -> set[str]:
    return {text[i : i + 2] for i in range(len(text) - 1) if text[i].strip() and text[i + 1].strip()}


def _retrieve(query: str, k: int) -> list[str]:
    """Documents by how many of the query's bigrams they hold, then how often."""
    wanted = _bigrams(query)

    def rank(doc: str) -> tuple[int, int, str]:
        text = DOCS[doc]
        return -len(wanted & _bigrams(text)), -sum(text.count(gram) for gram in wanted), doc

    return sorted(DOCS, key=rank)[:k]


def _reply(query: str, k: int) -> dict[str, Any]:
    ranked = _retrieve(query, k)
    return {"ranked_ids": ranked, "contexts": [DOCS[d] for d in ranked], "answer": DOCS[ranked[0]]}


def remembers(question: str, k: int, case_id: str, history: list[dict[str, str]]) -> dict[str, Any]:
    """Searches for the question after the user's earlier questions."""
    with _LOCK:
        HISTORIES[case_id] = history
        CALLS[case_id] += 1
        interrupt = case_id in INTERRUPT
        INTERRUPT.discard(case_id)
    if interrupt:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(2)
    if case_id in FAIL:
        raise RuntimeError(f"model overloaded on {case_id}")
    earlier = " ".join(m["content"] for m in history if m["role"] == "user")
    return _reply(f"{earlier} {question}", k)


def forgets(question: str, k: int) -> dict[str, Any]:
    """Searches for the question alone."""
    return _reply(question, k)
