"""``ragexp gate --promote``: the candidate that passed becomes the baseline a tag selects.

The tag (``role=production``) moves within the candidate's experiment: onto the candidate, off
every other run. The move is a compare-and-swap against the runs that held the tag when the gate
started, under a lock kept in the tracking store (see :meth:`Store.swap_tag`), so of two
pipelines promoting at once exactly one wins; the other is told who holds the tag now.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from ragexp.errors import ConfigError, PromotionConflict, TrackingError
from ragexp.tracking import limits
from ragexp.tracking.store import TAG_PREFIX, RunRecord, Store, tag_filter

PROMOTION_READS = 3
"""How often ``gate --promote`` reads its baseline and the tag's holders again when another
pipeline moved the tag between the two reads, before that race is an error."""


@dataclass(frozen=True)
class PromotionTag:
    key: str
    value: str

    def __str__(self) -> str:
        return f"{self.key}={self.value}"


def parse_tag(text: str, option: str) -> PromotionTag:
    key, sep, value = text.partition("=")
    if not sep or not key.strip() or not value:
        raise ConfigError(f"{option} {text!r}: expected KEY=VALUE, e.g. role=production")
    limits.check(limits.TAG_KEY, key, f"{option} (the tag's name)")
    limits.check(limits.TAG_VALUE, value, f"{option} (the tag's value)")
    tag_filter(key, value)
    return PromotionTag(key, value)


def holders(store: Store, tag: PromotionTag, experiment_id: str) -> list[str]:
    """Runs of the experiment carrying the tag now, whatever their status."""
    return [r.run_id for r in store.iter_runs([experiment_id], tag_filter(tag.key, tag.value))]


@dataclass(frozen=True)
class Promotion:
    tag: str
    promoted: bool
    previous: list[str]
    """Runs the tag was on when the gate started (promoted) or is on now (lost the race)."""
    message: str
    warnings: tuple[str, ...] = ()
    """What the promotion left undone without changing its outcome (its lock, its record tags)."""

    def to_json(self) -> dict[str, object]:
        found: dict[str, object] = {
            "tag": self.tag,
            "promoted": self.promoted,
            "previous": self.previous,
            "message": self.message,
        }
        if self.warnings:
            found["warnings"] = list(self.warnings)
        return found


def promote(store: Store, tag: PromotionTag, candidate: RunRecord, expected: list[str]) -> Promotion:
    """Move the tag onto ``candidate`` if it is still on exactly ``expected``.

    Once the tag has moved (or the race is lost), the outcome stands: a failure to record it on
    the run or to remove the lock becomes one of its ``warnings``."""
    try:
        swap = store.swap_tag(tag.key, tag.value, candidate.run_id, candidate.experiment_id, expected=expected)
    except PromotionConflict as exc:
        now = ", ".join(exc.holders) or "no run"
        return Promotion(
            str(tag),
            False,
            exc.holders,
            f"not promoted: tag {tag} moved to {now} while this gate ran (another pipeline promoted first); "
            f"gate {candidate.run_id} again against the new baseline",
            (exc.warning,) if exc.warning else (),
        )
    taken_from = swap.taken_from
    warnings = [swap.warning] if swap.warning else []
    try:
        store.set_tags(
            candidate.run_id,
            {
                TAG_PREFIX + "promoted": str(tag),
                TAG_PREFIX + "promoted.from": ",".join(taken_from) or "none",
                TAG_PREFIX + "promoted.at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            },
        )
    except TrackingError as exc:
        warnings.append(f"the promotion is not recorded on run {candidate.run_id} ({exc})")
    source = f"from {', '.join(taken_from)}" if taken_from else "(no run held it before)"
    return Promotion(
        str(tag), True, taken_from, f"promoted: tag {tag} moved to {candidate.run_id} {source}", tuple(warnings)
    )
