"""Screening: a drafted case counts only once people set its ``draft.status`` to ``screened``."""

from __future__ import annotations

from ragexp.datasets.loader import Dataset
from ragexp.errors import DatasetError, DatasetErrors
from ragexp.records import Case

DRAFT_TAG = "ragexp.draft"
"""Tag of a run evaluated with ``--allow-draft`` on cases not yet screened."""


def unscreened(dataset: Dataset) -> list[Case]:
    """The cases still ``draft.status: draft``."""
    return [case for case in dataset.cases if case.draft == "draft"]


def refuse_unscreened(dataset: Dataset) -> None:
    """A DatasetErrors naming the first case still a draft, unless there is none."""
    pending = unscreened(dataset)
    if pending:
        raise DatasetErrors(
            [
                DatasetError(
                    str(dataset.path),
                    pending[0].line,
                    "draft.status",
                    f"{len(pending)} of {len(dataset.cases)} case(s) are unscreened drafts: screen them "
                    "(set draft.status to 'screened', or drop the case), or pass --allow-draft",
                )
            ]
        )
