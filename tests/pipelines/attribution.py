"""A pipeline pair for ``diff --attribute`` with a known decomposition, over the shared corpus.

The candidate changes retrieval for two cases (``refund``: a wrong document first, the right one
second; ``password``: the right one gone) and its generator answers from the context that shares
most words with the question, except that it does not know about shipping. So, in answer accuracy:
``refund`` moves by 0 = retrieval -1 + interaction +1, ``password`` by -1 from retrieval,
``shipping`` by -1 from generation; the means are total -2/3, retrieval -2/3, generation -1/3,
interaction +1/3. Each system exposes its answer stage (``generate_*``) beside its target; the
``*_counted`` ones count their calls and can interrupt the command after a number of them.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from tests.pipelines.corpus import DOCS, retrieve, words


def retrieve_candidate(question: str, k: int) -> list[str]:
    if "refunds" in question:
        return ["d4", "d1"]
    if "passwords" in question:
        return ["d2", "d4"]
    return retrieve(question, k)


def generate_baseline(question: str, contexts: list[str]) -> dict[str, Any]:
    return {"answer": contexts[0] if contexts else "no context", "citations": [1]}


def generate_candidate(question: str, contexts: list[str]) -> dict[str, Any]:
    if "shipping" in question:
        return {"answer": "unknown", "citations": []}
    asked = words(question)
    best = max(range(len(contexts)), key=lambda i: len(asked & words(contexts[i])))
    return {"answer": contexts[best], "citations": [best + 1]}


def _reply(ids: list[str], generated: dict[str, Any]) -> dict[str, Any]:
    return {"ranked_ids": ids, "contexts": [DOCS[d] for d in ids], **generated}


def baseline(question: str, k: int) -> dict[str, Any]:
    ids = retrieve(question, k)
    return _reply(ids, generate_baseline(question, [DOCS[d] for d in ids]))


def candidate(question: str, k: int) -> dict[str, Any]:
    ids = retrieve_candidate(question, k)
    return _reply(ids, generate_candidate(question, [DOCS[d] for d in ids]))


async def generate_candidate_async(question: str, contexts: list[str]) -> dict[str, Any]:
    return generate_candidate(question, contexts)


def generate_candidate_failing(question: str, contexts: list[str]) -> dict[str, Any]:
    """The candidate's answer stage, failing on the password case."""
    if "passwords" in question:
        raise RuntimeError("the model is down")
    return generate_candidate(question, contexts)


def generate_candidate_down(question: str, contexts: list[str]) -> dict[str, Any]:
    """The candidate's answer stage, failing on every case."""
    raise RuntimeError(f"the model is down ({len(contexts)} contexts)")


CALLS: Counter[tuple[str, str]] = Counter()
"""(generator, question) -> how many times a replay asked it (the ``*_counted`` answer stages)."""
INTERRUPT_AFTER: dict[str, int] = {}
"""Generator -> how many calls it answers before its next call interrupts the command (Ctrl-C), once."""
STOPPED_AT: list[str] = []
"""The questions whose call interrupted the command (still in flight when it stopped)."""
_LOCK = threading.Lock()
HANG_AFTER_ENV = "RAGEXP_TEST_ATTRIBUTION_HANG_AFTER"
HANG_FILE_ENV = "RAGEXP_TEST_ATTRIBUTION_HANG_FILE"
"""In a process of its own: the candidate's answer stage hangs after this many calls, once it has
written the question it hangs on to this file (the test then stops the process)."""


def _counted(name: str, question: str, contexts: list[str], answer: Any) -> dict[str, Any]:
    with _LOCK:
        CALLS[(name, question)] += 1
        asked = sum(count for (generator, _), count in CALLS.items() if generator == name)
        interrupt = INTERRUPT_AFTER.get(name) == asked - 1
        if interrupt:
            del INTERRUPT_AFTER[name]
            STOPPED_AT.append(question)
    if interrupt:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(2)
    hang_after = os.environ.get(HANG_AFTER_ENV)
    if name == "candidate" and hang_after is not None and asked > int(hang_after):
        Path(os.environ[HANG_FILE_ENV]).write_text(question, encoding="utf-8")
        time.sleep(60)  # until the test stops the process
    result: dict[str, Any] = answer(question, contexts)
    return result


def generate_baseline_counted(question: str, contexts: list[str]) -> dict[str, Any]:
    return _counted("baseline", question, contexts, generate_baseline)


def generate_candidate_counted(question: str, contexts: list[str]) -> dict[str, Any]:
    return _counted("candidate", question, contexts, generate_candidate)
