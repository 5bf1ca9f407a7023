"""``ragexp draft`` whole: draft a set (:func:`draft_set`), put it in a review queue
(:func:`review_draft`), write the cases people kept (:func:`accept_draft`)."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ragexp.compare.summary import Links
from ragexp.config.compose import compose
from ragexp.config.tracking import chosen_uri
from ragexp.draft.corpus import read_corpus
from ragexp.draft.review import Accepted, ReviewQueue, accept, create_review
from ragexp.errors import ConfigError, StorageError
from ragexp.tracking.store import Store

if TYPE_CHECKING:
    from ragexp.draft.drafting import Summary


@dataclass(frozen=True)
class DraftedSet:
    out: Path
    summary: Summary
    failure: str | None
    """Why some planned cases got no reply, or why no case was drafted (None: every call was
    answered and some case kept); the cases drafted are written."""
    written: bool = True
    """Whether ``out`` was written (not when no case was drafted)."""

    def to_json(self) -> dict[str, Any]:
        return {"out": str(self.out) if self.written else None, **self.summary.to_json()}


def draft_set(
    corpus: str,
    out: str,
    overrides: Sequence[str] = (),
    *,
    n: int = 100,
    unanswerable: float = 0.1,
    multi: float = 0.2,
    seed: int = 0,
    cache: str | None = None,
    tracking_uri: str | None = None,
) -> DraftedSet:
    """Draft cases (``draft.status: draft``) from the corpus with the configured judge model and
    write them to ``out``; calls that got no reply leave their cases out, said in ``failure``.
    The reply cache lives in the tracking store's folder (``tracking_uri``: ``--tracking-uri``)."""
    config = compose(list(overrides))
    judge = config.provider.judge
    if judge is None:
        raise ConfigError(
            "ragexp draft needs a model: choose judge=openai (or judge=mindie) and set provider.judge.base_url"
        )
    from ragexp.draft.drafting import Drafter, Options  # asyncio, httpx: only when drafting

    options = Options(n=n, unanswerable=unanswerable, multi=multi, seed=seed)
    options.counts()
    out_path = Path(out)
    if out_path.is_dir():
        raise ConfigError(f"--out {out}: is a folder")
    chunks = read_corpus(Path(corpus))
    store = Store(chosen_uri(tracking_uri, overrides, config.tracking.uri))
    cache_path = Path(cache) if cache else store.state_dir() / "draft-cache.sqlite"
    drafter = Drafter(judge, cache_path)
    drafter.preflight()
    drafted = drafter.draft(chunks, options)
    summary = drafted.summary
    failure = None
    if summary.dropped.get("call_failed"):
        stopped = f"{drafter.stopped}; " if drafter.stopped else ""
        failure = (
            f"{stopped}{summary.dropped['call_failed']} planned case(s) got no reply (the first failure: "
            f"{summary.first_failure}); the cases drafted are written; rerun the same command to ask only for the rest"
        )
    if not drafted.cases:
        # An empty draft is no draft: the file (and any earlier one at that path) is left alone.
        return DraftedSet(out_path, summary, failure or nothing_drafted(summary, out_path), written=False)
    write_cases(out_path, drafted.cases)
    return DraftedSet(out_path, summary, failure)


def nothing_drafted(summary: Summary, out: Path) -> str:
    """The line for a draft that kept no case: the commonest reason, with what to check."""
    from ragexp.draft.drafting import REASONS

    reason, count = max(summary.dropped.items(), key=lambda item: item[1], default=("", 0))
    why = f"{count} of {summary.planned}: {REASONS[reason]}" if reason else "nothing was planned"
    hint = (
        "; check that provider.judge.model replies with the JSON the prompt asks for"
        if reason == "unusable_reply"
        else ""
    )
    return f"no case drafted ({why}){hint}; nothing written to {out}"


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


@dataclass(frozen=True)
class InReview:
    made: ReviewQueue
    path: Path
    base: str | None
    """The MLflow UI's address (None: none known)."""
    store_uri: str

    def to_json(self) -> dict[str, Any]:
        return self.made.to_json(self.base)


def review_draft(
    path: str, corpus: str, *, queue: str | None = None, tracking_uri: str | None = None, ui_url: str | None = None
) -> InReview:
    """Put the draft file's unscreened cases in an MLflow review queue."""
    chunks = read_corpus(Path(corpus))
    store = Store(tracking_uri)
    made = create_review(store, Path(path), chunks, queue)
    return InReview(made, Path(path), Links.for_store(store.uri, ui_url).base, store.uri)


def accept_draft(queue: str, out: str, *, tracking_uri: str | None = None) -> tuple[Path, Accepted]:
    """Write the cases of the review queue people kept to ``out``."""
    out_path = Path(out)
    if out_path.is_dir():
        raise ConfigError(f"--out {out_path}: is a folder")
    result = accept(Store(tracking_uri), queue)
    write_cases(out_path, result.cases)
    return out_path, result
