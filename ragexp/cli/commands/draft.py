"""``ragexp draft``, ``ragexp draft review FILE`` and ``ragexp draft accept QUEUE``."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from ragexp.cli.console import emit_json
from ragexp.cli.options import JsonFlag, TrackingUri, store_option
from ragexp.errors import ProviderError

Overrides = Annotated[list[str] | None, typer.Argument(help="Hydra overrides choosing the model: judge=openai ...")]
UiUrl = Annotated[
    str | None,
    typer.Option("--ui-url", help="MLflow UI address for the queue's link (default: the tracking URI if a server)"),
]


def draft(
    corpus: Annotated[
        str, typer.Option("--corpus", help="A JSONL of {id, text} chunks, or a folder of .md/.txt files.")
    ],
    out: Annotated[str, typer.Option("--out", help="The draft dataset (JSONL) to write.")],
    overrides: Overrides = None,
    n: Annotated[int, typer.Option("--n", help="Cases to plan (some may be dropped, as the summary says).")] = 100,
    unanswerable: Annotated[float, typer.Option("--unanswerable", help="Share of unanswerable questions.")] = 0.1,
    multi: Annotated[float, typer.Option("--multi", help="Share of questions over two related chunks.")] = 0.2,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the chunk sampling.")] = 0,
    cache: Annotated[
        str | None,
        typer.Option("--cache", help="Reply cache (default: draft-cache.sqlite in the tracking store's folder)."),
    ] = None,
    tracking_uri: TrackingUri = None,
    as_json: JsonFlag = False,
) -> None:
    """Draft cases (status: draft) from your documents; people screen them before they count:
    `ragexp draft review FILE` puts them in an MLflow review queue, `ragexp draft accept QUEUE`
    writes the ones people kept."""
    from ragexp.cli.views_people import show_drafted
    from ragexp.workflows.draft import draft_set

    shape: dict[str, Any] = {"n": n, "unanswerable": unanswerable, "multi": multi}
    drafted = draft_set(corpus, out, overrides or [], **shape, seed=seed, cache=cache, tracking_uri=tracking_uri)
    if as_json:
        emit_json(drafted.to_json())
    else:
        show_drafted(drafted)
    if drafted.failure:
        raise ProviderError(drafted.failure)


def _review(
    file: Annotated[str, typer.Argument(help="The draft file whose unscreened cases people screen.")],
    corpus: Annotated[str, typer.Option("--corpus", help="The chunks the cases were drafted from.")],
    queue: Annotated[str | None, typer.Option("--queue", help="The queue's name (default: 'draft FILE RUN').")] = None,
    settings: Annotated[list[str] | None, typer.Argument(help="tracking.uri=URI (as --tracking-uri).")] = None,
    tracking_uri: TrackingUri = None,
    ui_url: UiUrl = None,
    as_json: JsonFlag = False,
) -> None:
    """Put a draft file's unscreened cases in an MLflow review queue."""
    from ragexp.cli.views_people import show_draft_review
    from ragexp.workflows.draft import review_draft

    uri = store_option("draft review", tracking_uri, settings)
    queued = review_draft(file, corpus, queue=queue, tracking_uri=uri, ui_url=ui_url)
    if as_json:
        emit_json(queued.to_json())
    else:
        show_draft_review(queued)


def _accept(
    queue: Annotated[str, typer.Argument(help="The review queue (name or id) of `ragexp draft review`.")],
    out: Annotated[str, typer.Option("--out", help="The screened dataset (JSONL) to write.")],
    settings: Annotated[list[str] | None, typer.Argument(help="tracking.uri=URI (as --tracking-uri).")] = None,
    tracking_uri: TrackingUri = None,
    as_json: JsonFlag = False,
) -> None:
    """Write the cases of a review queue that people kept."""
    from ragexp.cli.views_people import show_accepted
    from ragexp.workflows.draft import accept_draft

    uri = store_option("draft accept", tracking_uri, settings)
    path, accepted = accept_draft(queue, out, tracking_uri=uri)
    if as_json:
        emit_json({"out": str(path), **accepted.to_json()})
    else:
        show_accepted(path, accepted)


MODES = {"review": _review, "accept": _accept}
"""``ragexp draft MODE``: the command's other modes, each a command of its own."""
