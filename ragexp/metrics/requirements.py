"""What a metric needs, checked before any work: the fields of the dataset and the outputs of the
system it reads (a metric of the user's named by its key and the field as the user wrote it)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from ragexp.errors import MetricError
from ragexp.metrics.registry import MetricSpec

if TYPE_CHECKING:
    from ragexp.records import Case


def can_score(spec: MetricSpec, labels: frozenset[str], outputs: frozenset[str]) -> bool:
    """Whether ``spec`` can be computed from these label and output fields."""
    return spec.needs_labels <= labels and spec.needs_output <= outputs


def needed_outputs(specs: Iterable[MetricSpec]) -> frozenset[str]:
    """The output fields these metrics read."""
    return frozenset(field for spec in specs for field in spec.needs_output)


def check_requirements(
    specs: Iterable[MetricSpec], labels: frozenset[str], outputs: frozenset[str], *, dataset: str, provider: str
) -> None:
    """Refuse, before any work, a metric whose fields the dataset or provider cannot give."""
    for spec in specs:
        # A metric of the user's config is named by its key and the field as the user wrote it.
        who = f"{spec.custom.key}.needs: metric '{spec.name}'" if spec.custom is not None else f"metric '{spec.name}'"
        missing_labels = sorted(spec.needs_labels - labels)
        if missing_labels:
            raise MetricError(
                f"{who} needs field '{_said(spec, missing_labels[0])}', which dataset {dataset} does not "
                "give for every case"
            )
        missing_outputs = sorted(spec.needs_output - outputs)
        if missing_outputs:
            raise MetricError(
                f"{who} needs output field '{_said(spec, missing_outputs[0])}', which provider {provider} "
                f"does not give for every case of {dataset}"
            )


def _said(spec: MetricSpec, field_name: str) -> str:
    if spec.custom is None:
        return field_name
    return next((word for word, (_, name) in CUSTOM_NEEDS.items() if name == field_name), field_name)


CUSTOM_NEEDS: dict[str, tuple[bool, str]] = {
    "question": (False, "question"),
    "reference": (False, "reference"),
    "expected_facts": (False, "expected_facts"),
    "relevant_ids": (False, "relevant_ids"),
    "answer": (True, "response"),
    "contexts": (True, "retrieved_contexts"),
    "ranked_ids": (True, "retrieved_ids"),
    "citations": (True, "citations"),
    # The dataset format's names of the same fields, accepted too.
    "user_input": (False, "question"),
    "response": (True, "response"),
    "retrieved_contexts": (True, "retrieved_contexts"),
    "retrieved_ids": (True, "retrieved_ids"),
}
"""A field a custom metric may need, as ``needs`` spells it -> (an output of the system, the name
the dataset and the providers give it); the first spelling of a name is how messages say it."""


def check_evidence(
    specs: Iterable[MetricSpec], cases: Iterable[Case], outputs: frozenset[str], *, dataset: str, provider: str
) -> frozenset[str]:
    """Refuse, before any work, a retrieval metric on evidence (``relevant``) from a system that
    gives no retrieved texts: evidence is matched by text. The output fields as
    :func:`check_requirements` should then see them: where every case's gold is evidence, the
    texts stand in for ids."""
    for spec in specs:
        if (
            "relevant_ids" in spec.needs_labels
            and "retrieved_ids" in spec.needs_output
            and "retrieved_contexts" not in outputs
        ):
            raise MetricError(
                f"metric '{spec.name}' matches the evidence of dataset {dataset} (its 'relevant' field) by the "
                f"retrieved texts, which provider {provider} does not give for every case (response.contexts)"
            )
    if any(case.relevant_ids for case in cases):
        return outputs
    return outputs | {"retrieved_ids"} if "retrieved_contexts" in outputs else outputs
