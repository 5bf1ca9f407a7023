"""``ragexp power --baseline BASELINE``."""

from __future__ import annotations

from typing import Annotated

import typer

from ragexp.cli.console import emit_json
from ragexp.cli.options import JsonFlag, StoreOverrides, TrackingUri, store_option
from ragexp.outputs import info


def power(
    baseline: Annotated[
        str,
        typer.Option(
            "--baseline", help="Run id of the baseline, or tag:KEY=VALUE / latest:EXPERIMENT.", show_default=False
        ),
    ],
    overrides: StoreOverrides = None,
    effect: Annotated[
        float | None,
        typer.Option("--effect", help="The change to detect, in each metric's unit: prints the cases it needs."),
    ] = None,
    confidence: Annotated[float, typer.Option("--confidence", min=0.5, max=0.999)] = 0.95,
    correlation: Annotated[
        float,
        typer.Option(
            "--correlation",
            min=-1.0,
            max=0.99,
            help="Assumed correlation of candidate and baseline per case (0: independent, an upper bound on the "
            "spread for any positive correlation).",
        ),
    ] = 0.0,
    tracking_uri: TrackingUri = None,
    as_json: JsonFlag = False,
) -> None:
    """What a comparison with this baseline could detect, and the cases a given effect needs."""
    from ragexp.cli.views_compare import show_power
    from ragexp.workflows.power import baseline_power

    found = baseline_power(
        baseline,
        effect=effect,
        confidence=confidence,
        correlation=correlation,
        tracking_uri=store_option("power", tracking_uri, overrides),
        say=info,
    )
    if as_json:
        emit_json(found.to_json())
    else:
        show_power(found)
