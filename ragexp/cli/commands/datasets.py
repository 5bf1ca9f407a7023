"""``ragexp datasets diff OLD NEW``: the case-level ledger of two versions of a dataset."""

from __future__ import annotations

from typing import Annotated

import typer

from ragexp.cli.console import emit_json
from ragexp.cli.options import JsonFlag, TrackingUri, store_option

Side = Annotated[
    str,
    typer.Argument(
        help="A dataset file (JSONL or columns), a bundled dataset (kb_zh), or a run id.", show_default=False
    ),
]


def datasets() -> None:
    """Dataset versions: `ragexp datasets diff OLD NEW` lists the cases added, removed, changed
    (which field: question, history, gold) and unchanged between two files or two runs."""
    typer.echo("ragexp datasets diff OLD NEW [--json]: the case-level ledger of two dataset versions")


def _diff(
    old: Side,
    new: Side,
    settings: Annotated[list[str] | None, typer.Argument(help="tracking.uri=URI (as --tracking-uri).")] = None,
    tracking_uri: TrackingUri = None,
    as_json: JsonFlag = False,
) -> None:
    """The ledger from OLD to NEW: added, removed, changed (which field) and unchanged cases."""
    from ragexp.cli.views_validate import show_ledger
    from ragexp.workflows.datasets import datasets_diff

    found = datasets_diff(old, new, tracking_uri=store_option("datasets diff", tracking_uri, settings))
    if as_json:
        emit_json(found.to_json())
    else:
        show_ledger(found)


MODES = {"diff": _diff}
"""``ragexp datasets MODE``: the command's modes, each a command of its own."""
