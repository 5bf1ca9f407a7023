"""``ragexp sweep --confirm``: the point chosen on part of the cases is run again, as it was
configured, on the cases held out of the choice, and that confirm run is gated against the
baseline like any candidate (:func:`ragexp.workflows.diff.run_gate`).

A conversation is held out whole (its turns are asked in order, each after the ones before it),
so the cases a winner is chosen on and those it is confirmed on never share a conversation.

Run again with the same sweep, winner and held-out cases, ``--confirm`` takes the confirm run it
made before as ``run --resume`` would: a finished one is gated as it is (no case asked again), an
unfinished one (interrupted, stopped) is resumed, asking only the cases it lacks; only when there
is none is a new confirm run started."""

from __future__ import annotations

from collections.abc import Callable

import yaml

from ragexp import artifacts
from ragexp.compare.data import RunData
from ragexp.compare.sweeps import Confirmation, SweepAnalysis, hold_out
from ragexp.config.models import RagexpConfig
from ragexp.errors import ConfigError
from ragexp.tracking.store import FINISHED, TAG_PREFIX, RunRecord, Store, tag_filter
from ragexp.workflows.gate import run_gate

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
    from ragexp.workflows.run import execute
    from ragexp.workflows.run_plan import plan_run

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
    plan = plan_run(config, store.state_dir())
    earlier = earlier_confirm(store, config.experiment, analysis.parent, winner.run_id, plan.config_hash)
    if earlier is not None and earlier.status == FINISHED:
        say(f"confirming {winner.label}: run {earlier.run_id} ran it on these held-out cases before: gated as it is")
        run_id = earlier.run_id
    else:
        resume = earlier.run_id if earlier is not None else None
        if resume is not None:
            how = earlier.tag("status") or earlier.status.lower()  # type: ignore[union-attr]  # resume: earlier is set
            say(f"confirming {winner.label}: continuing run {resume} ({how}), as run --resume does")
        else:
            say(f"confirming {winner.label} on the {len(confirmation.held_out)} held-out cases")
        run_id = execute(
            plan,
            Store(store.uri, timeout_s=config.tracking.timeout_s),
            resume=resume,
            parent=analysis.parent,
            tags={CONFIRM_TAG: analysis.parent, CONFIRM_OF_TAG: winner.run_id},
        ).run_id
    gated = run_gate(
        baseline.run_id,
        overrides=_gate_overrides(store.get_run(winner.run_id).tag("sweep.point")),
        candidate=run_id,
        tracking_uri=store.uri,
        allow_incomparable=True,  # the two differ in what the sweep varied; the cases are the held-out ones
    )
    confirmation.run_id, confirmation.gate = run_id, gated.result
    return confirmation


def held_out(run: RunData, fraction: float, seed: int) -> tuple[list[str], list[str]]:
    """(the cases a winner is chosen on, the held-out cases), each in ``run``'s order: a seeded
    ``fraction`` of the units held out (:func:`ragexp.compare.sweeps.hold_out`), a conversation
    being one unit with all its turns, a single question one of its own."""
    if run.conversations is None:
        return hold_out(run.case_ids, fraction, seed)
    units = [
        conversation if conversation is not None else case_id
        for case_id, conversation in zip(run.case_ids, run.conversations, strict=True)
    ]
    _, held_units = hold_out(list(dict.fromkeys(units)), fraction, seed)
    held = set(held_units)
    return (
        [case_id for case_id, unit in zip(run.case_ids, units, strict=True) if unit not in held],
        [case_id for case_id, unit in zip(run.case_ids, units, strict=True) if unit in held],
    )


def earlier_confirm(store: Store, experiment: str, parent: str, winner: str, config_hash: str) -> RunRecord | None:
    """The confirm run an earlier ``--confirm`` of this sweep made for the same winner on the
    same held-out cases (the same config hash): a finished one first, else the newest unfinished."""
    tags = ((CONFIRM_TAG, parent), (CONFIRM_OF_TAG, winner), (TAG_PREFIX + "config_hash", config_hash))
    clause = " and ".join(tag_filter(key, value) for key, value in tags)
    found = store.search(experiment, limit=100, filter_string=clause)  # newest first
    return next((run for run in found if run.status == FINISHED), found[0] if found else None)


def _gate_overrides(label: str) -> list[str]:
    """The overrides of the point's gates, from its ``ragexp.sweep.point`` (the point's overrides
    as given): ``run_gate`` composes the same gates from them."""
    return [item for item in label.split() if item.lstrip("+~").split("=", 1)[0].split(".")[0].split("/")[0] == "gates"]
