"""``ragexp gate --baseline BASELINE [OVERRIDES]``."""

from __future__ import annotations

from typing import Annotated

import typer

from ragexp.cli.console import emit_json
from ragexp.cli.options import (
    AllowIncomparable,
    Baseline,
    BridgeJudge,
    CommonCases,
    ConfigDir,
    JsonFlag,
    Language,
    Overrides,
    SummaryFile,
    TrackingUri,
    UiUrl,
    use_config_dir,
)
from ragexp.outputs import info


def gate(
    baseline: Baseline,
    overrides: Overrides = None,
    config_dir: ConfigDir = None,
    candidate: Annotated[
        str | None,
        typer.Option(
            "--candidate",
            help="Run id of the candidate (default: the newest finished run created after the baseline in its "
            "experiment that is comparable with it).",
        ),
    ] = None,
    tracking_uri: TrackingUri = None,
    allow_incomparable: AllowIncomparable = False,
    common_cases: CommonCases = False,
    bridge_judge: BridgeJudge = None,
    junit: Annotated[str | None, typer.Option("--junit", help="Write a JUnit XML report here.")] = None,
    summary: SummaryFile = None,
    language: Language = None,
    ui_url: UiUrl = None,
    promote: Annotated[
        bool,
        typer.Option(
            "--promote",
            help="If the gate passes, move the baseline's tag (tag:KEY=VALUE, or --promote-tag) onto the candidate.",
        ),
    ] = False,
    promote_tag: Annotated[
        str | None, typer.Option("--promote-tag", help="KEY=VALUE that --promote moves (default: the --baseline tag).")
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Release check of a candidate against a baseline: exit 0 pass, 2 fail; every failure is printed."""
    use_config_dir(config_dir)
    from ragexp.cli.views_compare import gate_exit, show_gate
    from ragexp.workflows.gate import run_gate

    outcome = run_gate(
        baseline,
        overrides=overrides or [],
        candidate=candidate,
        tracking_uri=tracking_uri,
        allow_incomparable=allow_incomparable,
        common_cases=common_cases,
        bridge_judge=bridge_judge,
        junit=junit,
        summary=summary,
        language=language,
        ui_url=ui_url,
        promote=promote,
        promote_tag=promote_tag,
        say=info,
    )
    if as_json:
        emit_json(outcome.to_json())
    else:
        show_gate(outcome)
    code = gate_exit(outcome)
    if code:
        raise typer.Exit(code)
