"""``ragexp report``: build a run's report, write it to a folder and log it to the run."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ragexp.compare.data import load_run
from ragexp.compare.shadow_pair import PAIR_TAG
from ragexp.errors import ConfigError, TrackingError
from ragexp.phrases import user_language
from ragexp.report.build import PAIR_CONFIDENCE, build_report, write_report
from ragexp.tracking.store import Store


@dataclass(frozen=True)
class Published:
    folder: Path
    """Where report.md, report.html and the plots are."""
    used: str
    """What the report compares (as :func:`build_report` words it)."""
    not_logged: str | None = None
    """Why the report is not logged to its run (a read-only copy of a store); None: it is."""


def publish_report(
    run_id: str,
    *,
    baseline: str | None = None,
    out: str | None = None,
    language: str | None = None,
    tracking_uri: str | None = None,
    allow_incomparable: bool = False,
    say: Callable[[str], None] = lambda line: None,
    attribute: bool = False,
    common_cases: bool = False,
    bridge_judge: str | None = None,
) -> Published:
    """Write the report to ``out`` (default ``reports/RUN_ID``) and log it to the run under ``report/``;
    ``attribute`` adds the pair's attribution by replay (the one ``diff --attribute`` recorded, else
    measured now); ``bridge_judge`` compares runs judged differently (``--bridge-judge``)."""
    if bridge_judge is not None and baseline is None:
        raise ConfigError("--bridge-judge bridges a comparison: add --baseline RUN_ID")
    language = user_language(language)
    found = None
    if attribute:
        if baseline is None:
            raise ConfigError("--attribute splits a comparison: add --baseline RUN_ID")
        from ragexp.workflows.diff import attribution_of

        found = attribution_of(
            Store(tracking_uri, must_exist=True), baseline, run_id, resamples=10_000, confidence=0.95, seed=0, say=say
        )
    store = Store(tracking_uri, must_exist=True)
    strata = None
    if baseline is not None and store.get_run(run_id).tags.get(PAIR_TAG) == baseline:
        from ragexp.workflows.shadow import pair_strata

        base, run = load_run(store, baseline), load_run(store, run_id)
        strata = pair_strata(store, base, run, confidence=PAIR_CONFIDENCE, resamples=10_000, seed=0)
    built, used = build_report(
        store,
        run_id,
        baseline,
        language,
        allow_incomparable,
        found,
        common_cases,
        strata=strata,
        bridge_judge=bridge_judge,
    )
    folder = Path(out) if out else Path("reports") / run_id
    written = write_report(built, folder)
    files = {f"report/{path.relative_to(folder)}": path.read_bytes() for path in written}
    try:
        store.log_files(run_id, files)
    except TrackingError as exc:  # a read-only copy of a store: the report is on disk all the same
        return Published(folder, used, str(exc))
    return Published(folder, used)


def publish_sweep_report(
    parent: str,
    *,
    baseline: str | None = None,
    out: str | None = None,
    language: str | None = None,
    tracking_uri: str | None = None,
    say: Callable[[str], None] = lambda line: None,
) -> Published:
    """``report --sweep PARENT``: the sweep's analysis (:func:`ragexp.workflows.sweep.sweep_analysis`,
    logged under ``sweep/``) as a report, written to ``out`` (default ``reports/PARENT``) and
    logged to the parent run under ``report/``."""
    from ragexp.workflows.sweep import sweep_analysis, sweep_language, sweep_report

    language = user_language(language)
    analysis = sweep_analysis(parent, tracking_uri=tracking_uri, baseline=baseline, say=say)
    store = Store(tracking_uri, must_exist=True)
    built = sweep_report(analysis, sweep_language(store, analysis, language))
    folder = Path(out) if out else Path("reports") / parent
    written = write_report(built, folder)
    files = {f"report/{path.relative_to(folder)}": path.read_bytes() for path in written}
    used = f"sweep of {len(analysis.points)} points against {analysis.baseline.label}"
    try:
        store.log_files(parent, files)
    except TrackingError as exc:
        return Published(folder, used, str(exc))
    return Published(folder, used)
