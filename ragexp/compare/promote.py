"""``ragexp gate --promote``: the candidate that passed becomes the baseline a tag selects.

The tag (``role=production``) moves within the candidate's experiment: onto the candidate, off
every other run. The move is a compare-and-swap against the runs that held the tag when the gate
started, under a lock kept in the tracking store (:func:`swap_tag`), so of two pipelines
promoting at once exactly one wins; the other is told who holds the tag now.
"""

from __future__ import annotations

import hashlib
import os
import socket
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass

from ragexp import limits
from ragexp.errors import ConfigError, PromotionConflict, StorageError, TrackingError
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
        swap = swap_tag(store, tag, candidate.run_id, candidate.experiment_id, expected=expected)
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


LOCK_PREFIX = "ragexp.promotion-lock."
"""Registered models named so are promotion locks (:func:`swap_tag`)."""
LOCK_NONCE = "ragexp.lock.nonce"
RELEASE_ATTEMPTS = 5


@dataclass(frozen=True)
class Swap:
    """What :func:`swap_tag` did."""

    taken_from: list[str]
    """Runs the tag was taken from."""
    warning: str | None = None
    """Why the lock is left behind (None: removed)."""


LOCK_WAIT_S = 60.0
"""How long a promotion waits for another one's lock."""


def swap_tag(store: Store, tag: PromotionTag, run_id: str, experiment_id: str, *, expected: Iterable[str]) -> Swap:
    """Put ``tag`` on ``run_id`` and take it off every other run of the experiment, as
    one step: under a lock kept in the store itself, and only if the runs holding the tag are
    still exactly ``expected`` (compare-and-swap). Returns the runs it was taken from (and a
    warning if the lock could not be removed).

    MLflow has no transactions over tags; the lock is a registered model
    (:meth:`Store.create_lock`), deleted when the swap ends, so two processes cannot both be
    inside, and the second one in finds the tag moved and loses. Every call survives a lost
    reply (MLflow's client sends a request again when the connection closes before the answer):
    the lock carries a nonce of this process, so a creation answered "exists" is recognised as its
    own; a tag or lock already gone counts as removed. An unlock that fails is a warning on the
    result, never an error over its outcome."""
    scope = hashlib.sha256(f"{experiment_id}\0{tag.key}\0{tag.value}".encode()).hexdigest()[:24]
    lock = _Lock(store, f"{LOCK_PREFIX}{scope}", run_id, str(tag))
    lock.acquire(LOCK_WAIT_S)
    try:
        found = holders(store, tag, experiment_id)
        if set(found) != set(expected):
            raise PromotionConflict(f"tag {tag} is now on {_runs(found)}, not on {_runs(expected)}", found)
        # The new holder first: a reader in between sees two holders, never none.
        store.set_tags(run_id, {tag.key: tag.value})
        for other in found:
            if other != run_id:
                store.delete_tags(other, [tag.key])
    except PromotionConflict as exc:
        exc.warning = lock.release()
        raise
    except BaseException:
        lock.release()
        raise
    return Swap([other for other in found if other != run_id], lock.release())


class _Held(Exception):
    """The promotion lock is another process's (``run``: the run holding it, when known)."""

    def __init__(self, run: str) -> None:
        super().__init__(run)
        self.run = run


class _Lock:
    """A registered model as a lock, tagged with a nonce of the process that holds it."""

    def __init__(self, store: Store, name: str, holder: str, what: str) -> None:
        self.store, self.name, self.holder, self.what = store, name, holder, what
        self.nonce = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex}"

    def acquire(self, wait_s: float) -> None:
        from ragexp.transport import retry_within  # imports httpx: only when a promotion runs

        try:
            # Polled at a steady short pause (cap = base): the holder may let go at any moment.
            retry_within(self._take, timeout_s=wait_s, base=0.2, cap=0.2, again=lambda exc: isinstance(exc, _Held))
        except _Held as held:
            by = f" by run {held.run}" if held.run else ""
            raise TrackingError(
                f"another promotion of {self.what} has held its lock{by} for over {wait_s:g} s (registered "
                f"model '{self.name}'); if that pipeline is gone, delete the registered model and promote again"
            ) from None

    def _take(self) -> None:
        """Create the lock; raises _Held while another process holds it."""
        tags = {"ragexp.lock.holder": self.holder, LOCK_NONCE: self.nonce}
        description = f"ragexp: promotion of {self.what} in progress (deleted when it ends)"
        failure: TrackingError | StorageError | None = None
        try:
            if self.store.create_lock(self.name, {**tags, "ragexp.lock.since": str(int(time.time()))}, description):
                return
        except (TrackingError, StorageError) as exc:
            failure = exc
        owner = self._owner()
        if owner is not None and owner[0] == self.nonce:
            return  # this process created it: the reply was lost and MLflow's retry found it
        if owner is None and failure is not None:
            raise type(failure)(f"locking {self.what}: {failure}") from None
        raise _Held(owner[1] if owner is not None else "")

    def release(self) -> str | None:
        """Delete the lock, retried within ``tracking.timeout_s``; a lock that is gone (a retried
        delete whose first reply was lost) or that is not this process's counts as deleted.
        Returns None, or a warning naming what is left."""
        from ragexp.transport import retry_within

        try:
            retry_within(
                self._delete,
                timeout_s=self.store.timeout_s,
                base=0.5,
                again=lambda exc: isinstance(exc, (TrackingError, StorageError)),
                attempts=RELEASE_ATTEMPTS,
            )
        except (TrackingError, StorageError) as exc:
            return (
                f"the promotion lock (registered model '{self.name}') could not be removed ({exc}); delete it "
                f"if no promotion of {self.what} is running, or the next one waits for it"
            )
        return None

    def _delete(self) -> None:
        """Delete the lock; a lock that is gone or another's counts as deleted."""
        try:
            self.store.delete_lock(self.name)
            return
        except (TrackingError, StorageError) as exc:
            failed = exc
        owner = self._owner()  # a failure here is the one reported
        if owner is not None and owner[0] == self.nonce:
            raise failed

    def _owner(self) -> tuple[str, str] | None:
        """(nonce, run) of the lock that exists now; None when there is none."""
        tags = self.store.lock_tags(self.name)
        if tags is None:
            return None
        return tags.get(LOCK_NONCE, ""), tags.get("ragexp.lock.holder", "")


def _runs(ids: Iterable[str]) -> str:
    listed = sorted(ids)
    return ", ".join(listed) if listed else "no run"
