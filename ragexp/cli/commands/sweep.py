"""``ragexp sweep PARENT_RUN``."""

from __future__ import annotations

from typing import Annotated

import typer

from ragexp.cli.console import emit_json
from ragexp.cli.options import JsonFlag, StoreOverrides, TrackingUri, resumable, store_option
from ragexp.outputs import info


def sweep(
    parent: Annotated[str, typer.Argument(help="Run id of the sweep's parent run (`ragexp run -m` prints it).")],
    overrides: StoreOverrides = None,
    baseline: Annotated[
        str | None, typer.Option("--baseline", help="Compare every point with this run (default: the first point).")
    ] = None,
    metric: Annotated[
        str | None,
        typer.Option("--metric", help="The quality axis of the front (default: the first headline quality metric)."),
    ] = None,
    confidence: Annotated[float, typer.Option("--confidence", min=0.5, max=0.999)] = 0.95,
    resamples: Annotated[
        int, typer.Option("--resamples", min=100, help="Sign-flip draws (p-values and intervals).")
    ] = 10_000,
    seed: Annotated[int, typer.Option("--seed", help="Random seed; the same seed gives the same figures.")] = 0,
    confirm: Annotated[
        float | None,
        typer.Option(
            "--confirm",
            help="Hold out this share of the cases: choose on the rest, run the winner on them, gate it (2: failed).",
        ),
    ] = None,
    tracking_uri: TrackingUri = None,
    as_json: JsonFlag = False,
) -> None:
    """A sweep's points against a baseline (corrected for many points), their Pareto front over
    quality, p95 latency and cost, and which to pick."""
    from ragexp.cli.views_sweep import show_sweep_points
    from ragexp.workflows.sweep import sweep_analysis

    given = [parent, *(overrides or []), *(["--tracking-uri", tracking_uri] if tracking_uri else [])]
    given += [*(["--baseline", baseline] if baseline else []), *(["--metric", metric] if metric else [])]
    given += ["--confidence", f"{confidence:g}", "--resamples", str(resamples), "--seed", str(seed)]
    given += [*(["--confirm", f"{confirm:g}"] if confirm is not None else []), *(["--json"] if as_json else [])]
    with resumable("sweep", given, replaying=confirm is not None):
        analysis = sweep_analysis(
            parent,
            tracking_uri=store_option("sweep", tracking_uri, overrides),
            baseline=baseline,
            metric=metric,
            confidence=confidence,
            resamples=resamples,
            seed=seed,
            confirm=confirm,
            say=info,
        )
    if as_json:
        emit_json(analysis.to_json())
    else:
        show_sweep_points(analysis)
    gate = analysis.confirm.gate if analysis.confirm is not None else None
    if gate is not None and not gate.passed:
        raise typer.Exit(2)
