"""``provider=fake``: outputs built from the labels. Proves the chain, not the semantics."""

from __future__ import annotations

from collections.abc import Sequence
from time import perf_counter

from ragexp.providers.base import OnResult, Provider
from ragexp.records import Case, CaseResult, SystemOutput


class FakeProvider(Provider):
    def run(self, cases: Sequence[Case], on_result: OnResult) -> None:
        refusal = self.settings.dataset.refusal_phrases[0] if self.settings.dataset.refusal_phrases else ""
        depth = max(self.settings.k, 1)
        # Every field is passed by position: keyword arguments and default factories double the
        # cost of building the records, which is most of what this provider does per case.
        for index, case in enumerate(cases):
            started = perf_counter()
            if case.unanswerable:
                output = SystemOutput([], [], refusal, [], None, None)
            elif case.relevant:  # evidence: each span returned as a chunk of its document
                evidence = case.relevant[:depth]
                output = SystemOutput(
                    [f"{item.doc}#{n}" for n, item in enumerate(evidence, start=1)],
                    [item.span for item in evidence],
                    "，".join(case.expected_facts) + "。[1]",
                    [1],
                    None,
                    None,
                )
                output.doc_ids = [item.doc for item in evidence]
            else:
                ranked = case.relevant_ids[:depth]
                output = SystemOutput(
                    ranked,
                    case.expected_facts[:] or [case.reference or case.question],
                    "，".join(case.expected_facts) + "。[1]",
                    [1] if ranked else [],
                    None,
                    None,
                )
            output.latency_seconds = perf_counter() - started
            on_result(index, CaseResult(case.id, output, None, {}, False))
