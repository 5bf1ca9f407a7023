"""What a paired comparison can detect: the minimum detectable effect and the cases it needs.

The textbook paired formula on the per-case differences ``d`` of ``n`` cases:

    detectable = (q(1 - α/2) + q(power)) · sd(d) / √n

with α = 1 - confidence (two-sided, as the gate's intervals are) and ``q`` the quantile of
Student's t with ``n - 1`` degrees of freedom (:func:`t_quantile`, computed here: no statistics
library is loaded for it). The t quantile, not the normal one, because
``sd(d)`` is estimated from the same ``n`` cases the test runs on, and because the gate's
sign-flip test scales its null distribution by the observed ``Σd²``, which includes the shift
itself: at tens of cases the normal quantile promises more power than that test has, the t
quantile's wider margin lands on it (tests/test_power.py simulates it). For hundreds of cases
the two quantiles agree.

Pass/fail metrics are different: every difference is -1, 0 or 1, and then the sign-flip test is
exactly the sign (McNemar) test on the discordant pairs, whose statistic ``Σd/√(Σd²)`` counts the
shift in its own scale and moves in whole pairs. The formula above promises more than that test
delivers there. So for such differences (:func:`is_pass_fail`) the detectable effect is the shift
``δ = p₊ - p₋`` at which the exact power of that test reaches 80%, with the share of discordant
pairs ``π = p₊ + p₋`` held at the observed one (:func:`pass_fail_power`): the number of discordant
pairs is binomial in ``n``, and given it the pairs that went up are binomial with ``(π + δ)/2π``.
Past :data:`EXACT_DISCORDANT` expected discordant pairs the discreteness no longer matters and
McNemar's closed form ``δ√n = z(1-α/2)·√π + z(power)·√(π - δ²)`` is used. When even a shift of
every discordant pair in one direction would be found less than 4 times in 5 (too few discordant
pairs), there is no detectable effect: None, said as such, never a figure.

Before a candidate exists only the baseline's per-case spread is known. The paired difference's
variance is ``Var(b) + Var(c) - 2·Cov(b, c)``; :func:`paired_sd_from_baseline` assumes the
candidate has the baseline's variance and a correlation ``ρ`` with it (default 0: independent
runs), so ``sd(d) = sd(b)·√(2(1 - ρ))``. Two versions of one system agree on most cases
(ρ > 0), so ρ = 0 overstates the spread and the cases needed: an upper bound, not a guess.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from statistics import NormalDist
from typing import TYPE_CHECKING

import numpy as np

from ragexp.compare.figures import fmt
from ragexp.errors import ConfigError
from ragexp.metrics.population import covered
from ragexp.metrics.registry import METRICS, RETRIEVALS, MetricSpec
from ragexp.phrases import t
from ragexp.stats.paired import unit_means

if TYPE_CHECKING:
    from ragexp.compare.data import RunData

POWER = 0.8
"""Probability of detecting a true change of the detectable size."""
POWER_ASSUMPTION = (
    "sd of the paired difference = sd(baseline) * sqrt(2 * (1 - correlation)): the candidate is assumed "
    "to have the baseline's per-case variance"
)

MAX_CASES = 10**9
"""Past this many cases the answer is "practically never" (an effect of almost nothing)."""


LARGE_DF = 10_000
"""Past these degrees of freedom the Cornish-Fisher series is the t quantile to double precision."""


def _incomplete_beta(x: float, a: float, b: float) -> float:
    """Regularized incomplete beta ``I_x(a, b)`` by its continued fraction (modified Lentz)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    if x > (a + 1.0) / (a + b + 2.0):
        return 1.0 - _incomplete_beta(1.0 - x, b, a)
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)) / a
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    f = d
    for m in range(1, 10_000):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            f *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return front * f


def _t_upper(t: float, df: float) -> float:
    """``P(T > t)`` for Student's t with ``df`` degrees of freedom, ``t >= 0``."""
    return 0.5 * _incomplete_beta(df / (df + t * t), df / 2.0, 0.5)


def t_quantile(p: float, df: float) -> float:
    """Quantile of Student's t (``df = inf``: the normal one), for ``0.5 <= p < 1``."""
    z = NormalDist().inv_cdf(p)
    if math.isinf(df):
        return z
    # Cornish-Fisher series (Abramowitz & Stegun 26.7.5): the start, and the answer for large df.
    z2 = z * z
    t = z + sum(
        g / df**k
        for k, g in enumerate(
            (
                (z2 + 1) * z / 4,
                ((5 * z2 + 16) * z2 + 3) * z / 96,
                (((3 * z2 + 19) * z2 + 17) * z2 - 15) * z / 384,
                ((((79 * z2 + 776) * z2 + 1482) * z2 - 1920) * z2 - 945) * z / 92160,
            ),
            start=1,
        )
    )
    if df >= LARGE_DF:
        return t
    # Newton's method on the exact tail, kept to the bracket [low, high] where it oversteps.
    target = 1.0 - p
    log_norm = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    low, high = 0.0, max(t, 1.0) * 4.0
    while _t_upper(high, df) > target:
        low, high = high, high * 4.0
    t = min(max(t, low), high)
    for _ in range(200):
        gap = _t_upper(t, df) - target
        if abs(gap) <= 1e-14 * target or high - low <= 1e-15 * t:
            break
        if gap > 0:
            low = t
        else:
            high = t
        density = math.exp(log_norm - (df + 1) / 2 * math.log1p(t * t / df))
        step = t + gap / density
        t = step if low < step < high else (low + high) / 2
    return t


def smallest_testable(confidence: float) -> int:
    """Fewest pairs with which the sign-flip test can reach ``p < 1 - confidence`` at all: with
    ``n`` pairs its smallest two-sided p-value is ``2 / 2ⁿ``."""
    alpha = 1.0 - confidence
    n = 2
    while 2.0 / 2.0**n >= alpha:
        n += 1
    return n


def quantile_sum(n: int, confidence: float, power: float = POWER) -> float:
    """``t(1 - α/2, n - 1) + t(power, n - 1)``: the detectable effect in units of ``sd(d)/√n``."""
    if n < 2:
        raise ValueError("a detectable effect needs at least two pairs")
    alpha = 1.0 - confidence
    return t_quantile(1.0 - alpha / 2.0, n - 1) + t_quantile(power, n - 1)


def detectable_effect(sd: float, n: int, *, confidence: float, power: float = POWER) -> float | None:
    """Minimum detectable effect of a paired comparison of ``n`` cases whose differences have
    standard deviation ``sd``; None when the sign-flip test cannot reject with so few pairs."""
    if n < smallest_testable(confidence):
        return None
    return quantile_sum(n, confidence, power) * sd / math.sqrt(n)


def cases_needed(sd: float, effect: float, *, confidence: float, power: float = POWER) -> int | None:
    """Fewest cases whose detectable effect is at most ``effect``; None when no number of cases
    is enough (a zero effect, or more than :data:`MAX_CASES`)."""
    effect = abs(effect)
    floor = smallest_testable(confidence)
    if sd == 0.0:
        return floor
    if effect == 0.0:
        return None
    # The normal approximation is a lower bound (t quantiles exceed normal ones); step up from it.
    alpha = 1.0 - confidence
    z = t_quantile(1.0 - alpha / 2.0, math.inf) + t_quantile(power, math.inf)
    n = max(floor, math.ceil((z * sd / effect) ** 2))
    if n > MAX_CASES:
        return None
    while quantile_sum(n, confidence, power) * sd / math.sqrt(n) > effect:
        n += 1
    return n


EXACT_DISCORDANT = 1000
"""Expected discordant pairs up to which a pass/fail metric's power is computed exactly."""


def is_pass_fail(diffs: np.ndarray) -> bool:
    """Every (finite) paired difference is -1, 0 or 1: two pass/fail runs."""
    finite = diffs[np.isfinite(diffs)]
    return bool(finite.size) and bool(np.all((finite == 0.0) | (finite == 1.0) | (finite == -1.0)))


def _log_choose(n: float, k: np.ndarray) -> np.ndarray:
    lgamma = np.vectorize(math.lgamma, otypes=[np.float64])
    found: np.ndarray = math.lgamma(n + 1.0) - lgamma(k + 1.0) - lgamma(n - k + 1.0)
    return found


@dataclass(frozen=True)
class _SignTest:
    """The exact two-sided sign test of ``n`` pairs, ``π`` of them discordant on average: the
    rejected (discordant count, ups) cells with their log weights, independent of the shift."""

    n: int
    discordant: float
    log_weight: np.ndarray
    """log P(N discordant) + log C(N, k) per rejected cell."""
    ups: np.ndarray
    downs: np.ndarray

    @classmethod
    def of(cls, n: int, discordant: float, confidence: float) -> _SignTest:
        alpha = 1.0 - confidence
        mean = n * discordant
        spread = math.sqrt(max(mean * (1.0 - discordant), 1.0))
        counts = np.arange(max(0, math.floor(mean - 10 * spread)), min(n, math.ceil(mean + 10 * spread)) + 1)
        weights = _log_choose(n, counts.astype(np.float64))
        if 0.0 < discordant < 1.0:
            weights = weights + counts * math.log(discordant) + (n - counts) * math.log1p(-discordant)
        else:
            weights = np.where(counts == round(n * discordant), 0.0, -np.inf)
        log_weight, ups, downs = [], [], []
        log_factorial = np.concatenate(([0.0], np.cumsum(np.log(np.arange(1, int(counts[-1]) + 1)))))
        for count, weight in zip(counts.tolist(), weights.tolist(), strict=True):
            if count == 0 or not math.isfinite(weight):
                continue
            k = np.arange(count + 1, dtype=np.float64)
            log_c = log_factorial[count] - log_factorial[: count + 1] - log_factorial[count::-1]
            null = np.exp(log_c - count * math.log(2.0))
            # Two-sided p-value of k ups: P(|2X - N| >= |2k - N|) under fair coins.
            tail = np.cumsum(null[::-1])[::-1]  # P(X >= k)
            p_value = np.minimum(1.0, 2.0 * np.minimum(tail, 1.0 - tail + null))
            rejected = p_value < alpha
            log_weight.append(weight + log_c[rejected])
            ups.append(k[rejected])
            downs.append(count - k[rejected])
        if not log_weight:
            empty = np.empty(0)
            return cls(n, discordant, empty, empty, empty)
        return cls(n, discordant, np.concatenate(log_weight), np.concatenate(ups), np.concatenate(downs))

    def power(self, effect: float) -> float:
        """Probability of rejecting when the pairs that went up outnumber those that went down by
        ``effect`` of all pairs."""
        if self.ups.size == 0:
            return 0.0
        up = min(max((self.discordant + effect) / (2.0 * self.discordant), 0.0), 1.0)
        with np.errstate(divide="ignore", invalid="ignore"):
            log_up = np.where(self.ups > 0, self.ups * math.log(up) if up > 0 else -np.inf, 0.0)
            log_down = np.where(self.downs > 0, self.downs * math.log1p(-up) if up < 1 else -np.inf, 0.0)
        return float(np.exp(self.log_weight + log_up + log_down).sum())


def pass_fail_power(n: int, discordant: float, effect: float, *, confidence: float) -> float:
    """Exact power of the gate's test on ``n`` pass/fail pairs, a share ``discordant`` of them
    discordant, at a shift ``effect`` (module docstring)."""
    return _SignTest.of(n, discordant, confidence).power(abs(effect))


def _mcnemar_effect(n: int, discordant: float, confidence: float, power: float) -> float | None:
    """δ solving ``δ√n = a·√π + b·√(π - δ²)`` (normal quantiles ``a``, ``b``); None past ``π``."""
    a = NormalDist().inv_cdf(1.0 - (1.0 - confidence) / 2.0)
    b = NormalDist().inv_cdf(power)
    root = a * a * n * discordant - (n + b * b) * (a * a - b * b) * discordant
    effect = (a * math.sqrt(n * discordant) + math.sqrt(max(root, 0.0))) / (n + b * b)
    return effect if effect <= discordant else None


def pass_fail_effect(n: int, discordant: float, *, confidence: float, power: float = POWER) -> float | None:
    """Minimum detectable effect of ``n`` pass/fail pairs with discordant share ``discordant``;
    None when no shift within that share is found with ``power`` (module docstring)."""
    if discordant <= 0.0 or n < smallest_testable(confidence):
        return None
    if n * discordant > EXACT_DISCORDANT:
        return _mcnemar_effect(n, discordant, confidence, power)
    test = _SignTest.of(n, discordant, confidence)
    if test.power(discordant) < power:
        return None
    low, high = 0.0, discordant
    for _ in range(45):
        middle = (low + high) / 2.0
        if test.power(middle) < power:
            low = middle
        else:
            high = middle
    return high


def pass_fail_cases_needed(discordant: float, effect: float, *, confidence: float, power: float = POWER) -> int | None:
    """Fewest pass/fail pairs that detect ``effect`` at discordant share ``discordant``."""
    effect = abs(effect)
    if effect == 0.0 or discordant <= 0.0 or effect > discordant:
        return None
    a = NormalDist().inv_cdf(1.0 - (1.0 - confidence) / 2.0)
    b = NormalDist().inv_cdf(power)
    guess = math.ceil(((a * math.sqrt(discordant) + b * math.sqrt(discordant - effect * effect)) / effect) ** 2)
    if guess > MAX_CASES:
        return None
    if guess * discordant > EXACT_DISCORDANT:
        n = max(smallest_testable(confidence), guess)
        while (found := _mcnemar_effect(n - 1, discordant, confidence, power)) is not None and found <= effect:
            n -= 1
        return n
    # Exact power: the smallest n of a doubling-then-halving search (it rises with n but for
    # small ripples of discreteness).
    low, high = smallest_testable(confidence) - 1, max(smallest_testable(confidence), guess)
    while pass_fail_power(high, discordant, effect, confidence=confidence) < power:
        low, high = high, high * 2
        if high > MAX_CASES:
            return None
    while high - low > 1:
        middle = (low + high) // 2
        if pass_fail_power(middle, discordant, effect, confidence=confidence) < power:
            low = middle
        else:
            high = middle
    return high


def paired_sd_from_baseline(values: np.ndarray, correlation: float = 0.0) -> float | None:
    """``sd`` of the paired difference assumed from the baseline's per-case values alone (module
    docstring); None with fewer than two values."""
    finite = values[np.isfinite(values)]
    if finite.size < 2:
        return None
    return float(np.std(finite, ddof=1) * math.sqrt(2.0 * (1.0 - correlation)))


@dataclass(frozen=True)
class Power:
    """What one metric's comparison can detect."""

    n: int
    """Paired cases."""
    sd: float
    """Standard deviation of the per-case differences (sample, n - 1)."""
    detectable: float | None
    """Minimum detectable effect (None: too few pairs for the test to reject anything)."""
    confidence: float
    discordant: float | None = None
    """Pass/fail differences: the share of discordant pairs (None: a continuous metric)."""
    unit: str = "case"
    """What ``n`` counts: ``case``, or ``conversation`` (the differences are per-conversation means)."""

    def needed(self, effect: float) -> int | None:
        """Cases needed to detect ``effect`` with this spread."""
        if self.discordant is not None:
            return pass_fail_cases_needed(self.discordant, effect, confidence=self.confidence)
        return cases_needed(self.sd, effect, confidence=self.confidence)

    def cannot_tell(self, allowed: float) -> bool:
        """A change of ``allowed`` is below what this comparison can detect."""
        return self.detectable is None or allowed < self.detectable - 1e-12


def paired_power(diffs: np.ndarray, *, confidence: float, unit: str = "case") -> Power | None:
    """:class:`Power` of the per-unit differences ``diffs`` (non-finite ones dropped); None
    without any pair."""
    finite = diffs[np.isfinite(diffs)]
    if finite.size == 0:
        return None
    sd = float(np.std(finite, ddof=1)) if finite.size > 1 else 0.0
    n = int(finite.size)
    if is_pass_fail(finite):
        discordant = float(np.count_nonzero(finite)) / n
        return Power(n, sd, pass_fail_effect(n, discordant, confidence=confidence), confidence, discordant, unit)
    return Power(n, sd, detectable_effect(sd, n, confidence=confidence), confidence, unit=unit)


def detectable_words(power: Power, language: str = "en") -> str:
    """The detectable effect as a figure, or in words why there is none (too few pairs, too few
    discordant pairs): never a bare dash."""
    floor = smallest_testable(power.confidence)
    if power.detectable is not None:
        return fmt(power.detectable)
    if power.discordant is not None and power.n >= floor:
        return t("too_few_discordant", language, discordant=round(power.discordant * power.n))
    return t("too_few", language, floor=floor)


def cannot_tell_line(allowed: float, power: Power, language: str = "en", *, increase: bool = False) -> str:
    """The sentence under an underpowered rule: what it cannot tell (a drop, or for a
    ``max_increase*`` rule an increase), and what would be needed."""
    needed = power.needed(allowed)
    more = t("needed_some", language, needed=f"{needed:,}") if needed is not None else t("needed_none", language)
    detectable = detectable_words(power, language)
    units = t(f"units_{power.unit}", language)
    key = "cannot_tell_increase" if increase else "cannot_tell"
    return t(key, language, drop=f"{allowed:g}", n=power.n, units=units, detectable=detectable, needed=more)


@dataclass(frozen=True)
class Plan:
    """What a comparison against one baseline metric could detect, before any candidate."""

    metric: str
    n: int
    """The baseline's scored cases of this metric (its population: answerable ones where it says so)."""
    sd: float | None
    """Assumed standard deviation of the paired difference (:func:`paired_sd_from_baseline`)."""
    detectable: float | None
    effect: float | None
    needed: int | None
    """Cases needed to detect ``effect`` (None without an effect, or when none would be enough)."""
    why: dict[str, str] = field(default_factory=dict)
    """Why a figure is missing, in words, for each of ``sd``, ``detectable_effect`` and
    ``cases_needed`` that is None (an ``effect`` was asked for but no number of cases reaches it...)."""
    unit: str = "case"
    """What ``n`` and ``needed`` count: ``case``, or ``conversation`` (a run of conversations)."""

    def to_json(self) -> dict[str, object]:
        return {
            "name": self.metric,
            "cases": self.n,
            "n": self.n,
            "unit": self.unit,
            "sd": self.sd,
            "detectable_effect": self.detectable,
            "effect": self.effect,
            "cases_needed": self.needed,
            "why_missing": dict(self.why),
        }


def check_effect(effect: float | None) -> None:
    """Refuse an ``--effect`` no metric can show: not a finite number, not positive, or larger
    than the whole range of every bounded per-case metric (a mean in [0, 1] moves by 1 at most)."""
    if effect is None:
        return
    if not math.isfinite(effect):
        raise ConfigError(f"--effect: expected a finite change, got {effect}")
    if effect <= 0:
        raise ConfigError(f"--effect: expected a positive change, got {effect:g}")
    # The call counts of a multi-hop run (unbounded) are left out: an effect is meant for scores.
    bounded = [spec for spec in METRICS.values() if spec.mean_of_cases and RETRIEVALS not in spec.needs_output]
    if not bounded or any(spec.high is None for spec in bounded):
        return
    widest = max(bounded, key=lambda spec: (spec.high or 0.0) - spec.low)
    if effect > (widest.high or 0.0) - widest.low:
        raise ConfigError(
            f"--effect: {effect:g} is more than any metric's mean can change (per-case values lie in "
            f"[{widest.low:g}, {widest.high:g}] at the widest)"
        )


def baseline_plan(
    run: RunData, *, confidence: float, effect: float | None = None, correlation: float = 0.0
) -> list[Plan]:
    """One :class:`Plan` per per-case-mean metric of the baseline ``run``; a figure it cannot
    give is None, and :attr:`Plan.why` says why in words."""
    plans = []
    floor = smallest_testable(confidence)
    for name in run.metrics:
        spec = run.spec(name)
        values = run.per_case(name)
        if spec is None or not spec.mean_of_cases or values is None:
            continue
        units = run.units()
        within = covered(spec, run.unanswerable)
        values, units = values[within], units[within] if units is not None else None
        finite = np.isfinite(values)
        values = values[finite]
        if units is not None and values.size:
            # Conversations are the unit: the spread, and the cases needed, are those of their means.
            values = unit_means(values, units[finite])
        sd = paired_sd_from_baseline(values, correlation)
        n = int(values.size)
        why: dict[str, str] = {}
        detectable: float | None = None
        needed: int | None = None
        if sd is None:
            why["sd"] = why["detectable_effect"] = f"{n} scored case(s): a spread needs at least two"
        elif sd == 0.0:
            # The assumed candidate has the baseline's spread: none, so it would change no case.
            why["detectable_effect"] = (
                f"every one of the {n} scored cases has the value {fmt(float(values[0]))}: the baseline shows no "
                "spread, and the assumed candidate (with the baseline's spread) would change no case; what a "
                "real candidate lets a comparison detect depends on its own spread (ragexp diff shows it)"
            )
        elif np.all((values == 0.0) | (values == 1.0)):
            # With no change expected, the discordant share is the paired difference's variance.
            share = min(sd * sd, 1.0)
            detectable = pass_fail_effect(n, share, confidence=confidence)
            if detectable is None:
                why["detectable_effect"] = _too_few(n, floor, round(share * n))
            if effect is not None:
                needed = pass_fail_cases_needed(share, effect, confidence=confidence)
                if needed is None:
                    why["cases_needed"] = (
                        f"a change of {effect:g} is more than the share of cases expected to differ ({fmt(share)}, "
                        "the pass/fail variance): no number of cases reaches it"
                        if effect > share
                        else f"more than {MAX_CASES:,} cases would be needed"
                    )
        else:
            detectable = detectable_effect(sd, n, confidence=confidence)
            if detectable is None:
                why["detectable_effect"] = _too_few(n, floor, None)
            if effect is not None:
                needed = cases_needed(sd, effect, confidence=confidence)
                if needed is None:
                    why["cases_needed"] = f"more than {MAX_CASES:,} cases would be needed"
        if effect is not None and values.size and effect > _headroom(values, spec):
            needed = None
            why["cases_needed"] = (
                f"a change of {effect:g} is more than this metric can move from the baseline's mean "
                f"{fmt(float(values.mean()))} (its values lie in [{spec.low:g}, {spec.high:g}])"
            )
        elif effect is not None and needed is None and "cases_needed" not in why:
            why["cases_needed"] = why["detectable_effect"]
        plans.append(Plan(name, n, sd, detectable, effect, needed, why, run.unit))
    return plans


def _too_few(n: int, floor: int, discordant: int | None) -> str:
    if n < floor:
        return f"{n} scored cases: the paired test cannot reject anything with fewer than {floor}"
    return f"about {discordant} of {n} cases are expected to differ: too few for the paired test to find any change"


def _headroom(values: np.ndarray, spec: MetricSpec) -> float:
    """The largest change of the mean of ``values`` the metric's range allows, either way."""
    if spec.high is None:
        return math.inf
    mean = float(values.mean())
    return max(mean - spec.low, spec.high - mean)
