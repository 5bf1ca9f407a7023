"""``provider=replay``: the outputs recorded in the dataset, with their recorded latency."""

from __future__ import annotations

from collections.abc import Sequence

from ragexp.datasets.loader import Dataset
from ragexp.errors import ProviderError
from ragexp.providers.base import OnResult, Provider
from ragexp.records import Case, CaseResult


class ReplayProvider(Provider):
    def output_fields(self, dataset: Dataset) -> frozenset[str]:
        return dataset.output_fields

    def check(self, dataset: Dataset) -> None:
        for case in dataset.cases:
            if case.recorded is None:
                raise ProviderError(
                    f"{dataset.path}:{case.line}: provider replay needs a recorded output "
                    f"(response, retrieved_ids, ...) and case '{case.id}' has none"
                )

    def run(self, cases: Sequence[Case], on_result: OnResult) -> None:
        for index, case in enumerate(cases):
            on_result(index, CaseResult(case.id, case.recorded))
