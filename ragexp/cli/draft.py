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
        str, typer.Option("--corpus", help="A JSONL of {id, text} chunks, or a folder of .md/.txt files.")
    ],
    out: Annotated[str, typer.Option("--out", help="The draft dataset (JSONL) to write.")],
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
    as_json: Annotated[bool, typer.Option("--json", help="Print exactly one JSON object on stdout.")] = False,
) -> None:
    """Draft cases (status: draft) from your documents; people screen them before they count."""
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
