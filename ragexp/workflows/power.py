"""``ragexp power``: what a comparison with one baseline could detect (:func:`baseline_power`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ragexp.compare.comparisons import Say, silent
from ragexp.compare.data import RunData, load_run
from ragexp.compare.power import POWER, POWER_ASSUMPTION, Plan, baseline_plan, check_effect
from ragexp.compare.select import (
    parse_selector,
    resolve_baseline,
)
from ragexp.tracking.store import Store


@dataclass(frozen=True)
class BaselinePower:
    """What a comparison with one baseline could detect, metric by metric."""

    baseline: RunData
    plans: list[Plan]
    confidence: float
    effect: float | None
    correlation: float

    def to_json(self) -> dict[str, Any]:
        return {
            "baseline": self.baseline.run_id,
            "confidence": self.confidence,
            "power": POWER,
            "correlation": self.correlation,
            "assumption": POWER_ASSUMPTION,
            "metrics": [p.to_json() for p in self.plans],
        }


def baseline_power(
    baseline: str,
    *,
    effect: float | None = None,
    confidence: float = 0.95,
    correlation: float = 0.0,
    tracking_uri: str | None = None,
    say: Say = silent,
) -> BaselinePower:
    """``ragexp power``: per metric of the baseline, the smallest change a paired comparison
    detects, and with ``effect`` the cases it needs."""
    check_effect(effect)
    selector = parse_selector(baseline)
    store = Store(tracking_uri, must_exist=True)
    chosen = resolve_baseline(store, selector, candidate=None)
    if chosen.asked:
        say(chosen.how)
    run = load_run(store, chosen.record)
    plans = baseline_plan(run, confidence=confidence, effect=effect, correlation=correlation)
    return BaselinePower(run, plans, confidence, effect, correlation)
