"""``ragexp report RUN_ID``."""

from __future__ import annotations

from typing import Annotated

import typer

from ragexp.cli.console import info
from ragexp.cli.options import AllowIncomparable, StoreOverrides, TrackingUri, store_option


def report(
    run_id: Annotated[str, typer.Argument(help="Run id to report on.")],
    overrides: StoreOverrides = None,
    baseline: Annotated[str | None, typer.Option("--baseline", help="Compare with this run.")] = None,
    out: Annotated[
        str | None, typer.Option("--out", help="Folder for report.md, report.html and plots (default: reports/RUN_ID).")
    ] = None,
    language: Annotated[
        str | None, typer.Option("--language", help="zh or en (default: the run's report.language).")
    ] = None,
    tracking_uri: TrackingUri = None,
    allow_incomparable: AllowIncomparable = False,
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
    from ragexp.report.publish import publish_report

    done = publish_report(
        run_id,
        baseline=baseline,
        out=out,
        language=language,
        tracking_uri=store_option("report", tracking_uri, overrides),
        allow_incomparable=allow_incomparable,
        say=info,
        attribute=attribute,
    )
    print(report_line(run_id, done))
