"""A rubric of the team's own (``metrics.custom`` of ``kind: judge``), scored by the configured
judge case by case.

The judge scorer treats a rubric as one more judge metric: the same client (retries, the bound
on calls in flight, token counts), cache, repeats and spread. What differs is the prompt, which
is ragexp's own: the rubric in the team's words, the scale, the fields the metric needs, and a
reply of ``{"score", "rationale"}`` (its schema in the system message, as for every judge call).
The instructions are written in the judge's ``language``; the rubric stays as the team wrote it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, Field, StrictFloat

from ragexp.metrics.registry import MetricSpec

SHOWN = {"user_input": "question", "response": "answer", "retrieved_contexts": "contexts", "reference": "reference"}
"""The judge's input fields (ragas' names) -> how the prompt names them."""

INSTRUCTIONS = {
    "english": (
        "You grade one answer of a question-answering system against a rubric written by the team that "
        "built it. Apply the rubric exactly as written, to the fields given below and nothing else.\n"
        "Rubric:\n{rubric}\n\n{scale}\n"
        "Give the score and a one-sentence rationale that names what decided it."
    ),
    "chinese": (
        "你要按照开发团队写下的评分标准，为问答系统的一条回答打分。严格按照标准的原文，"
        "只依据下面给出的字段评判。\n评分标准：\n{rubric}\n\n{scale}\n"
        "给出分数，并用一句话说明理由，指出决定分数的内容。"
    ),
}
SCALES = {
    "english": ("Score 1 if the answer meets the rubric, 0 if it does not.", "Score an integer from {low} to {high}."),
    "chinese": ("符合标准记 1 分，不符合记 0 分。", "给出 {low} 到 {high} 之间的整数分。"),
}


class RubricVerdict(BaseModel):
    """The judge's reply to a rubric."""

    score: StrictFloat = Field(description="The score on the rubric's scale.")
    """Strict: ``true`` or ``"1"`` is a reply that does not match, an error, never a grade."""
    rationale: str = Field(description="One sentence: what decided the score.")


@dataclass(frozen=True)
class RubricResult:
    value: float
    """The score mapped onto the metric's range."""
    reason: str
    """The judge's rationale."""


class RubricScoreError(Exception):
    """The judge answered with a score the rubric's scale does not have."""


class RubricMetric:
    """What the judge scorer calls for a rubric metric, like a ragas metric's ``ascore``."""

    def __init__(self, llm: Any, spec: MetricSpec, language: str) -> None:
        custom = spec.custom
        if custom is None or custom.rubric is None:
            raise ValueError(f"{spec.name} is not a rubric metric")
        self.llm = llm
        self.spec = spec
        self.scale = custom.scale
        said = SCALES.get(language, SCALES["english"])
        scale = said[0] if self.scale is None else said[1].format(low=self.scale[0], high=self.scale[1])
        self.instruction = INSTRUCTIONS.get(language, INSTRUCTIONS["english"]).format(rubric=custom.rubric, scale=scale)

    def prompt(self, inputs: dict[str, Any]) -> str:
        shown = {SHOWN.get(name, name): value for name, value in inputs.items()}
        low, high = self.scale if self.scale is not None else (0, 1)
        given = {"rubric": self.spec.custom.rubric if self.spec.custom else "", "scale": [low, high], **shown}
        return f"{self.instruction}\n\ninput: {json.dumps(given, ensure_ascii=False)}"

    async def ascore(self, **inputs: Any) -> RubricResult:
        verdict: RubricVerdict = await self.llm.agenerate(self.prompt(inputs), RubricVerdict)
        return RubricResult(self.to_range(verdict.score), verdict.rationale.strip())

    def to_range(self, score: float) -> float:
        """The judge's score on the rubric's scale, mapped linearly onto the metric's range."""
        low, high = self.scale if self.scale is not None else (0, 1)
        if not math.isfinite(score) or not low <= score <= high or (self.scale is None and score not in (0, 1)):
            allowed = "0 or 1" if self.scale is None else f"a score from {low} to {high}"
            raise RubricScoreError(f"the judge gave {score:g}, not {allowed} (the rubric's scale)")
        top = self.spec.high if self.spec.high is not None else 1.0
        return self.spec.low + (score - low) / (high - low) * (top - self.spec.low)
