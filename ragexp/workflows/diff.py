"""``ragexp diff`` (:func:`compare_runs`): check every output file and option before any work;
choose the runs (each choice explained through ``say``); compare; record the result on the
candidate run; write the files asked for. Rendering is the caller's. ``ragexp gate`` and
``ragexp power`` have modules of their own (:mod:`ragexp.workflows.gate`,
:mod:`ragexp.workflows.power`).

``say`` receives the lines a user should see while this happens (which run a selector chose, a
result that could not be recorded); they are plain text, not yet escaped for any output.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ragexp import artifacts
from ragexp.compare.agreement import changes as agreement_changes
from ragexp.compare.agreement import line as agreement_line
from ragexp.compare.bridge import bridge_judge as bridge_judge_runs
from ragexp.compare.comparisons import Say, not_the_baseline, read_comparison, record_comparison, silent
from ragexp.compare.data import RunData, load_run
from ragexp.compare.diff import DiffResult, compute_diff
from ragexp.compare.select import (
    parse_selector,
    resolve_baseline,
)
from ragexp.compare.shadow_pair import is_pair
from ragexp.compare.summary import SUMMARY_CASES, Links, diff_summary
from ragexp.compare.versions import on_versions
from ragexp.errors import TrackingError, UnknownRunError
from ragexp.outputs import check_writable, write_file
from ragexp.phrases import user_language
from ragexp.secrets import mask_url
from ragexp.tracking.store import RunRecord, Store


@dataclass(frozen=True)
class DiffOutcome:
    """What ``ragexp diff`` compared and found."""

    result: DiffResult
    """The comparison, its cases cut to ``top``."""
    baseline: RunData
    candidate: RunData


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
    say: Say = silent,
    attribute: bool = False,
    common_cases: bool = False,
    bridge_judge: str | None = None,
) -> DiffOutcome:
    """``ragexp diff``: per-metric and per-case comparison of ``candidate`` with ``baseline`` (a run
    id or a selector), recorded on the candidate; ``summary`` is a Markdown file to write;
    ``attribute`` replays the swapped cells (:mod:`ragexp.workflows.attribution`), refused before any work
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
        from ragexp.workflows.attribution import check_can_generate

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
    if is_pair(base, cand):
        from ragexp.workflows.shadow import pair_strata

        result.strata = pair_strata(store, base, cand, confidence=confidence, resamples=resamples, seed=seed)
    for row in agreement_changes(base, cand, confidence=confidence):
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
        from ragexp.workflows.attribution import ARTIFACT
        from ragexp.workflows.attribution import attribute as attribute_runs

        found = attribute_runs(
            writer, base, cand, configs, resamples=resamples, confidence=confidence, seed=seed, say=say
        )
        result.attribution = found.to_json()
        record_comparison(writer, cand.run_id, base.run_id, ARTIFACT, result.attribution, say)
    record_comparison(store, cand.run_id, base.run_id, artifacts.DIFF, result.to_json(), say)
    return DiffOutcome(result, base, cand)


def attribution_of(
    store: Store, baseline: str, candidate: str, *, resamples: int, confidence: float, seed: int, say: Say = silent
) -> dict[str, Any]:
    """The pair's attribution by replay as ``diff --attribute`` recorded it on the candidate; else
    measured now and recorded (refused first when either system cannot answer from given contexts)."""
    from ragexp.workflows.attribution import ARTIFACT, attribute, check_can_generate

    kept = read_comparison(store, candidate, baseline, ARTIFACT)
    if kept is not None:
        return kept
    base, cand = load_run(store, baseline), load_run(store, candidate)
    configs = check_can_generate(store, base, cand)
    found = attribute(store, base, cand, configs, resamples=resamples, confidence=confidence, seed=seed, say=say)
    payload = found.to_json()
    record_comparison(store, candidate, baseline, ARTIFACT, payload, say)
    return payload
