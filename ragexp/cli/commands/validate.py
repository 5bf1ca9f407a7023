"""``ragexp validate [OVERRIDES]``."""

from __future__ import annotations

from typing import Annotated

import typer

from ragexp.cli.console import emit_json
from ragexp.cli.options import AllowDraft, ConfigDir, JsonFlag, Overrides, TrackingUri, use_config_dir
from ragexp.outputs import info

Corpus = Annotated[
    str | None,
    typer.Option(
        "--corpus",
        help="Audit the labels against this JSONL of {id, text} chunks (default: the configured dataset.corpus).",
    ),
]
Probe = Annotated[
    bool,
    typer.Option(
        "--probe",
        help="Ask the configured system about the first case, once: show the raw reply and what each "
        "response expression read from it.",
    ),
]
Anchor = Annotated[
    bool,
    typer.Option(
        "--anchor",
        help="Write the dataset with its relevant ids turned into evidence anchored to documents (relevant), "
        "from the --corpus chunks' texts and document ids, to --out.",
    ),
]


def validate(
    overrides: Overrides = None,
    config_dir: ConfigDir = None,
    path: Annotated[
        str | None, typer.Option("--path", help="Check this file instead of the configured dataset.")
    ] = None,
    fmt_: Annotated[str, typer.Option("--format", help="auto, jsonl or columns")] = "auto",
    corpus: Corpus = None,
    strict: Annotated[bool, typer.Option("--strict", help="Exit 1 when the label audit finds anything.")] = False,
    probe: Probe = False,
    anchor: Anchor = False,
    out: Annotated[str | None, typer.Option("--out", help="Where --anchor writes the new dataset.")] = None,
    force: Annotated[bool, typer.Option("--force", help="Let --anchor replace an existing --out file.")] = False,
    allow_draft: AllowDraft = False,
    tracking_uri: TrackingUri = None,
    as_json: JsonFlag = False,
) -> None:
    """Check a dataset without running anything; with a corpus, audit its labels (and check its
    evidence) too; with --probe, ask the system under test about the first case; with --anchor,
    turn chunk-id gold into evidence."""
    use_config_dir(config_dir)
    from ragexp.cli.views_validate import show_anchored, show_validation
    from ragexp.errors import ConfigError, DatasetErrors
    from ragexp.workflows.validate import anchor_dataset, check_dataset

    if out is not None and not anchor:
        raise ConfigError("--out goes with --anchor (validate writes nothing otherwise)")
    if force and not anchor:
        raise ConfigError("--force goes with --anchor --out (validate writes nothing otherwise)")
    try:
        if anchor:
            anchored = anchor_dataset(overrides or [], path=path, file_format=fmt_, corpus=corpus, out=out, force=force)
            if as_json:
                emit_json(anchored.to_json())
            else:
                show_anchored(anchored)
            return
        checked = check_dataset(
            overrides or [],
            path=path,
            file_format=fmt_,
            corpus=corpus,
            probe=probe,
            allow_draft=allow_draft,
            tracking_uri=tracking_uri,
            say=info,
        )
    except DatasetErrors as exc:
        if as_json:
            emit_json({"valid": False, "errors": [str(error) for error in exc.errors]})
        else:
            for error in exc.errors:
                info(f"ragexp: {error}")
        raise typer.Exit(1) from None
    if as_json:
        emit_json(checked.summary)
    else:
        show_validation(checked.summary, checked.findings)
    if (checked.findings and strict) or checked.probe_failed:
        raise typer.Exit(1)
