"""``ragexp draft``: draft an evaluation set from a corpus with the configured judge model."""

from __future__ import annotations

from typing import Annotated

import typer

from ragexp.cli.console import emit_json
from ragexp.cli.options import JsonFlag, TrackingUri, store_option
from ragexp.errors import ConfigError, ProviderError


def draft(
    corpus: Annotated[
        str | None, typer.Option("--corpus", help="A JSONL of {id, text} chunks, or a folder of .md/.txt files.")
    ] = None,
    out: Annotated[
        str | None, typer.Option("--out", help="The draft dataset (JSONL) to write (with --accept: the screened set).")
    ] = None,
    overrides: Annotated[
        list[str] | None,
        typer.Argument(help="Hydra overrides choosing the model, e.g. judge=openai provider.judge.base_url=URL"),
    ] = None,
    n: Annotated[int, typer.Option("--n", help="Cases to plan (some may be dropped, as the summary says).")] = 100,
    unanswerable: Annotated[float, typer.Option("--unanswerable", help="Share of unanswerable questions.")] = 0.1,
    multi: Annotated[float, typer.Option("--multi", help="Share of questions over two related chunks.")] = 0.2,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the chunk sampling.")] = 0,
    cache: Annotated[
        str | None,
        typer.Option("--cache", help="Reply cache (default: draft-cache.sqlite in the tracking store's folder)."),
    ] = None,
    review: Annotated[
        str | None,
        typer.Option(
            "--review", help="Put this draft file's unscreened cases in an MLflow review queue (needs --corpus)."
        ),
    ] = None,
    accept: Annotated[
        str | None,
        typer.Option("--accept", help="Write the cases of this review queue (name or id) people kept to --out."),
    ] = None,
    queue: Annotated[
        str | None, typer.Option("--queue", help="With --review: the queue's name (default: 'draft FILE RUN').")
    ] = None,
    tracking_uri: TrackingUri = None,
    ui_url: Annotated[
        str | None,
        typer.Option("--ui-url", help="MLflow UI address for the queue's link (default: the tracking URI if a server)"),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Draft cases (status: draft) from your documents; people screen them before they count
    (--review puts them in an MLflow review queue, --accept writes the ones people kept)."""
    from ragexp.cli.views import show_accepted, show_draft_review, show_drafted
    from ragexp.draft.workflow import accept_draft, draft_set, review_draft

    if review is not None and accept is not None:
        raise ConfigError("draft: --review and --accept are two steps: give one of them")
    if review is not None:
        if corpus is None or out is not None:
            raise ConfigError("draft --review FILE: give --corpus (the chunks the cases came from), and no --out")
        uri = store_option("draft --review", tracking_uri, overrides)
        queued = review_draft(review, corpus, queue=queue, tracking_uri=uri, ui_url=ui_url)
        if as_json:
            emit_json(queued.to_json())
        else:
            show_draft_review(queued)
        return
    if accept is not None:
        if out is None or corpus is not None or queue is not None:
            raise ConfigError("draft --accept QUEUE: give --out FILE (and no --corpus or --queue)")
        uri = store_option("draft --accept", tracking_uri, overrides)
        path, accepted = accept_draft(accept, out, tracking_uri=uri)
        if as_json:
            emit_json({"out": str(path), **accepted.to_json()})
        else:
            show_accepted(path, accepted)
        return
    if corpus is None or out is None:
        raise ConfigError("draft: give --corpus and --out (or --review FILE, or --accept QUEUE)")
    if queue is not None or ui_url is not None:
        raise ConfigError("draft: --queue and --ui-url belong to --review and --accept")
    drafted = draft_set(
        corpus,
        out,
        overrides or [],
        n=n,
        unanswerable=unanswerable,
        multi=multi,
        seed=seed,
        cache=cache,
        tracking_uri=tracking_uri,
    )
    if as_json:
        emit_json(drafted.to_json())
    else:
        show_drafted(drafted)
    if drafted.failure:
        raise ProviderError(drafted.failure)
