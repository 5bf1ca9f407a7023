"""``ragexp power --baseline BASELINE``."""

from __future__ import annotations

import json
import sys
from typing import Annotated

import typer

from ragexp.cli.options import JsonFlag, TrackingUri


def power(
    baseline: Annotated[
        str,
        typer.Option(
            "--baseline", help="Run id of the baseline, or tag:KEY=VALUE / latest:EXPERIMENT.", show_default=False
        ),
    ],
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
    from ragexp.compare.data import load_run
    from ragexp.compare.power import POWER, baseline_plan
    from ragexp.compare.select import parse_selector, resolve_baseline
    from ragexp.errors import ConfigError
    from ragexp.tracking.store import Store

    if effect is not None and effect <= 0:
        raise ConfigError(f"--effect: expected a positive change, got {effect:g}")
    selector = parse_selector(baseline)
    store = Store(tracking_uri, read_only=True)
    chosen = resolve_baseline(store, selector, candidate=None)
    if chosen.asked:
        sys.stderr.write(chosen.how + "\n")
    run = load_run(store, chosen.run_id)
    plans = baseline_plan(run, confidence=confidence, effect=effect, correlation=correlation)
    assumption = (
        "sd of the paired difference = sd(baseline) * sqrt(2 * (1 - correlation)): the candidate is assumed "
        "to have the baseline's per-case variance"
    )
    if as_json:
        payload = {
            "baseline": run.run_id,
            "confidence": confidence,
            "power": POWER,
            "correlation": correlation,
            "assumption": assumption,
            "metrics": [p.to_json() for p in plans],
        }
        sys.stdout.write(json.dumps(payload, ensure_ascii=False) + "\n")
        return
    from ragexp.cli.render import fmt, table

    print(f"baseline {run.run_id}  ({len(run.case_ids)} cases)")
    headers = ["metric", "cases", "sd of difference", "detectable"]
    if effect is not None:
        headers.append(f"cases for {effect:g}")
    rows = []
    for p in plans:
        row = [p.metric, str(p.n), fmt(p.sd), fmt(p.detectable)]
        if effect is not None:
            row.append(f"{p.needed:,}" if p.needed is not None else "not reachable")
        rows.append(row)
    print(table(headers, rows, "lrrr" + "r" * (effect is not None)))
    print(
        f"\ntwo-sided, {confidence:.0%} confidence, {POWER:.0%} power; assumed: {assumption} "
        f"and a correlation of {correlation:g} with it"
    )
