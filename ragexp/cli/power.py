"""``ragexp power`` and the detectable-effect lines of ``ragexp diff`` and ``ragexp gate``."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from ragexp.compare.diff import DiffResult
    from ragexp.compare.gate import GateResult


def print_gate_power(result: GateResult) -> None:
    """Per metric of the gate's rules, what the comparison can detect; then each underpowered rule."""
    from ragexp.cli.render import fmt

    seen: dict[str, str] = {}
    for rule in result.rules:
        if rule.power is not None and rule.metric not in seen:
            seen[rule.metric] = f"{fmt(rule.detectable_effect)} with {rule.power.n} cases"
    if seen:
        print("detectable change (two-sided, 80% power):")
        for name, text in seen.items():
            print(f"  {name:22} {text}")
    for rule in result.rules:
        line = rule.cannot_tell()
        if line:
            print(f"note: {rule.metric} {rule.rule} {rule.threshold:g}: {line}")


def print_diff_power(result: DiffResult) -> None:
    """The footnote saying what the 'detectable' column means."""
    if any(m.power is not None for m in result.metrics):
        print(
            f"\ndetectable: the smallest true change each paired comparison finds 4 times in 5 "
            f"(two-sided, {result.confidence:.0%} confidence); a smaller change may well be missed"
        )


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
    tracking_uri: Annotated[
        str | None,
        typer.Option(
            "--tracking-uri",
            help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI, else sqlite:///mlruns/mlflow.db).",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print exactly one JSON object on stdout.")] = False,
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
