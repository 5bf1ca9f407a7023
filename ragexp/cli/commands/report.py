"""``ragexp report RUN_ID``."""

from __future__ import annotations

from typing import Annotated

import typer

from ragexp.cli.options import (
    AllowIncomparable,
    BridgeJudge,
    CommonCases,
    StoreOverrides,
    TrackingUri,
    resumable,
    store_option,
)
from ragexp.errors import ConfigError
from ragexp.outputs import info


def report(
    run_id: Annotated[str | None, typer.Argument(help="Run id to report on.", show_default=False)] = None,
    overrides: StoreOverrides = None,
    baseline: Annotated[str | None, typer.Option("--baseline", help="Compare with this run.")] = None,
    sweep: Annotated[
        str | None, typer.Option("--sweep", help="Report on this sweep (its parent run id) instead of one run.")
    ] = None,
    out: Annotated[
        str | None, typer.Option("--out", help="Folder for report.md, report.html and plots (default: reports/RUN_ID).")
    ] = None,
    language: Annotated[
        str | None, typer.Option("--language", help="zh or en (default: the run's report.language).")
    ] = None,
    tracking_uri: TrackingUri = None,
    allow_incomparable: AllowIncomparable = False,
    common_cases: CommonCases = False,
    bridge_judge: BridgeJudge = None,
    attribute: Annotated[
        bool,
        typer.Option(
            "--attribute",
            help="Add the attribution by replay of the change (recorded by diff --attribute, else measured now).",
        ),
    ] = False,
) -> None:
    """Markdown + self-contained HTML report with plots, also logged to the run."""
    from ragexp.cli.views import report_line
    from ragexp.workflows.report import publish_report, publish_sweep_report

    if sweep is not None and run_id is None:
        done = publish_sweep_report(
            sweep,
            baseline=baseline,
            out=out,
            language=language,
            tracking_uri=store_option("report", tracking_uri, overrides),
            say=info,
        )
        print(report_line(sweep, done))
        return
    if run_id is None or sweep is not None:
        raise ConfigError("ragexp report: give a run id, or --sweep PARENT_RUN (one of them)")
    given = [run_id, *(overrides or []), *(["--tracking-uri", tracking_uri] if tracking_uri else [])]
    options = {"--baseline": baseline, "--out": out, "--language": language, "--bridge-judge": bridge_judge}
    given += [part for option, value in options.items() if value for part in (option, value)]
    given += ["--allow-incomparable"] * allow_incomparable + ["--common-cases"] * common_cases
    with resumable("report", [*given, "--attribute"], replaying=attribute):
        done = publish_report(
            run_id,
            baseline=baseline,
            out=out,
            language=language,
            tracking_uri=store_option("report", tracking_uri, overrides),
            allow_incomparable=allow_incomparable,
            say=info,
            attribute=attribute,
            common_cases=common_cases,
            bridge_judge=bridge_judge,
        )
    print(report_line(run_id, done))
