"""``provider=fake``: outputs built from the labels. Proves the chain, not the semantics."""

from __future__ import annotations

from collections.abc import Sequence
from time import perf_counter

from ragexp.providers.base import OnResult, Provider
from ragexp.records import Case, CaseResult, SystemOutput


class FakeProvider(Provider):
    def run(self, cases: Sequence[Case], on_result: OnResult) -> None:
        refusal = self.settings.dataset.refusal_phrases[0] if self.settings.dataset.refusal_phrases else ""
        for index, case in enumerate(cases):
            started = perf_counter()
            if case.unanswerable:
                output = SystemOutput(answer=refusal)
            else:
                ranked = case.relevant_ids[: max(self.settings.k, 1)]
                output = SystemOutput(
                    ranked_ids=list(ranked),
                    contexts=list(case.expected_facts) or [case.reference or case.question],
                    answer="，".join(case.expected_facts) + "。[1]",
                    citations=[1] if ranked else [],
                )
            output.latency_seconds = perf_counter() - started
            on_result(index, CaseResult(case.id, output))
