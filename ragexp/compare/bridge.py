"""``diff``/``gate --bridge-judge``: compare two runs whose judges differ, on one footing.

- ``rejudge``: the baseline's stored outputs (``cases.jsonl``) are graded again by the candidate's
  judge, rebuilt from the candidate's recorded config: judge calls only, never a system call, and
  through the judge cache (a second bridge of the same pair costs no call). The comparison is then
  of one judge's grades; the judge must still be served as the candidate's run recorded.
- ``canaries``: each run's judge scores are corrected by its own error on the canaries both runs
  graded (the same ``judge.canaries`` file): :func:`ragexp.metrics.canaries.bridged_delta` gives
  each judge metric's corrected delta and its interval, which the gate's change rules then use.

Either way the runs' judge identities are the only difference set aside: any other (dataset, K,
metrics, cases) still makes the pair incomparable.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from ragexp import artifacts
from ragexp.compare.data import RunData
from ragexp.compare.gate import EPSILON, GateResult, RuleResult
from ragexp.compare.select import identity_differences
from ragexp.config.compose import validate
from ragexp.config.models import RagexpConfig
from ragexp.errors import ConfigError, RagexpError
from ragexp.metrics.canaries import BridgedDelta, bridged_delta
from ragexp.metrics.judge import identity
from ragexp.records import Case, CaseResult, SystemOutput
from ragexp.tracking.store import TAG_PREFIX, Store

BRIDGES = ("rejudge", "canaries")
JUDGE_TAGS = ("judge", "judge.served")


@dataclass
class Bridge:
    """What a bridge did: its JSON is the ``bridge`` key of ``diff --json`` and ``gate --json``."""

    method: str
    metrics: dict[str, BridgedDelta] = field(default_factory=dict)
    """``canaries``: each judge metric's corrected comparison."""
    rejudged: int = 0
    """``rejudge``: grades the candidate's judge made of the baseline's outputs (cache hits too)."""
    calls: int = 0
    """``rejudge``: judge calls it took (chat and embeddings)."""
    cache_hits: int = 0
    served: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        found: dict[str, Any] = {"method": self.method}
        if self.method == "canaries":
            found["metrics"] = [{"name": name, **delta.to_json()} for name, delta in self.metrics.items()]
        else:
            found.update(rejudged=self.rejudged, judge_calls=self.calls, cache_hits=self.cache_hits, served=self.served)
        return found

    def lines(self) -> list[str]:
        """What the terminal shows of it."""
        if self.method == "rejudge":
            return [
                f"judge bridged (rejudge): the baseline's outputs graded by the candidate's judge, {self.rejudged} "
                f"grades ({self.calls} judge calls, {self.cache_hits} from the cache)"
            ]
        return [
            f"judge bridged (canaries): {name} delta {d.delta:+.4f} [{d.ci_low:+.4f}, {d.ci_high:+.4f}] "
            f"(raw {d.raw:+.4f}, canary correction {d.correction:+.4f}; {d.n} cases, {d.canaries} canaries)"
            for name, d in self.metrics.items()
        ]


def judge_metrics(baseline: RunData, candidate: RunData) -> list[str]:
    """The judge metrics both runs scored."""
    found = []
    for name in candidate.metrics:
        spec = candidate.spec(name)
        if spec is not None and spec.judge and name in baseline.metrics:
            found.append(name)
    return found


def bridge_judge(
    store: Store, baseline: RunData, candidate: RunData, method: str, *, confidence: float
) -> tuple[RunData, Bridge]:
    """The baseline to compare (rejudged, or with the candidate's judge tags) and what was done."""
    if method not in BRIDGES:
        raise ConfigError(f"--bridge-judge {method!r}: expected one of {', '.join(BRIDGES)}")
    if method == "rejudge":
        baseline, bridge = _rejudge(store, baseline, candidate)
    else:
        bridge = _canaries(store, baseline, candidate, confidence)
    tags = dict(baseline.record.tags)
    for name in JUDGE_TAGS:
        tags[TAG_PREFIX + name] = candidate.record.tag(name)
    record = dataclasses.replace(baseline.record, tags=tags)
    return dataclasses.replace(baseline, record=record), bridge


def _canary_grades(store: Store, run: RunData, role: str) -> dict[str, Any]:
    try:
        found = orjson.loads(store.read_artifact(run.run_id, artifacts.CANARIES))
    except RagexpError:
        raise ConfigError(
            f"--bridge-judge canaries: the {role} run {run.run_id} graded no canaries (set judge.canaries)"
        ) from None
    if not isinstance(found, dict):
        raise ConfigError(
            f"--bridge-judge canaries: the {role} run {run.run_id}'s {artifacts.CANARIES} is not an object"
        )
    return found


def _column(values: list[float | None]) -> np.ndarray:
    return np.array([np.nan if v is None else v for v in values], dtype=np.float64)


def _canaries(store: Store, baseline: RunData, candidate: RunData, confidence: float) -> Bridge:
    base, cand = _canary_grades(store, baseline, "baseline"), _canary_grades(store, candidate, "candidate")
    if base.get("digest") != cand.get("digest") or base.get("ids") != cand.get("ids"):
        raise ConfigError(
            "--bridge-judge canaries: the runs graded different canary files "
            f"({str(base.get('digest'))[:12]} vs {str(cand.get('digest'))[:12]}): "
            "the correction needs the same canaries"
        )
    shared = [case_id for case_id in baseline.case_ids if case_id in set(candidate.case_ids)]
    b, c = baseline.select(shared), candidate.select(shared)
    bridge = Bridge("canaries")
    for name in judge_metrics(baseline, candidate):
        if name not in base.get("judge", {}) or name not in cand.get("judge", {}):
            raise ConfigError(f"--bridge-judge canaries: the canaries carry no human score for {name}")
        human = _column(cand["human"][name])
        delta = bridged_delta(
            b.scores[name],
            c.scores[name],
            _column(base["judge"][name]),
            _column(cand["judge"][name]),
            human,
            confidence=confidence,
        )
        if delta is None:
            raise ConfigError(f"--bridge-judge canaries: {name}: under 2 cases or canaries graded by both judges")
        bridge.metrics[name] = delta
    return bridge


def _recorded_config(store: Store, run: RunData) -> RagexpConfig:
    """The candidate's recorded config, validated: its judge is the one to grade with."""
    import yaml

    try:
        raw = yaml.safe_load(store.read_artifact(run.run_id, artifacts.CONFIG))
    except RagexpError as exc:
        raise ConfigError(
            f"--bridge-judge rejudge: the candidate run {run.run_id} has no readable config.yaml ({exc})"
        ) from None
    if not isinstance(raw, dict):
        raise ConfigError(f"--bridge-judge rejudge: the candidate run {run.run_id}'s config.yaml is not a mapping")
    return validate(raw)


def _rejudge(store: Store, baseline: RunData, candidate: RunData) -> tuple[RunData, Bridge]:
    from ragexp.conversations import histories
    from ragexp.datasets.loader import load_dataset, resolve_path
    from ragexp.metrics.judge.scorer import JudgeScorer
    from ragexp.paths import data_roots

    config = _recorded_config(store, candidate)
    if config.provider.judge is None:
        raise ConfigError(f"--bridge-judge rejudge: the candidate run {candidate.run_id} has no judge")
    names = judge_metrics(baseline, candidate)
    specs = [spec for spec in (candidate.spec(name) for name in names) if spec is not None]
    scorer = JudgeScorer(config.provider.judge, specs, store.state_dir(), warn=lambda _: None)
    scorer.preflight()
    if scorer.identity != candidate.record.tag("judge"):
        raise ConfigError(
            "--bridge-judge rejudge: the candidate's judge cannot be rebuilt as it ran "
            f"({scorer.identity} now, {candidate.record.tag('judge')} recorded)"
        )
    dataset = load_dataset(resolve_path(config.dataset.path, data_roots()), config.dataset.format)
    known = {case.id: case for case in dataset.cases}
    cases: list[Case] = []
    results: list[CaseResult] = []
    for position, case_id in enumerate(baseline.case_ids):
        row = baseline.row(position)
        output = row.get("output") or {}
        case = known.get(case_id) or Case(case_id, str(row.get("question", "")), [], [], None, False, 0)
        cases.append(case)
        if row.get("error") or not isinstance(output, dict):
            results.append(CaseResult(case_id, None, error=str(row.get("error") or "no output")))
        else:
            answer, contexts = str(output.get("answer") or ""), list(output.get("contexts") or [])
            results.append(CaseResult(case_id, SystemOutput(contexts=contexts, answer=answer)))
    # A turn is graded after the conversation so far, as the baseline's own judge read it: the
    # earlier turns' questions and the baseline's answers (or references, by conversation.history).
    asked_after = histories(cases, results, config.conversation.history) if dataset.has_conversations else None
    outcome = scorer.score(cases, results, progress=None, histories=asked_after)
    served = identity.joined(outcome.served)
    recorded = candidate.record.tag("judge.served")
    if recorded and served and identity.served_difference(served, recorded) is not None:
        raise ConfigError(
            f"--bridge-judge rejudge: the candidate's judge is now served as {served}, not as {recorded} "
            "when the candidate ran: its grades would not be the candidate's judge's"
        )
    scores = dict(baseline.scores)
    for name in names:
        scores[name] = outcome.scores[name]
    usage = outcome.usage
    bridge = Bridge(
        "rejudge",
        rejudged=int(sum(np.isfinite(outcome.scores[name]).sum() for name in names)),
        calls=usage.chat_calls + usage.embedding_calls,
        cache_hits=outcome.cache_hits,
        served=sorted(s for s in outcome.served if s),
    )
    return dataclasses.replace(baseline, scores=scores), bridge


def apply_to_gate(result: GateResult, bridge: Bridge, directions: dict[str, str]) -> GateResult:
    """The gate's ``max_drop`` rules on judge metrics, decided on the canary-bridged delta (the
    raw delta mixes the two judges' difference into the systems')."""
    if bridge.method != "canaries":
        return result
    rules: list[RuleResult] = []
    for rule in result.rules:
        delta = bridge.metrics.get(rule.metric)
        if delta is None or rule.rule != "max_drop" or rule.threshold is None:
            rules.append(rule)
            continue
        higher = directions.get(rule.metric, "higher") == "higher"
        worse_by = -delta.delta if higher else delta.delta
        worst = -delta.ci_low if higher else delta.ci_high
        failed = worse_by > rule.threshold + EPSILON
        interval = f"[{delta.ci_low:+.4f}, {delta.ci_high:+.4f}]"
        message = (
            f"{rule.metric}: bridged by the canaries, delta {delta.delta:+.4f} {interval} (raw {delta.raw:+.4f}), "
            f"{'worse by ' + format(worse_by, '.4f') if worse_by > 0 else 'no worse'} (allowed drop {rule.threshold:g}"
            f"{', the interval reaches ' + format(worst, '.4f') if worst > rule.threshold else ''})"
        )
        rules.append(
            dataclasses.replace(
                rule, message=message, outcome="failed" if failed else "passed", method="bridged: canaries"
            )
        )
    return dataclasses.replace(result, rules=rules)


def same_judge_otherwise(baseline: RunData, candidate: RunData) -> list[str]:
    """The differences of two runs other than their judge's (what a bridge does not set aside)."""
    return [d for d in identity_differences(baseline.record, candidate.record) if not d.startswith("judge ")]
