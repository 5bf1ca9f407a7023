"""``ragexp diff BASELINE CANDIDATE``."""

from __future__ import annotations

from typing import Annotated

import typer

from ragexp.cli.console import emit_json
from ragexp.cli.options import (
    AllowIncomparable,
    BridgeJudge,
    CommonCases,
    JsonFlag,
    Language,
    StoreOverrides,
    SummaryFile,
    TrackingUri,
    UiUrl,
    resumable,
    store_option,
)
from ragexp.outputs import info


def diff(
    baseline: Annotated[
        str, typer.Argument(help="Run id of the baseline, or tag:KEY=VALUE / latest:EXPERIMENT.", show_default=False)
    ],
    candidate: Annotated[str, typer.Argument(help="Run id of the candidate.")],
    overrides: StoreOverrides = None,
    top: Annotated[int, typer.Option("--top", min=0, help="How many of the most regressed cases to show.")] = 10,
    tracking_uri: TrackingUri = None,
    allow_incomparable: AllowIncomparable = False,
    common_cases: CommonCases = False,
    bridge_judge: BridgeJudge = None,
    resamples: Annotated[
        int, typer.Option("--resamples", min=100, help="Sign-flip draws (p-value and interval).")
    ] = 10_000,
    confidence: Annotated[float, typer.Option("--confidence", min=0.5, max=0.999)] = 0.95,
    seed: Annotated[int, typer.Option("--seed", help="Random seed; the same seed gives the same figures.")] = 0,
    summary: SummaryFile = None,
    language: Language = None,
    ui_url: UiUrl = None,
    as_json: JsonFlag = False,
    attribute: Annotated[
        bool,
        typer.Option(
            "--attribute",
            help="Split each answer metric's delta into retrieval, generation and interaction by replaying "
            "each system's generator on the other's retrieval (both systems must answer from given contexts).",
        ),
    ] = False,
) -> None:
    """Per-metric and per-case comparison with paired confidence intervals and p-values."""
    from ragexp.cli.views_compare import show_diff
    from ragexp.workflows.diff import compare_runs

    store = [*(overrides or []), *(["--tracking-uri", tracking_uri] if tracking_uri else [])]
    with resumable("diff", [baseline, candidate, *store, "--attribute"], replaying=attribute):
        compared = compare_runs(
            baseline,
            candidate,
            top=top,
            tracking_uri=store_option("diff", tracking_uri, overrides),
            allow_incomparable=allow_incomparable,
            common_cases=common_cases,
            bridge_judge=bridge_judge,
            resamples=resamples,
            confidence=confidence,
            seed=seed,
            summary=summary,
            language=language,
            ui_url=ui_url,
            say=info,
            attribute=attribute,
        )
    if as_json:
        from ragexp.cli.views_compare import diff_json

        emit_json(diff_json(compared.result))
    else:
        show_diff(compared.result)
