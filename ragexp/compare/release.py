"""The comparisons the CLI runs, whole: ``ragexp diff`` (:func:`compare_runs`), the release
workflow of ``ragexp gate`` (:func:`run_gate`) and what a baseline lets a comparison detect
(``ragexp power``, :func:`baseline_power`).

Each takes the options as the user gave them and does, in order: check every output file and
option before any work; choose the runs (each choice explained through ``say``); compare; record
the result on the candidate run; write the files asked for. Rendering is the caller's.

``say`` receives the lines a user should see while this happens (which run a selector chose, a
result that could not be recorded); they are plain text, not yet escaped for any output.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from ragexp import artifacts, strict_json
from ragexp.compare.agreement import changes as agreement_changes
from ragexp.compare.agreement import line as agreement_line
from ragexp.compare.bridge import apply_to_gate as bridged_gate
from ragexp.compare.bridge import bridge_judge as bridge_judge_runs
from ragexp.compare.data import RunData, load_run
from ragexp.compare.diff import DiffResult, compute_diff
from ragexp.compare.gate import GateResult, check_gate, gate_runs
from ragexp.compare.junit import junit_xml
from ragexp.compare.power import POWER, POWER_ASSUMPTION, Plan, baseline_plan, check_effect
from ragexp.compare.promote import PROMOTION_READS, Promotion, PromotionTag, holders, parse_tag
from ragexp.compare.promote import promote as move_tag
from ragexp.compare.select import (
    Selection,
    Selector,
    choose_candidate,
    describe,
    parse_selector,
    resolve_baseline,
)
from ragexp.compare.summary import SUMMARY_CASES, Links, diff_summary, gate_summary, ledger_line
from ragexp.compare.versions import on_versions
from ragexp.config.compose import compose
from ragexp.config.tracking import chosen_uri
from ragexp.errors import ConfigError, PromotionConflict, TrackingError, UnknownRunError
from ragexp.outputs import check_writable, write_file
from ragexp.phrases import user_language
from ragexp.secrets import mask_url
from ragexp.tracking.store import TAG_PREFIX, RunRecord, Store

Say = Callable[[str], None]


def _silent(line: str) -> None:
    pass


@dataclass(frozen=True)
class DiffOutcome:
    """What ``ragexp diff`` compared and found."""

    result: DiffResult
    """The comparison, its cases cut to ``top``."""
    baseline: RunData
    candidate: RunData


@dataclass(frozen=True)
class GateOutcome:
    """What ``ragexp gate`` decided and did."""

    result: GateResult
    diff: DiffResult
    baseline: str
    candidate: str
    selected: tuple[str, str]
    """How the baseline and the candidate were chosen, one line each (:attr:`Selection.how`)."""
    tag: PromotionTag | None
    """The tag ``--promote`` moves (None without ``--promote``)."""
    promotion: Promotion | None
    """The move of that tag (None when there was none to make: no ``--promote``, or a failed gate)."""

    def to_json(self) -> dict[str, Any]:
        return {
            **self.result.to_json(),
            "selection": {"baseline": self.selected[0], "candidate": self.selected[1]},
            **({"ledger": self.diff.ledger.summary_json()} if self.diff.ledger is not None else {}),
            **({"promotion": self.promotion.to_json()} if self.promotion else {}),
            **({"bridge": self.diff.bridge} if self.diff.bridge is not None else {}),
        }


def not_the_baseline(candidate: str, baseline: str) -> None:
    """Refuse to compare a run with itself, whichever way the two were chosen."""
    if candidate == baseline:
        raise ConfigError(f"the candidate {candidate} is the baseline itself: there is nothing to compare")


def record_comparison(
    store: Store, candidate: str, baseline: str, name: str, payload: dict[str, Any], say: Say = _silent
) -> None:
    """Keep every comparison on the candidate run, as ``comparisons/<baseline>/<name>`` (the
    ``ragexp.gate.*`` tags only hold the latest verdict)."""
    data = strict_json.dumps(payload, indent=1).encode("utf-8")
    try:
        store.log_files(candidate, {artifacts.comparison(baseline, name): data})
    except TrackingError as exc:  # a read-only copy of a store: the result stands, unrecorded
        say(f"warning: the comparison is not recorded on run {candidate}: {exc}")


def read_comparison(store: Store, candidate: str, baseline: str, name: str) -> dict[str, Any] | None:
    """The comparison :func:`record_comparison` kept on ``candidate`` (None: none was recorded)."""
    path = artifacts.comparison(baseline, name)
    if path not in store.list_artifacts(candidate, artifacts.comparison(baseline)):
        return None
    found = json.loads(store.read_artifact(candidate, path))
    return found if isinstance(found, dict) else None


def _both_known(store: Store, selector: Any, baseline: str, candidate: str) -> RunRecord:
    """The candidate's record; when it is unknown and the baseline is a run id, both are checked,
    so one line names every unknown run."""
    try:
        return store.get_run(candidate)
    except UnknownRunError:
        if selector.kind != "run":
            raise
        try:
            store.get_run(baseline)
        except UnknownRunError:
            raise TrackingError(
                f"unknown runs '{baseline}' (baseline) and '{candidate}' (candidate) in tracking store "
                f"{mask_url(store.uri)}"
            ) from None
        raise


def compare_runs(
    baseline: str,
    candidate: str,
    *,
    top: int = 10,
    tracking_uri: str | None = None,
    allow_incomparable: bool = False,
    resamples: int = 10_000,
    confidence: float = 0.95,
    seed: int = 0,
    summary: str | None = None,
    language: str | None = None,
    ui_url: str | None = None,
    say: Say = _silent,
    attribute: bool = False,
    common_cases: bool = False,
    bridge_judge: str | None = None,
) -> DiffOutcome:
    """``ragexp diff``: per-metric and per-case comparison of ``candidate`` with ``baseline`` (a run
    id or a selector), recorded on the candidate; ``summary`` is a Markdown file to write;
    ``attribute`` replays the swapped cells (:mod:`ragexp.attribution`), refused before any work
    when either system cannot answer from given contexts."""
    summary_path = check_writable("--summary", summary)
    language = user_language(language)
    selector = parse_selector(baseline)
    store = Store(tracking_uri, must_exist=True)
    given = _both_known(store, selector, baseline, candidate)
    chosen = resolve_baseline(store, selector, candidate=given)
    if chosen.asked:
        say(chosen.how)
    not_the_baseline(given.run_id, chosen.run_id)
    base, cand = load_run(store, chosen.record), load_run(store, given)
    base, cand, ledger = on_versions(
        store, base, cand, common_cases=common_cases, allow_incomparable=allow_incomparable
    )
    bridge = None
    if bridge_judge is not None:
        base, bridge = bridge_judge_runs(store, base, cand, bridge_judge, confidence=confidence)
        for line in bridge.lines():
            say(line)
    configs = None
    if attribute:
        from ragexp.attribution import check_can_generate

        writer = Store(tracking_uri, must_exist=True)
        configs = check_can_generate(writer, base, cand)
    result = compute_diff(
        base,
        cand,
        resamples=resamples,
        confidence=confidence,
        seed=seed,
        # The summary lists the five most regressed cases whatever --top shows.
        top=max(top, SUMMARY_CASES) if summary_path else top,
        allow_incomparable=allow_incomparable,
        ledger=ledger,
    )
    if bridge is not None:
        result.bridge = bridge.to_json()
    for row in agreement_changes(base, cand):
        say(agreement_line(row))
    if summary_path:
        text = diff_summary(
            result,
            language=language or cand.record.params.get("report.language") or "zh",
            links=Links.for_store(store.uri, ui_url),
            chosen=[chosen.asked],
        )
        write_file("--summary", summary_path, text.encode("utf-8"))
    result.cases = result.cases[:top]
    if configs is not None:
        from ragexp.attribution import ARTIFACT
        from ragexp.attribution import attribute as attribute_runs

        found = attribute_runs(
            writer, base, cand, configs, resamples=resamples, confidence=confidence, seed=seed, say=say
        )
        result.attribution = found.to_json()
        record_comparison(writer, cand.run_id, base.run_id, ARTIFACT, result.attribution, say)
    record_comparison(store, cand.run_id, base.run_id, artifacts.DIFF, result.to_json(), say)
    return DiffOutcome(result, base, cand)


def attribution_of(
    store: Store, baseline: str, candidate: str, *, resamples: int, confidence: float, seed: int, say: Say = _silent
) -> dict[str, Any]:
    """The pair's attribution by replay as ``diff --attribute`` recorded it on the candidate; else
    measured now and recorded (refused first when either system cannot answer from given contexts)."""
    from ragexp.attribution import ARTIFACT, attribute, check_can_generate

    kept = read_comparison(store, candidate, baseline, ARTIFACT)
    if kept is not None:
        return kept
    base, cand = load_run(store, baseline), load_run(store, candidate)
    configs = check_can_generate(store, base, cand)
    found = attribute(store, base, cand, configs, resamples=resamples, confidence=confidence, seed=seed, say=say)
    payload = found.to_json()
    record_comparison(store, candidate, baseline, ARTIFACT, payload, say)
    return payload


def promotion_tag(promote: bool, promote_tag: str | None, selector_tag: tuple[str, str] | None) -> PromotionTag | None:
    """The tag ``--promote`` moves, checked before any work (None without ``--promote``)."""
    if promote_tag is not None and not promote:
        raise ConfigError("--promote-tag only says which tag --promote moves; add --promote")
    if not promote:
        return None
    if promote_tag is not None:
        return parse_tag(promote_tag, "--promote-tag")
    if selector_tag is None:
        raise ConfigError("--promote needs a tag to move: --baseline tag:KEY=VALUE, or --promote-tag KEY=VALUE")
    key, value = selector_tag
    return parse_tag(f"{key}={value}", "--baseline tag:KEY=VALUE")


def choose_runs(store: Store, selector: Selector, given: RunRecord | None) -> tuple[Selection, Selection]:
    """Baseline and candidate of a gate, each explained in one line (:attr:`Selection.how`)."""
    base = resolve_baseline(store, selector, candidate=given)
    cand = choose_candidate(store, base.record) if given is None else Selection(given, f"candidate: {describe(given)}")
    not_the_baseline(cand.run_id, base.run_id)
    return base, cand


def _choose_under_tag(
    store: Store, selector: Selector, given: RunRecord | None, tag: PromotionTag | None
) -> tuple[tuple[Selection, Selection], list[str]]:
    """The runs to gate, and the runs holding the tag ``--promote`` moves (its compare-and-swap's
    expectation). A baseline chosen by that tag can lose it to another pipeline between the two
    reads: then the baseline is chosen again, from the run the tag is on now."""
    for _ in range(PROMOTION_READS):
        chosen = choose_runs(store, selector, given)
        base, cand = chosen[0].record, chosen[1].record
        expected = holders(store, tag, cand.experiment_id) if tag else []
        raced = tag is not None and selector.tag == (tag.key, tag.value)
        if not (raced and expected and expected != [base.run_id]):
            break
    if tag and expected and expected != [base.run_id]:
        raise PromotionConflict(
            f"--promote: tag {tag} is on {', '.join(expected)}, not on the baseline {base.run_id}; a candidate "
            f"is promoted only over the run holding the tag (--baseline tag:{tag})",
            expected,
        )
    return chosen, expected


def run_gate(
    baseline: str,
    *,
    overrides: Sequence[str] = (),
    candidate: str | None = None,
    tracking_uri: str | None = None,
    allow_incomparable: bool = False,
    junit: str | None = None,
    summary: str | None = None,
    language: str | None = None,
    ui_url: str | None = None,
    promote: bool = False,
    promote_tag: str | None = None,
    say: Say = _silent,
    common_cases: bool = False,
    bridge_judge: str | None = None,
) -> GateOutcome:
    """``ragexp gate``: check the candidate against the baseline with the composed config's gates,
    tag the verdict on the candidate, move the ``--promote`` tag if it passed, record the
    comparison, write ``junit`` and ``summary``. A failed gate is an outcome, not an error."""
    started = time.perf_counter()
    junit_path, summary_path = check_writable("--junit", junit), check_writable("--summary", summary)
    language = user_language(language)
    selector = parse_selector(baseline)
    tag = promotion_tag(promote, promote_tag, selector.tag)
    config = compose(list(overrides))
    gates = config.gates
    check_gate(gates)
    store = Store(chosen_uri(tracking_uri, overrides, config.tracking.uri), must_exist=True)
    given = store.get_run(candidate) if candidate else None
    chosen, expected = _choose_under_tag(store, selector, given, tag)
    # Whatever was chosen (not named by id) is said once the runs and the tag's holders are
    # known: nothing the gate compares against can change under it after these lines.
    for selection in chosen:
        if selection.asked:
            say(selection.how)
    base_selection, cand_selection = chosen
    base, cand = load_run(store, base_selection.record), load_run(store, cand_selection.record)
    base, cand, ledger = on_versions(
        store, base, cand, common_cases=common_cases, allow_incomparable=allow_incomparable
    )
    bridge = None
    if bridge_judge is not None:
        base, bridge = bridge_judge_runs(store, base, cand, bridge_judge, confidence=gates.confidence)
        for line in bridge.lines():
            say(line)
    diff, result = gate_runs(
        gates,
        base,
        cand,
        allow_incomparable=allow_incomparable,
        top=SUMMARY_CASES if summary_path else 0,
        ledger=ledger,
    )
    if bridge is not None:
        diff.bridge = bridge.to_json()
        result = bridged_gate(result, bridge, {m.name: m.spec.direction for m in diff.metrics if m.spec})
    try:
        store.set_tags(
            cand.run_id,
            {
                TAG_PREFIX + "gate.verdict": "passed" if result.passed else "failed",
                TAG_PREFIX + "gate.baseline": base.run_id,
                TAG_PREFIX + "gate.gates": gates.name,
                TAG_PREFIX + "gate.failures": ",".join(sorted({f.metric for f in result.failures})) or "none",
            },
        )
    except TrackingError as exc:  # a read-only copy of a store: the verdict stands, unrecorded
        say(f"warning: the verdict is not recorded on run {cand.run_id}: {exc}")
    promotion = move_tag(store, tag, cand_selection.record, expected) if tag and result.passed else None
    how = (base_selection.how, cand_selection.how)
    if junit_path:
        extra = {"baseline.selected": how[0], "candidate.selected": how[1]}
        if ledger is not None:
            extra["dataset.ledger"] = ledger_line(ledger, "en")
        write_file("--junit", junit_path, junit_xml(result, diff, seconds=time.perf_counter() - started, extra=extra))
    if summary_path:
        text = gate_summary(
            result,
            diff,
            language=language or config.report.language,
            links=Links.for_store(store.uri, ui_url),
            chosen=[base_selection.asked, cand_selection.asked],
            notes=[promotion.message] if promotion else [],
        )
        write_file("--summary", summary_path, text.encode("utf-8"))
    record_comparison(
        store,
        cand.run_id,
        base.run_id,
        artifacts.GATE,
        {
            "verdict": "passed" if result.passed else "failed",
            **result.to_json(),
            "checked": result.checked,
            "config": {
                "gates": gates.name,
                "rules": {name: rule.model_dump(exclude_none=True) for name, rule in gates.rules.items()},
                "max_error_rate": gates.max_error_rate,
                "confidence": gates.confidence,
            },
            "compared_although_incomparable": list(diff.differences),
            **({"ledger": ledger.summary_json()} if ledger is not None else {}),
            **({"bridge": diff.bridge} if diff.bridge is not None else {}),
        },
        say,
    )
    return GateOutcome(result, diff, base.run_id, cand.run_id, how, tag, promotion)


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
    say: Say = _silent,
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
