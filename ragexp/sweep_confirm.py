"""``ragexp sweep --confirm``: the point chosen on part of the cases is run again, as it was
configured, on the cases held out of the choice, and that confirm run is gated against the
baseline like any candidate (:func:`ragexp.compare.release.run_gate`)."""

from __future__ import annotations

from collections.abc import Callable

import yaml

from ragexp import artifacts
from ragexp.compare.release import run_gate
from ragexp.compare.sweeps import Confirmation, SweepAnalysis
from ragexp.config.models import RagexpConfig
from ragexp.errors import ConfigError
from ragexp.tracking.store import TAG_PREFIX, Store

CONFIRM_TAG = TAG_PREFIX + "sweep.confirm"
"""On a confirm run: the sweep (its parent run) whose winner it confirms."""
CONFIRM_OF_TAG = TAG_PREFIX + "sweep.confirm_of"
"""On a confirm run: the point it runs again."""


def confirm_winner(
    analysis: SweepAnalysis,
    confirmation: Confirmation,
    store: Store,
    *,
    say: Callable[[str], None] = lambda _: None,
) -> Confirmation:
    """Run the recommended point's config on ``confirmation.held_out`` and gate it against the
    baseline on those cases (the rules of the point's own ``gates``)."""
    from ragexp.runner import execute, plan_run

    winner, baseline = analysis.recommendation.winner, analysis.baseline
    if winner.run_id == baseline.run_id:
        confirmation.skipped = "the winner is the baseline: there is nothing to confirm against it"
        return confirmation
    data = yaml.safe_load(store.read_artifact(winner.run_id, artifacts.CONFIG)) or {}
    try:
        config = RagexpConfig.model_validate(data)
    except ValueError as exc:
        raise ConfigError(f"--confirm: the config of run {winner.run_id} cannot be run again: {exc}") from None
    dataset = config.dataset.model_copy(update={"case_ids": list(confirmation.held_out)})
    config = config.model_copy(update={"dataset": dataset, "run_name": None, "tracking": config.tracking})
    say(f"confirming {winner.label} on the {len(confirmation.held_out)} held-out cases")
    outcome = execute(
        plan_run(config, store.state_dir()),
        Store(store.uri, timeout_s=config.tracking.timeout_s),
        parent=analysis.parent,
        tags={CONFIRM_TAG: analysis.parent, CONFIRM_OF_TAG: winner.run_id},
    )
    gated = run_gate(
        baseline.run_id,
        overrides=_gate_overrides(store.get_run(winner.run_id).tag("sweep.point")),
        candidate=outcome.run_id,
        tracking_uri=store.uri,
        allow_incomparable=True,  # the two differ in what the sweep varied; the cases are the held-out ones
    )
    confirmation.run_id, confirmation.gate = outcome.run_id, gated.result
    return confirmation


def _gate_overrides(label: str) -> list[str]:
    """The overrides of the point's gates, from its ``ragexp.sweep.point`` (the point's overrides
    as given): ``run_gate`` composes the same gates from them."""
    return [item for item in label.split() if item.lstrip("+~").split("=", 1)[0].split(".")[0].split("/")[0] == "gates"]
