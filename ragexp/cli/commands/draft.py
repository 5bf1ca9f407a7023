"""``ragexp draft``: draft an evaluation set from a corpus with the configured judge model."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from ragexp.errors import ConfigError, ProviderError, StorageError


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
    tracking_uri: Annotated[
        str | None,
        typer.Option(
            "--tracking-uri", help="With --review/--accept: MLflow tracking URI (default: $MLFLOW_TRACKING_URI)."
        ),
    ] = None,
    ui_url: Annotated[
        str | None,
        typer.Option("--ui-url", help="MLflow UI address for the queue's link (default: the tracking URI if a server)"),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print exactly one JSON object on stdout.")] = False,
) -> None:
    """Draft cases (status: draft) from your documents; people screen them before they count
    (--review puts them in an MLflow review queue, --accept writes the ones people kept)."""
    if review is not None and accept is not None:
        raise ConfigError("draft: --review and --accept are two steps: give one of them")
    if review is not None:
        if corpus is None or out is not None or overrides:
            raise ConfigError("draft --review FILE: give --corpus (the chunks the cases came from), and no --out")
        _review(Path(review), Path(corpus), queue, tracking_uri, ui_url, as_json)
        return
    if accept is not None:
        if out is None or corpus is not None or queue is not None or overrides:
            raise ConfigError("draft --accept QUEUE: give --out FILE (and no --corpus, --queue or overrides)")
        _accept(accept, Path(out), tracking_uri, as_json)
        return
    if corpus is None or out is None:
        raise ConfigError("draft: give --corpus and --out (or --review FILE, or --accept QUEUE)")
    if queue is not None or tracking_uri is not None or ui_url is not None:
        raise ConfigError("draft: --queue, --tracking-uri and --ui-url belong to --review and --accept")
    from ragexp.config.compose import compose
    from ragexp.draft.corpus import read_corpus
    from ragexp.draft.drafting import Drafter, Options
    from ragexp.tracking.store import Store

    config = compose(overrides or [])
    judge = config.provider.judge
    if judge is None:
        raise ConfigError(
            "ragexp draft needs a model: choose judge=openai (or judge=mindie) and set provider.judge.base_url"
        )
    options = Options(n=n, unanswerable=unanswerable, multi=multi, seed=seed)
    options.counts()
    out_path = Path(out)
    if out_path.is_dir():
        raise ConfigError(f"--out {out}: is a folder")
    chunks = read_corpus(Path(corpus))
    cache_path = Path(cache) if cache else Store(config.tracking.uri).state_dir() / "draft-cache.sqlite"
    drafter = Drafter(judge, cache_path)
    drafter.preflight()
    drafted = drafter.draft(chunks, options)
    write_cases(out_path, drafted.cases)
    summary = drafted.summary
    if as_json:
        sys.stdout.write(json.dumps({"out": str(out_path), **summary.to_json()}, ensure_ascii=False) + "\n")
    else:
        for line in summary.lines():
            print(line)
        print(f"wrote {out_path}: screen it (set draft.status to 'screened', or drop the case) before it counts")
    if summary.dropped.get("call_failed"):
        stopped = f"{drafter.stopped}; " if drafter.stopped else ""
        raise ProviderError(
            f"{stopped}{summary.dropped['call_failed']} planned case(s) got no reply (the first failure: "
            f"{summary.first_failure}); the cases drafted are written; rerun the same command to ask only for the rest"
        )


def write_cases(path: Path, cases: list[dict[str, object]]) -> None:
    """Write the JSONL at once (a temporary file renamed), so an old file is never half replaced."""
    temporary = path.with_name(path.name + ".partial")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with temporary.open("w", encoding="utf-8") as handle:
            handle.writelines(json.dumps(case, ensure_ascii=False) + "\n" for case in cases)
        os.replace(temporary, path)
    except OSError as exc:
        raise StorageError(f"--out {path}: cannot write: {exc.strerror}") from None


def _review(
    path: Path, corpus: Path, queue: str | None, tracking_uri: str | None, ui_url: str | None, as_json: bool
) -> None:
    from ragexp.compare.summary import Links
    from ragexp.draft.corpus import read_corpus
    from ragexp.draft.review import create_review
    from ragexp.tracking.store import Store

    chunks = read_corpus(corpus)
    store = Store(tracking_uri)
    made = create_review(store, path, chunks, queue)
    base = Links.for_store(store.uri, ui_url).base
    if as_json:
        sys.stdout.write(json.dumps(made.to_json(base), ensure_ascii=False) + "\n")
        return
    print(
        f"review queue '{made.queue}' ({made.queue_id}): {made.traces} drafted cases of {path}"
        + (f", {made.passed_through} already screened or not drafted left as they are" if made.passed_through else "")
    )
    from ragexp.cli.views import print_queue_link

    print_queue_link(made.url, base, store.uri)
    print(f"then: ragexp draft --accept '{made.queue}' --out screened.jsonl")


def _accept(queue: str, out: Path, tracking_uri: str | None, as_json: bool) -> None:
    from ragexp.draft.review import accept
    from ragexp.tracking.store import Store

    if out.is_dir():
        raise ConfigError(f"--out {out}: is a folder")
    result = accept(Store(tracking_uri), queue)
    write_cases(out, result.cases)
    if as_json:
        sys.stdout.write(json.dumps({"out": str(out), **result.to_json()}, ensure_ascii=False) + "\n")
        return
    print(
        f"{result.accepted} accepted, {len(result.rejected)} rejected (dropped), {result.pending} not reviewed yet; "
        f"wrote {len(result.cases)} cases to {out}"
    )
    if result.pending:
        print(
            f"the {result.pending} not reviewed stay draft.status 'draft' (ragexp run refuses them): review them "
            f"and run this again, or drop them from {out}"
        )
