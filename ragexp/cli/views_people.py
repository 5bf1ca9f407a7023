"""What the commands people work through print: ``label`` (its queue), ``calibrate`` and ``draft``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from ragexp.cli.render import fmt, table, terminal, trust_lines
from ragexp.secrets import mask_url

if TYPE_CHECKING:
    from ragexp.draft.review import Accepted
    from ragexp.workflows.calibrate import Calibrated
    from ragexp.workflows.draft import DraftedSet, InReview
    from ragexp.workflows.label import Queued


def print_queue_link(url_of: Callable[[str | None], str | None], base: str | None, store_uri: str) -> None:
    """Where to open a review queue: its link on a known UI, else how to start one on this store."""
    url = url_of(base)
    if url:
        print(f"open: {url}")
    else:
        print(
            f"open: start the MLflow UI on this store (mlflow ui --backend-store-uri {mask_url(store_uri)}), then "
            f"{url_of('http://127.0.0.1:5000')}"
        )


def show_label_queue(queued: Queued) -> None:
    made = queued.made
    print(
        f"review queue '{made.queue}' ({made.queue_id}): {len(made.traces)} of {made.cases} traces of run "
        f"{made.run_id}, {made.kept} already labelled"
    )
    print(f"questions: {', '.join(made.schemas)}" + (f" (created: {', '.join(made.created)})" if made.created else ""))
    print_queue_link(made.url, queued.base, queued.store_uri)
    print(f"then: ragexp calibrate {made.run_id}")


def show_calibration(calibrated: Calibrated) -> None:
    run_id, labels = calibrated.run_id, calibrated.labels
    labelled = ", ".join(f"{name} {n}" for name, n in labels.counts().items()) or "none"
    print(f"run {run_id}: labelled cases {labelled} ({labels.carried} carried over from identical outputs)")
    for c in calibrated.coverage:
        state = "calibrated" if c.enough else f"not calibrated: {c.needed - c.labelled} more needed"
        print(
            f"  {terminal(c.metric)}: {c.labelled} labelled, scored cases; calibration needs {c.needed} "
            f"(calibration.min_labelled): {state}"
        )
    for line in trust_lines(calibrated.trust, calibrated.threshold, None):
        print(line)
    if calibrated.disagreements:
        print(
            f"\npeople and the automatic score disagree on {len(calibrated.disagreements)} labelled cases "
            f"(pass at >= {calibrated.threshold:g}):"
        )
        rows = [[d.case_id, d.metric, fmt(d.human, 2), fmt(d.automatic, 2)] for d in calibrated.disagreements]
        print(table(["case", "metric", "human", "automatic"], rows, "llrr"))
    elif calibrated.coverage:
        print(f"\npeople and the automatic score agree on every labelled case (pass at >= {calibrated.threshold:g})")
    if not calibrated.logged:
        print("not calibrated: fewer labelled, scored cases than calibration.min_labelled for every metric")
    else:
        print(f"logged on run {run_id}: {len(calibrated.logged)} calibration.* and ppi.* metrics")


def show_drafted(drafted: DraftedSet) -> None:
    """What a draft kept and dropped, and (when it wrote the file) that people screen it next."""
    for line in drafted.summary.lines():
        print(line)
    if drafted.written:
        print(f"wrote {drafted.out}: screen it (set draft.status to 'screened', or drop the case) before it counts")


def show_draft_review(queued: InReview) -> None:
    made = queued.made
    print(
        f"review queue '{made.queue}' ({made.queue_id}): {made.traces} drafted cases of {queued.path}"
        + (f", {made.passed_through} already screened or not drafted left as they are" if made.passed_through else "")
    )
    print_queue_link(made.url, queued.base, queued.store_uri)
    print(f"then: ragexp draft accept '{made.queue}' --out screened.jsonl")


def show_accepted(out: Path, result: Accepted) -> None:
    print(
        f"{result.accepted} accepted, {len(result.rejected)} rejected (dropped), {result.pending} not reviewed yet; "
        f"wrote {len(result.cases)} cases to {out}"
    )
    if result.pending:
        print(
            f"the {result.pending} not reviewed stay draft.status 'draft' (ragexp run refuses them): review them "
            f"and run this again, or drop them from {out}"
        )
