"""A pipeline that takes a fixed time per case (a run long enough for its progress bar)."""

from __future__ import annotations

import time
from typing import Any

SECONDS = 0.04


def answer(question: str, k: int) -> dict[str, Any]:
    time.sleep(SECONDS)
    return {"ranked_ids": ["doc-1"], "contexts": ["text"], "answer": f"about {question}", "citations": [1]}
