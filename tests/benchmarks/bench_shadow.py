"""Benchmark: a shadow replay in simulation, `ragexp shadow --until-decided` then `ragexp label`.

    .venv/bin/python tests/benchmarks/bench_shadow.py [--samples 500] [--questions 5000] [--labels 100]

Each simulated sample is production traffic of ``--questions`` questions in 10 strata of equal
size; for every question the true (human) score of production's answer and of the candidate's,
in [0, 1], differ by a paired difference of sd 0.15, of mean 0 in nine strata and -0.05 (the
planted -5 points) in one. The judge sees each answer's true score plus its own noise (sd 0.1)
and a bias: it rates the candidate's answers 0.02 higher than their truth, so the raw judged
delta is off by +0.02.

The sequential shadow looks after each batch at each stratum's anytime-valid betting sequence
(``ragexp.stats.sequential``) of the judged paired difference, at the Bonferroni level over the
10 strata; it stops when a stratum's sequence lies wholly below 0 (that stratum regressed) or, for
all strata, above -0.05 (none did). Two ways to choose what is asked next:

- ``--allocation focused`` (the default; ``shadow --until-decided``'s): the product's own
  allocation, ``ragexp.workflows.traffic.FocusedOrder``: every stratum's first ``--start`` share
  (10%) in random order, then batches of ``--batch`` of a stratum's size (2%) each to the open
  stratum nearest to failing (the smallest ``passing_share`` of its interval, ties to the stratum
  asked least). Each stratum's sequence runs over its own cases in random order and holds at every
  look, whatever chose the looks, so its level and the Bonferroni bound over the strata are those
  of the proportional order.
- ``--allocation proportional``: the proportional order (``ragexp.workflows.traffic.interleave``,
  what ``shadow --until-decided`` asked before), each batch ``--batch`` of the traffic.

A fixed run judges every question; judge calls are two per question asked (production's answer
and the candidate's), so the share of a fixed run's calls is the share of questions asked.

Then ``--labels`` pairs of the stratum named are labelled (both answers scored by people) and
the stratum's delta is estimated by prediction-powered inference on the paired difference
(``ragexp.compare.shadow_pair.ppi_by_stratum``, as ``diff`` of a shadow pair: the judged differences
of every case asked in the stratum, corrected by the labelled pairs).

Targets (issue 47): the planted stratum detected with at most 40% of a fixed run's judge calls,
with at most 100 labels; the PPI interval covers the stratum's true delta (its mean over the
stratum's traffic) in at least 93% of samples. The raw judged interval's coverage is printed
beside it.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from ragexp.compare.shadow_pair import ppi_by_stratum
from ragexp.stats.sequential import difference_sequence
from ragexp.workflows.traffic import FocusedOrder, interleave, passing_share, shuffled_units

ALPHA = 0.05
STRATA = 10
PLANTED = 3
DROP = -0.05
BIAS = 0.02


def sample(
    rng: np.random.Generator, questions: int, bias: float = BIAS
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(stratum, true production score, true candidate score, judged difference) per question."""
    strata = np.arange(questions) % STRATA
    production = np.clip(0.6 + 0.2 * rng.standard_normal(questions), 0, 1)
    shift = np.where(strata == PLANTED, DROP, 0.0)
    candidate = np.clip(production + shift + 0.15 * rng.standard_normal(questions), 0, 1)
    judged_p = np.clip(production + 0.1 * rng.standard_normal(questions), 0, 1)
    judged_c = np.clip(candidate + bias + 0.1 * rng.standard_normal(questions), 0, 1)
    return strata, production, candidate, judged_c - judged_p


def stratified(strata: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """The proportional order (``ragexp.workflows.traffic.interleave``): strata interleaved."""
    units = {str(name): [[int(i)] for i in np.flatnonzero(strata == name)] for name in range(STRATA)}
    return np.array(interleave(units, rng))


def verdict(low: float, high: float) -> str:
    """A stratum's state from its sequence: regressed below 0, clear of the drop, or open."""
    return "regressed" if high < 0 else "clear" if low > DROP else "open"


def proportional(
    strata: np.ndarray, judged: np.ndarray, rng: np.random.Generator, args: argparse.Namespace
) -> tuple[np.ndarray, int | None]:
    """Ask in the stratified order, a batch at a time; look at every stratum after each batch."""
    questions = strata.size
    order = stratified(strata, rng)
    batch = max(1, round(args.batch * questions))
    level = ALPHA / STRATA
    ends = np.unique(np.append(np.arange(batch, questions, batch), questions))
    in_order = strata[order]
    # each stratum's sequence over its own cases in the order asked, looked at after every batch
    bounds = []
    for name in range(STRATA):
        mine = in_order == name
        counts = np.cumsum(mine)[ends - 1]
        looks = np.maximum(counts, 1)
        sequence = difference_sequence(judged[order[mine]], 1.0, level, np.unique(looks))
        at = {int(look): j for j, look in enumerate(sequence.looks)}
        bounds.append([(float(sequence.low[at[int(c)]]), float(sequence.high[at[int(c)]])) for c in looks])
    for step, end in enumerate(ends):
        verdicts = [verdict(*bounds[name][step]) for name in range(STRATA)]
        if "regressed" in verdicts:
            return order[: int(end)], verdicts.index("regressed")
        if all(v == "clear" for v in verdicts):
            return order[: int(end)], None
    return order, None


def focused(
    strata: np.ndarray, judged: np.ndarray, rng: np.random.Generator, args: argparse.Namespace
) -> tuple[np.ndarray, int | None]:
    """The product's allocation (``ragexp.workflows.traffic.FocusedOrder``, as ``shadow
    --until-decided`` asks): a warm-up of ``--start`` of every stratum, then each batch to the open
    stratum nearest to failing (``passing_share`` of its interval, the margin the product uses).
    Each stratum's sequence is over its own cases in random order and holds at every look whatever
    chose when to look (anytime-valid), so the Bonferroni level over the strata holds."""
    level = ALPHA / STRATA
    units = shuffled_units(
        {str(name): [[int(i)] for i in np.flatnonzero(strata == name)] for name in range(STRATA)}, rng
    )
    step = max(1, round(args.batch * strata.size / STRATA))
    order = FocusedOrder(units, step, warmup=args.start)
    members = {name: np.array([unit[0] for unit in found]) for name, found in units.items()}
    sequences = {}
    first = {name: min(mine.size, max(1, round(args.start * mine.size))) for name, mine in members.items()}
    for name, mine in members.items():
        # every count a look can fall on (the warm-up's, then one batch more at a time) is among these
        looks = np.unique(
            np.concatenate(
                [np.arange(1, mine.size + 1, step), np.arange(step, mine.size, step), [first[name], mine.size]]
            )
        )
        sequences[name] = difference_sequence(judged[mine], 1.0, level, looks)
    order.warmup()
    while True:
        at = {name: int(np.searchsorted(sequences[name].looks, order.asked(name))) for name in members}
        states = {name: sequences[name].low[at[name]] for name in members}
        highs = {name: sequences[name].high[at[name]] for name in members}
        verdicts = {name: verdict(float(states[name]), float(highs[name])) for name in members}
        taken = np.concatenate([members[name][: order.asked(name)] for name in sorted(members)])
        regressed = [name for name in sorted(members) if verdicts[name] == "regressed"]
        if regressed:
            return taken, int(regressed[0])
        margins = {
            name: passing_share(float(states[name]), float(highs[name]), 0.0)
            for name in members
            if verdicts[name] == "open"
        }
        if order.next(margins) is None:
            return taken, None


def one(rng: np.random.Generator, args: argparse.Namespace) -> dict[str, float]:
    strata, production, candidate, judged = sample(rng, args.questions, args.bias)
    policy = focused if args.allocation == "focused" else proportional
    taken, named = policy(strata, judged, rng, args)
    asked = taken.size
    order = taken
    # the labels: pairs of the named stratum (the planted one when nothing was named) among those asked
    stratum = PLANTED if named is None else named
    in_stratum = order[:asked][strata[order[:asked]] == stratum]
    labelled = rng.choice(in_stratum, size=min(args.labels, in_stratum.size), replace=False)
    human = np.full(in_stratum.size, np.nan)
    where = {int(index): position for position, index in enumerate(in_stratum)}
    for index in labelled:
        human[where[int(index)]] = candidate[index] - production[index]
    # the stratum's true delta over its traffic (clipping to [0, 1] moves it off the planted shift)
    truth = float((candidate - production)[strata == stratum].mean())
    _, corrected = ppi_by_stratum(
        judged[in_stratum], human, np.full(in_stratum.size, str(stratum)), confidence=1 - ALPHA, width=1.0
    )
    estimate = corrected[str(stratum)][1]
    raw = judged[in_stratum]
    half = 1.96 * float(raw.std()) / np.sqrt(raw.size)
    return {
        "detected": float(named == PLANTED),
        "false": float(named is not None and named != PLANTED),
        "share": asked / args.questions,
        "labels": float(labelled.size),
        "ppi_covers": float(estimate is not None and estimate.ci_low <= truth <= estimate.ci_high),
        "raw_covers": float(raw.mean() - half <= truth <= raw.mean() + half),
        "ppi_width": (estimate.ci_high - estimate.ci_low) if estimate is not None else float("nan"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=500)
    parser.add_argument("--questions", type=int, default=5000)
    parser.add_argument("--labels", type=int, default=100)
    parser.add_argument("--batch", type=float, default=0.02)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--bias", type=float, default=BIAS, help="the judge's bias for the candidate's answers")
    parser.add_argument("--allocation", choices=["focused", "proportional"], default="focused")
    parser.add_argument("--start", type=float, default=0.1, help="focused: the share of each stratum asked first")
    args = parser.parse_args()
    started = time.perf_counter()
    rng = np.random.default_rng(args.seed)
    runs = [one(rng, args) for _ in range(args.samples)]
    mean = {key: float(np.nanmean([run[key] for run in runs])) for key in runs[0]}
    median_share = float(np.median([run["share"] for run in runs]))
    found = [run["share"] for run in runs if run["detected"]]
    median_found = float(np.median(found)) if found else float("nan")
    print(
        f"{args.samples} samples of {args.questions} questions in {STRATA} strata, stratum {PLANTED} "
        f"planted {DROP:+.2f}, judge bias {args.bias:+.2f}, batches of {args.batch:.0%}, "
        f"α {ALPHA} (Bonferroni over strata)"
    )
    print(f"planted stratum named first: {mean['detected']:.3f}; another stratum named: {mean['false']:.3f}")
    print(f"judge calls against a fixed run: median {median_share:.0%}, mean {mean['share']:.0%}")
    print(f"judge calls where the planted stratum was named: median {median_found:.0%}")
    print(f"labels per sample: {mean['labels']:.0f}")
    print(f"PPI interval covers the true delta: {mean['ppi_covers']:.3f} (mean width {mean['ppi_width']:.3f})")
    print(f"raw judged interval covers it: {mean['raw_covers']:.3f}")
    print()
    ok_calls = median_share <= 0.4
    print(f"target: detected with at most 40% of the judge calls: {median_share:.0%}", "ok" if ok_calls else "MISSED")
    print(f"  (detected in {mean['detected']:.3f} of the samples; the issue names no rate)")
    print(f"target: at most 100 labels: {mean['labels']:.0f}", "ok" if mean["labels"] <= 100 else "MISSED")
    print(f"target: PPI coverage >= 0.93: {mean['ppi_covers']:.3f}", "ok" if mean["ppi_covers"] >= 0.93 else "MISSED")
    print(f"({time.perf_counter() - started:.0f} s in all)")


if __name__ == "__main__":
    main()
