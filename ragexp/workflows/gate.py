"""``ragexp gate``: the release workflow (:func:`run_gate`): choose the runs, check the gates, tag the
verdict, move the ``--promote`` tag, record the comparison, write the JUnit and summary files."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ragexp import artifacts
from ragexp.compare.bridge import apply_to_gate as bridged_gate
from ragexp.compare.bridge import bridge_judge as bridge_judge_runs
from ragexp.compare.comparisons import Say, not_the_baseline, record_comparison, silent
from ragexp.compare.data import load_run
from ragexp.compare.diff import DiffResult
from ragexp.compare.gate import GateResult, check_gate, gate_runs
from ragexp.compare.junit import junit_xml
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
from ragexp.compare.summary import SUMMARY_CASES, Links, gate_summary, ledger_line
from ragexp.compare.versions import on_versions
from ragexp.config.compose import compose
from ragexp.config.tracking import chosen_uri
from ragexp.errors import ConfigError, PromotionConflict, TrackingError
from ragexp.outputs import check_writable, write_file
from ragexp.phrases import user_language
from ragexp.tracking.store import TAG_PREFIX, RunRecord, Store


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
    say: Say = silent,
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
