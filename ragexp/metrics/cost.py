"""A run's tokens and what they cost: the system's, from the usage its replies report, and the
judge's, from its client's counts; priced by ``cost.prices`` into the ``cost`` metric.

Pure functions over a run's results and counts; the runner logs what they return.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ragexp.config.models import CostConfig, TokenPrices
from ragexp.errors import MetricError
from ragexp.metrics.judge.usage import UNKNOWN_USAGE
from ragexp.metrics.registry import MetricSpec, cost_metric
from ragexp.records import CaseResult

COST = cost_metric().name
"""The registry metric a price table gives."""
PER_TOKENS = 1_000_000
"""Prices are per this many tokens."""
SYSTEM_PROMPT, SYSTEM_COMPLETION, SYSTEM_CASES = (
    "system.prompt_tokens",
    "system.completion_tokens",
    "system.usage_cases",
)
JUDGE_PROMPT, JUDGE_COMPLETION = "judge.prompt_tokens", "judge.completion_tokens"


def with_cost(specs: Sequence[MetricSpec], cost: CostConfig) -> list[MetricSpec]:
    """The run's metrics with ``cost`` among them when a price table is given (it is added if
    not named); ``cost`` named without prices is refused (one line)."""
    named = any(spec.name == COST for spec in specs)
    if cost.prices is None:
        if named:
            raise MetricError(
                f"metric '{COST}' needs a price table (cost.prices.system and/or cost.prices.judge, per "
                "million tokens); without one a run logs its tokens only"
            )
        return list(specs)
    return list(specs) if named else [*specs, cost_metric()]


def check_prices(cost: CostConfig, *, reports_usage: bool, judged: bool, provider: str) -> None:
    """Refuse a price for tokens the run cannot count: a cost that left them out would look
    cheaper than it was."""
    prices = cost.prices
    if prices is None:
        return
    if prices.system is not None and not reports_usage:
        raise MetricError(
            f"cost.prices.system: the system of provider {provider} reports no token usage (an http system's "
            "provider.system.response.prompt_tokens / completion_tokens say where its replies give it); "
            "price the judge alone with cost.prices.system=null"
        )
    if prices.system is None and (prices.judge is None or not judged):
        what = "no price" if prices.judge is None else "a judge price, and this run has no judge metric"
        raise MetricError(f"cost.prices: {what}, so nothing of this run would be priced; set cost.prices=null")


@dataclass(frozen=True)
class SystemTokens:
    """The tokens the system's replies reported, over the cases that reported any."""

    prompt: int
    completion: int
    cases: int
    """Cases whose reply reported usage."""
    answered: int
    """Cases the system answered (an errored call reports nothing)."""

    def as_metrics(self) -> dict[str, float]:
        if not self.cases:
            return {}
        return {SYSTEM_PROMPT: float(self.prompt), SYSTEM_COMPLETION: float(self.completion), SYSTEM_CASES: self.cases}


def system_tokens(results: Sequence[CaseResult]) -> SystemTokens:
    prompt = completion = cases = answered = 0
    for result in results:
        if result.output is None or result.error is not None:
            continue
        answered += 1
        tokens = result.output.tokens
        if tokens:
            cases += 1
            prompt += tokens.get("prompt", 0)
            completion += tokens.get("completion", 0)
    return SystemTokens(prompt, completion, cases, answered)


def _priced(prices: TokenPrices, prompt: float, completion: float) -> float:
    return (prompt * prices.prompt + completion * prices.completion) / PER_TOKENS


def run_cost(cost: CostConfig, system: SystemTokens, judge: Mapping[str, float]) -> tuple[float | None, str | None]:
    """The run's ``cost`` and, when it cannot be given, why: a priced system whose answered
    cases did not all report usage has tokens missing, and a missing count is not zero."""
    prices = cost.prices
    if prices is None:
        return None, None
    total = 0.0
    if prices.system is not None:
        if system.cases < system.answered:
            missing = system.answered - system.cases
            return None, (
                f"{COST} not logged: {missing} of the {system.answered} answered cases reported no token usage "
                "(a missing count is not zero)"
            )
        total += _priced(prices.system, system.prompt, system.completion)
    if prices.judge is not None:
        unknown = int(judge.get(UNKNOWN_USAGE, 0))
        if unknown:
            return None, (
                f"{COST} not logged: {unknown} judge calls reported no usable token usage (missing, negative or "
                f"not a whole number; a count that cannot be read is not zero): {UNKNOWN_USAGE}"
            )
        total += _priced(prices.judge, judge.get(JUDGE_PROMPT, 0.0), judge.get(JUDGE_COMPLETION, 0.0))
    return total, None
