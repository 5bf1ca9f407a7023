"""``ragexp run --baseline RUN --until-decided``: evaluate until the gate's verdict is known.

The cases are evaluated in a seeded random order, in batches (``sequential.batch``), by the runner's
own evaluation: the system's concurrency, retries, error rules and checkpoint. A conversation is
sampled whole: its turns come together, in order, each asked with the history of the turns before
it, and a batch ends only where a conversation does (``sequential.batch`` cases or a few more), so
the run stops between conversations, never inside one. After each batch every rule of the selected
gate that a confidence sequence can decide (``max_drop``, ``min`` and ``max`` on a metric with a
known range) is decided on the anytime-valid interval of :mod:`ragexp.stats.sequential`, computed
from the cases evaluated so far paired with the baseline's. The evaluation stops when a rule has
failed (the verdict is then known) or every such rule has passed, else when the cases run out. The
run is logged as any run, over the cases it evaluated, in the order it evaluated them, and tagged
``ragexp.sequential.*``; ``ragexp gate`` recomputes the same bounds from that order
(:func:`ragexp.compare.gate.with_sequential`).

Traffic (``dataset=traces``, ``ragexp shadow --until-decided``) is asked otherwise: a warm-up of
every stratum, then each batch from the open stratum nearest to failing
(:class:`ragexp.workflows.traffic.FocusedOrder`), and decided by stratum: each stratum's rules on
its own cases at the gate's level over the strata (Bonferroni). That stays anytime-valid because
each stratum's sequence sees only its own cases, in a random order fixed in advance; the choice of
which stratum to ask next only decides when a sequence is looked at, and a confidence sequence
holds at every look. The pooled rules are then over-weighted toward the suspicious strata: they are
reported, not decided on.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ragexp import artifacts, limits, strict_json
from ragexp.checkpoint import Checkpoint
from ragexp.compare.data import RunData, load_run
from ragexp.compare.gate import (
    RuleResult,
    SequentialValues,
    check_gate,
    is_sequential,
    looks_of,
    sequential_bounded,
    sequential_rules,
)
from ragexp.compare.select import IDENTITY, parse_selector, resolve_baseline
from ragexp.config.compose import compose
from ragexp.config.tracking import chosen_uri
from ragexp.conversations import conversations
from ragexp.datasets.screening import DRAFT_TAG, refuse_unscreened, unscreened
from ragexp.errors import ConfigError, IncomparableRunsError
from ragexp.metrics.judge.scorer import JudgeOutcome, Judging, Turns
from ragexp.metrics.judge.usage import Usage
from ragexp.metrics.registry import METRICS, MetricSpec, case_values_metric
from ragexp.outputs import info
from ragexp.progress import Phase
from ragexp.records import Case, CaseResult
from ragexp.secrets import register_url
from ragexp.stats.sequential import METHOD
from ragexp.tracking.store import TAG_PREFIX, Store
from ragexp.workflows.run import Evaluation, evaluate_cases, execute
from ragexp.workflows.run_plan import Plan, plan_run
from ragexp.workflows.run_score import score_results
from ragexp.workflows.traffic import FocusedOrder, focused_order, passing_share

PREFIX = TAG_PREFIX + "sequential."


def batch_size(setting: float, total: int) -> int:
    """Cases per batch: ``setting`` of the dataset below 1, else that many cases (at least one)."""
    if setting < 1:
        return max(1, round(setting * total))
    if setting != int(setting):
        raise ConfigError(
            f"sequential.batch={setting:g}: a number of cases is a whole number (or give a share below 1)"
        )
    return int(setting)


def units_of(cases: Sequence[Case]) -> list[tuple[int, ...]]:
    """What is sampled, in dataset order: a single question alone, a conversation with its
    turns in order (a later turn is asked after, and with, the turns before it)."""
    chats = {chat.id: chat.positions for chat in conversations(cases)}
    found: list[tuple[int, ...]] = []
    for position, case in enumerate(cases):
        if case.conversation is None:
            found.append((position,))
        elif chats[case.conversation][0] == position:
            found.append(chats[case.conversation])
    return found


def evaluation_order(cases: Sequence[Case], seed: int) -> list[int]:
    """The dataset positions in the order the cases are evaluated in: the units (single
    questions, whole conversations) in a seeded random order, a conversation's turns in order."""
    units = units_of(cases)
    return [position for u in np.random.default_rng(seed).permutation(len(units)) for position in units[int(u)]]


def unit_labels(cases: Sequence[Case]) -> list[str] | None:
    """Each case's unit, for :func:`ragexp.compare.gate.looks_of` (None: no conversation)."""
    if not any(case.conversation is not None for case in cases):
        return None
    return [case.conversation if case.conversation is not None else f"\0{case.id}" for case in cases]


@dataclass
class SequentialOutcome:
    """Where a sequential run stopped, and why."""

    baseline: str
    evaluated: int
    total: int
    batch: int
    decision: str
    """``passed`` (every rule passed), ``failed`` (a rule failed) or ``inconclusive`` (the cases
    ran out with a rule still reaching both sides of its threshold)."""
    rules: list[RuleResult] = field(default_factory=list)
    """The gate's rules on every case evaluated. With the focused order of traffic (``strata`` not
    None) they describe the cases asked, over-weighted toward the suspicious strata, and do not
    decide: the strata do."""
    strata: list[StratumOutcome] | None = None
    """Traffic asked in the focused order: each stratum's rules, which decide the run."""

    def to_json(self) -> dict[str, Any]:
        """``run --until-decided --json``'s ``sequential``."""
        return {
            "evaluated": self.evaluated,
            "total": self.total,
            "decision": self.decision,
            "baseline": self.baseline,
            "batch": self.batch,
            "method": METHOD,
            "rules": [
                {**rule_json(r), "detectable_effect": r.detectable_effect, "message": r.message} for r in self.rules
            ],
            **({"strata": [stratum.to_json() for stratum in self.strata]} if self.strata is not None else {}),
        }

    def tags(self) -> dict[str, str]:
        """The ``ragexp.sequential.*`` tags of the stop: cases evaluated, decision, each rule's bound."""
        found = {
            PREFIX + "evaluated": str(self.evaluated),
            PREFIX + "decision": self.decision,
        }
        for r in self.rules:
            key = limits.safe_segment(f"{r.metric}.{r.rule}", limits.TAG_KEY.chars - len(PREFIX + "rule."))
            bound = r.sequential
            text = (
                r.outcome if bound is None else f"{bound.decision} [{bound.low:.6g}, {bound.high:.6g}] on {bound.pairs}"
            )
            found[PREFIX + "rule." + key] = limits.fit(limits.TAG_VALUE, text)
        return found


def decision_of(rules: Sequence[RuleResult]) -> str:
    """``failed`` once a rule failed, ``passed`` when every rule passed, else ``inconclusive``."""
    decisions = [r.sequential.decision if r.sequential else "inconclusive" for r in rules]
    if "failed" in decisions:
        return "failed"
    return "passed" if decisions and all(d == "passed" for d in decisions) else "inconclusive"


class RememberingJudge:
    """The run's judge, asked once per case: a batch's scores are kept by case id, so the run's
    final scoring of every evaluated case costs no second call (with or without the judge cache)."""

    def __init__(self, inner: Judging) -> None:
        self.inner = inner
        self.adaptation_usage = inner.adaptation_usage
        self.usage = Usage()
        self.cache_hits = 0
        self.served: set[str] = set()
        self.stale = 0
        self.kept: dict[str, tuple[dict[str, float], dict[str, float], dict[str, str], dict[str, str]]] = {}

    def score(
        self, cases: Sequence[Case], results: Sequence[CaseResult], *, progress: bool | None, histories: Turns = None
    ) -> JudgeOutcome:
        new = [i for i, case in enumerate(cases) if case.id not in self.kept]
        if new:
            asked_after = [histories[i] for i in new] if histories is not None else None
            found = self.inner.score(
                [cases[i] for i in new], [results[i] for i in new], progress=progress, histories=asked_after
            )
            for j, i in enumerate(new):
                self.kept[cases[i].id] = (
                    {name: float(values[j]) for name, values in found.scores.items()},
                    {name: float(values[j]) for name, values in found.spread.items()},
                    found.errors.get(j, {}),
                    found.rationales.get(j, {}),
                )
            self.usage.add(found.usage)
            self.cache_hits += found.cache_hits
            self.served |= found.served
            self.stale += found.stale
        rows = [self.kept[case.id] for case in cases]
        names = {name for row in rows for name in row[0]}
        spread_names = {name for row in rows for name in row[1]}
        usage = Usage()
        usage.add(self.usage)  # the run's calls so far: what its last scoring logs
        return JudgeOutcome(
            scores={name: np.array([row[0].get(name, np.nan) for row in rows]) for name in names},
            errors={i: dict(row[2]) for i, row in enumerate(rows) if row[2]},
            spread={name: np.array([row[1].get(name, np.nan) for row in rows]) for name in spread_names},
            usage=usage,
            cache_hits=self.cache_hits,
            rationales={i: dict(row[3]) for i, row in enumerate(rows) if row[3]},
            served=set(self.served),
            stale=self.stale,
        )


def check_baseline(plan: Plan, baseline: RunData) -> None:
    """The baseline must be a whole run of the same cases, K, metrics and judge (exit 3 otherwise)."""
    if is_sequential(baseline):
        raise ConfigError(
            f"--baseline {baseline.run_id} is a run of --until-decided that evaluated "
            f"{len(baseline.case_ids)} of {baseline.record.tag('sequential.total')} cases: use a run of every case"
        )
    tags = plan.tags()
    found = []
    both = bool(baseline.record.tag("cases_hash"))
    for tag, what in IDENTITY:
        if tag == "dataset_hash" and both:
            tag = "cases_hash"
        if baseline.record.tag(tag) != tags.get(TAG_PREFIX + tag, ""):
            found.append(f"{what} differs")
    missing = {case.id for case in plan.dataset.cases} - set(baseline.case_ids)
    if missing:
        found.append(f"{len(missing)} cases are not in the baseline")
    if found:
        raise IncomparableRunsError(f"--baseline {baseline.run_id} is not comparable with this run: {'; '.join(found)}")


def check_decidable(plan: Plan) -> None:
    """The gate must have a rule a confidence sequence can decide, else nothing would stop the run."""
    gates = plan.config.gates
    check_gate(gates)
    specs = {spec.name: spec for spec in plan.specs}
    specs.setdefault(case_values_metric("errored").name, case_values_metric("errored"))
    for name, rule in gates.rules.items():
        kinds = [kind for kind in ("max_drop", "min", "max") if getattr(rule, kind) is not None]
        if kinds and sequential_bounded(specs.get(name) or METRICS.get(name)):
            return
    raise ConfigError(
        f"gates {gates.name}: no rule a confidence sequence can decide (max_drop, min or max on a metric with a "
        "known range); run without --until-decided, or add such a rule"
    )


class Batches:
    """The evaluation of ``run --until-decided`` (a :class:`ragexp.workflows.run.Evaluate`): in a
    fixed ``order``, or, given ``focus`` (traffic), in the order :class:`FocusedOrder` chooses from
    each stratum's sequences, deciding by stratum."""

    def __init__(
        self,
        baseline: RunData,
        order: list[int],
        batch: int,
        store: Store,
        focus: FocusedOrder | None = None,
        strata: Mapping[str, str] | None = None,
    ) -> None:
        self.baseline = baseline
        self.order = order
        self.batch = batch
        self.store = store
        self.focus = focus
        self.strata = dict(strata or {})
        self.outcome: SequentialOutcome | None = None

    def __call__(
        self,
        plan: Plan,
        run_id: str,
        done: dict[str, CaseResult],
        checkpoint: Checkpoint | None,
        arrived: list[CaseResult],
    ) -> tuple[Plan, list[CaseResult]]:
        judge = RememberingJudge(plan.scorer) if plan.scorer is not None else None
        scoring = dataclasses.replace(plan, scorer=judge)
        total = len(plan.dataset.cases)
        specs: dict[str, MetricSpec | None] = {spec.name: spec for spec in plan.specs}
        errors_name = case_values_metric("errored").name
        specs.setdefault(errors_name, case_values_metric("errored"))
        fixed = [plan.dataset.cases[i] for i in self.order]
        units = unit_labels(fixed)
        planned = looks_of(total, self.batch, units)
        chunks = iter(zip([0, *planned[:-1].tolist()], planned.tolist(), strict=True))
        ordered: list[Case] = []
        ends: list[int] = []
        results: list[CaseResult] = []
        columns: dict[str, list[np.ndarray]] = {}
        rules: list[RuleResult] = []
        by_stratum: dict[str, StratumOutcome] = {}
        decision = "inconclusive"
        while True:
            if self.focus is None:
                span = next(chunks, None)
                chunk = fixed[span[0] : span[1]] if span is not None else []
            else:
                chunk = [plan.dataset.cases[i] for i in self._next_focused(by_stratum, not ends)]
            if not chunk:
                break
            ordered.extend(chunk)
            got = evaluate_cases(scoring, chunk, done, checkpoint, arrived)
            results.extend(got)
            part = dataclasses.replace(scoring, dataset=dataclasses.replace(plan.dataset, cases=chunk))
            scored = score_results(part, got)
            for name, values in scored.scores.items():
                columns.setdefault(name, []).append(values)
            columns.setdefault(errors_name, []).append(scored.errored.astype(np.float64))
            evaluated = len(results)
            ends.append(evaluated)
            base = self.baseline.select([case.id for case in ordered[:evaluated]])
            candidate = {name: np.concatenate(parts) for name, parts in columns.items()}
            looks = (
                looks_of(evaluated, self.batch, units[:evaluated] if units is not None else None)
                if self.focus is None
                else np.array(ends, dtype=np.int64)
            )
            paired = SequentialValues(
                {name: found for name in candidate if (found := base.per_case(name)) is not None},
                candidate,
                specs,
                base.unanswerable,
                looks,
                total,
            )
            rules = sequential_rules(plan.config.gates, paired)
            if self.focus is None:
                decision = decision_of(rules)
            else:
                by_stratum = self._by_stratum(plan, paired, [case.id for case in ordered])
                decision = strata_decision(by_stratum)
            self.store.set_tags(run_id, {PREFIX + "evaluated": str(evaluated)})
            state = _state(rules) if self.focus is None else _strata_state(by_stratum)
            info(f"until decided: {evaluated} of {total} cases evaluated, {state}")
            if decision in ("passed", "failed"):
                break
        outcome = SequentialOutcome(
            self.baseline.run_id,
            len(results),
            total,
            self.batch,
            decision,
            rules,
            strata=[by_stratum[name] for name in sorted(by_stratum)] if self.focus is not None else None,
        )
        self.outcome = outcome
        self.store.set_tags(run_id, outcome.tags())
        record = strict_json.dumps(outcome.to_json(), indent=1).encode("utf-8")
        self.store.log_files(run_id, {artifacts.SEQUENTIAL: record})
        logged = dataclasses.replace(scoring, dataset=dataclasses.replace(plan.dataset, cases=ordered))
        return logged, results

    def _next_focused(self, by_stratum: Mapping[str, StratumOutcome], first: bool) -> list[int]:
        """The next batch's positions: the warm-up first, then the open stratum nearest to failing."""
        assert self.focus is not None  # only called with a focus
        if first:
            return self.focus.warmup()
        margins = {
            name: stratum.margin
            for name, stratum in by_stratum.items()
            if stratum.decision == "inconclusive" and stratum.margin is not None
        }
        chosen = self.focus.next(margins)
        return chosen[1] if chosen is not None else []

    def _by_stratum(self, plan: Plan, paired: SequentialValues, ids: Sequence[str]) -> dict[str, StratumOutcome]:
        """Each stratum's rules on its own cases, in the order asked, at the gate's level shared out
        over the strata (Bonferroni), looked at after every batch."""
        assert self.focus is not None  # only called with a focus
        names = sorted(self.focus.units)
        level = (1.0 - plan.config.gates.confidence) / max(1, len(names))
        gates = plan.config.gates.model_copy(update={"confidence": 1.0 - level})
        of = np.array([self.strata.get(case_id, "") for case_id in ids])
        found: dict[str, StratumOutcome] = {}
        for name in names:
            mine = of == name
            counted = np.cumsum(mine)
            looks = np.unique(counted[paired.looks - 1])
            looks = looks[looks > 0]
            size = sum(len(unit) for unit in self.focus.units[name])
            if not looks.size:
                found[name] = StratumOutcome(name, 0, size, "inconclusive", [], None)
                continue
            values = SequentialValues(
                {metric: column[mine] for metric, column in paired.baseline.items()},
                {metric: column[mine] for metric, column in paired.candidate.items()},
                paired.specs,
                paired.unanswerable[mine],
                looks,
                size,
            )
            rules = sequential_rules(gates, values)
            found[name] = StratumOutcome(
                name, int(mine.sum()), size, decision_of(rules), rules, failing_margin(rules, paired.specs)
            )
        return found


@dataclass
class StratumOutcome:
    """One stratum of a focused sequential run: its cases asked and its rules, decided on its own
    cases at the gate's level over the strata."""

    stratum: str
    evaluated: int
    total: int
    decision: str
    rules: list[RuleResult]
    margin: float | None
    """How near its sequences are to failing a rule (:func:`failing_margin`; None: no open rule):
    the open stratum with the smallest is asked next."""

    def to_json(self) -> dict[str, Any]:
        return {
            "stratum": self.stratum,
            "evaluated": self.evaluated,
            "total": self.total,
            "decision": self.decision,
            "rules": [rule_json(r) for r in self.rules],
        }


def rule_json(r: RuleResult) -> dict[str, Any]:
    """A rule's sequential decision and bounds as ``--json`` gives them (the rule's own outcome
    where it has no sequence)."""
    return {
        "metric": r.metric,
        "rule": r.rule,
        "threshold": r.threshold,
        "decision": r.sequential.decision if r.sequential else r.outcome,
        "low": r.sequential.low if r.sequential else None,
        "high": r.sequential.high if r.sequential else None,
        "pairs": r.sequential.pairs if r.sequential else None,
    }


def failing_margin(rules: Sequence[RuleResult], specs: Mapping[str, MetricSpec | None]) -> float | None:
    """How near the stratum is to failing: over its open rules, the smallest share of a rule's
    anytime-valid interval still on the passing side of its threshold (:func:`passing_share`)."""
    margins = []
    for r in rules:
        bound, threshold = r.sequential, r.threshold
        if bound is None or bound.decision != "inconclusive" or threshold is None:
            continue
        spec = specs.get(r.metric)
        if r.rule == "max_drop":
            lower_is_better = spec is not None and spec.direction == "lower"
            line = threshold if lower_is_better else -threshold
            margins.append(passing_share(bound.low, bound.high, line, fails_above=lower_is_better))
        else:
            margins.append(passing_share(bound.low, bound.high, threshold, fails_above=r.rule == "max"))
    return min(margins) if margins else None


def strata_decision(strata: Mapping[str, StratumOutcome]) -> str:
    """``failed`` once a stratum failed, ``passed`` when every stratum passed, else ``inconclusive``."""
    decisions = [stratum.decision for stratum in strata.values()]
    if "failed" in decisions:
        return "failed"
    return "passed" if decisions and all(d == "passed" for d in decisions) else "inconclusive"


def _state(rules: Sequence[RuleResult]) -> str:
    counts = {"passed": 0, "failed": 0, "inconclusive": 0}
    for r in rules:
        counts[r.sequential.decision if r.sequential else "inconclusive"] += 1
    return f"{counts['failed']} rules failed, {counts['passed']} passed, {counts['inconclusive']} open"


def _strata_state(strata: Mapping[str, StratumOutcome]) -> str:
    counts = {"passed": 0, "failed": 0, "inconclusive": 0}
    for stratum in strata.values():
        counts[stratum.decision] += 1
    return f"{counts['failed']} strata failed, {counts['passed']} passed, {counts['inconclusive']} open"


@dataclass(frozen=True)
class SequentialEvaluation:
    """A finished ``run --until-decided``: the run, and where and why it stopped."""

    evaluation: Evaluation
    sequential: SequentialOutcome


def run_until_decided(
    overrides: Sequence[str],
    *,
    baseline: str | None,
    resume: str | None = None,
    retry_errors: bool = False,
    allow_draft: bool = False,
    tracking_uri: str | None = None,
) -> SequentialEvaluation:
    """``ragexp run --baseline RUN --until-decided``: plan as ``run`` does, check the baseline and
    the gate, then evaluate batch by batch until the gate is decided; ``resume`` continues a
    sequential run that was stopped (same order, same batches, same baseline)."""
    if retry_errors and not resume:
        raise ConfigError("--retry-errors goes with --resume RUN_ID")
    config = compose(list(overrides))
    uri = chosen_uri(tracking_uri, overrides, config.tracking.uri)
    store = Store(uri, timeout_s=config.tracking.timeout_s)
    register_url(store.uri)
    with Phase("loading and checking the dataset, the system and the judge", enabled=config.progress):
        plan = plan_run(config, store.state_dir(), store=store)
    if not allow_draft:
        refuse_unscreened(plan.dataset)
    check_decidable(plan)
    total = len(plan.dataset.cases)
    if resume is not None:
        record = store.get_run(resume)
        if not record.tag("sequential.total"):
            raise ConfigError(f"run {resume} is not a run of --until-decided: resume it without --until-decided")
        baseline_id = record.tag("sequential.baseline")
        if baseline is not None:
            chosen = resolve_baseline(store, parse_selector(baseline), candidate=None).run_id
            if chosen != baseline_id:
                raise ConfigError(f"run {resume} is decided against baseline {baseline_id}, not {chosen}")
        batch, seed = int(record.tag("sequential.batch")), int(record.tag("sequential.seed"))
    else:
        if baseline is None:
            raise ConfigError("--until-decided needs --baseline RUN: the run its gate compares with")
        selection = resolve_baseline(store, parse_selector(baseline), candidate=None)
        if selection.asked:
            info(selection.how)
        baseline_id = selection.run_id
        batch, seed = batch_size(config.sequential.batch, total), config.sequential.seed
    base = load_run(store, baseline_id)
    check_baseline(plan, base)
    tags = _sequential_tags(plan, total, batch, seed, baseline_id)
    if unscreened(plan.dataset):
        tags[DRAFT_TAG] = "true"
    batches = _batches(plan, seed, base, batch, store)
    outcome = execute(plan, store, resume=resume, retry_errors=retry_errors, tags=tags, evaluate=batches)
    if batches.outcome is None:  # pragma: no cover - execute returns only after evaluating
        raise RuntimeError("the sequential evaluation did not run")
    return SequentialEvaluation(Evaluation(plan, outcome), batches.outcome)


def execute_until_decided(
    plan: Plan, store: Store, baseline_id: str, *, tags: dict[str, str] | None = None
) -> SequentialEvaluation:
    """A planned run evaluated batch by batch against ``baseline_id`` until its gate is decided
    (``ragexp shadow --until-decided``: the candidate against production's replay, on one sample)."""
    check_decidable(plan)
    base = load_run(store, baseline_id)
    check_baseline(plan, base)
    total = len(plan.dataset.cases)
    config = plan.config
    batch, seed = batch_size(config.sequential.batch, total), config.sequential.seed
    own = _sequential_tags(plan, total, batch, seed, baseline_id)
    batches = _batches(plan, seed, base, batch, store)
    outcome = execute(plan, store, tags={**(tags or {}), **own}, evaluate=batches)
    if batches.outcome is None:  # pragma: no cover - execute returns only after evaluating
        raise RuntimeError("the sequential evaluation did not run")
    return SequentialEvaluation(Evaluation(plan, outcome), batches.outcome)


def _sequential_tags(plan: Plan, total: int, batch: int, seed: int, baseline_id: str) -> dict[str, str]:
    """The tags a sequential run starts with (``evaluated`` grows as batches are scored)."""
    return {
        PREFIX + "total": str(total),
        PREFIX + "batch": str(batch),
        PREFIX + "seed": str(seed),
        PREFIX + "baseline": baseline_id,
        PREFIX + "evaluated": "0",
        PREFIX + "gates": limits.fit(limits.TAG_VALUE, plan.config.gates.name),
    }


def _batches(plan: Plan, seed: int, baseline: RunData, batch: int, store: Store) -> Batches:
    """How a sequential run asks its cases: traffic in the focused order (a warm-up of every
    stratum, then batches to the stratum nearest to a regression, decided by stratum), a dataset
    file in a seeded random order, a conversation at a time."""
    if plan.traffic is not None:
        focus = focused_order(plan.traffic, seed, batch)
        return Batches(baseline, [], batch, store, focus=focus, strata=plan.traffic.strata)
    return Batches(baseline, evaluation_order(plan.dataset.cases, seed), batch, store)
