"""Which runs a comparison is between: baseline selectors and the default candidate.

``--baseline`` takes a run id, ``tag:KEY=VALUE`` (the newest finished run carrying that tag; with
a candidate, the newest comparable one in the candidate's experiment, else in any experiment) or
``latest:EXPERIMENT`` (the newest finished run of that experiment). Without ``--candidate`` the
candidate is the newest finished run created after the baseline in its experiment that is
comparable with it. Every choice is explained in one line, and nothing falls back silently: a
selector that matches no run, or several runs that cannot be compared with one another, is an
error.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import islice

from ragexp.errors import ConfigError, RagexpError, TrackingError
from ragexp.metrics.judge.identity import served_difference
from ragexp.tracking.store import FINISHED, RunRecord, Store, tag_filter

IDENTITY = [
    ("dataset_hash", "dataset content hash"),
    ("k", "K"),
    ("metrics", "metric set"),
    ("judge", "judge identity"),
]
"""Run tags that must agree for two runs' scores to be comparable (case ids follow the dataset hash)."""

FINISHED_FILTER = f"attributes.status = '{FINISHED}'"


@dataclass(frozen=True)
class Selection:
    """A run chosen for a comparison, and why."""

    record: RunRecord
    how: str
    """One line for the user: what was asked and which run it resolved to."""
    asked: str = ""
    """The selector that chose it (``tag:role=production``), ``default`` for the default
    candidate, empty for a run named by its id."""

    @property
    def run_id(self) -> str:
        return self.record.run_id


@dataclass(frozen=True)
class Selector:
    """A parsed ``--baseline`` value."""

    kind: str
    """``run``, ``tag`` or ``latest``."""
    text: str
    key: str = ""
    value: str = ""

    @property
    def tag(self) -> tuple[str, str] | None:
        return (self.key, self.value) if self.kind == "tag" else None


def parse_selector(text: str) -> Selector:
    """``RUN_ID``, ``tag:KEY=VALUE`` or ``latest:EXPERIMENT``; anything malformed is a ConfigError."""
    if text.startswith("tag:"):
        key, sep, value = text[4:].partition("=")
        if not sep or not key.strip() or not value:
            raise ConfigError(f"--baseline {text!r}: expected tag:KEY=VALUE, e.g. tag:role=production")
        tag_filter(key, value)  # refuses what an MLflow filter cannot hold
        return Selector("tag", text, key, value)
    if text.startswith("latest:"):
        experiment = text[7:]
        if not experiment:
            raise ConfigError(f"--baseline {text!r}: expected latest:EXPERIMENT, e.g. latest:ragexp")
        return Selector("latest", text, value=experiment)
    if not text or any(ch in text for ch in "=: /"):
        raise ConfigError(f"--baseline {text!r}: expected a run id, tag:KEY=VALUE or latest:EXPERIMENT")
    return Selector("run", text)


def identity_differences(baseline: RunRecord, candidate: RunRecord, *, same_cases: bool = False) -> list[str]:
    """What makes two runs' scores incomparable, judged from their tags, worded for the user;
    ``same_cases``: the runs are restricted to cases whose content both versions share
    (``--common-cases``), so their dataset hashes are not compared."""
    found = []
    # Human scores describe each run's own outputs, so runs whose cases and labels match but whose
    # human scores differ are comparable (their paired difference is what PPI corrects): compare
    # the hash without human scores where both runs have it.
    both = bool(baseline.tag("cases_hash") and candidate.tag("cases_hash"))
    for tag, what in IDENTITY:
        if tag == "dataset_hash" and same_cases:
            continue
        compared = "cases_hash" if tag == "dataset_hash" and both else tag
        if baseline.tag(compared) != candidate.tag(compared):
            # Named by the hash each run printed (ragexp.dataset_hash), never by the one compared.
            aside = ", human scores aside" if compared != tag else ""
            found.append(f"{what} differs ({short(baseline.tag(tag))} vs {short(candidate.tag(tag))}{aside})")
    served = served_difference(baseline.tag("judge.served"), candidate.tag("judge.served"))
    if served is not None:
        found.append(served)
    return found


def short(value: str) -> str:
    return value[:12] if len(value) == 64 else value or "none"


def describe(record: RunRecord) -> str:
    started = datetime.fromtimestamp(record.start_time / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    name = f" '{record.name}'" if record.name else ""
    return f"run {record.run_id}{name} (started {started}, config {short(record.tag('config_hash'))})"


def resolve_baseline(store: Store, selector: Selector, *, candidate: RunRecord | None) -> Selection:
    """The run a ``--baseline`` value names. With a known candidate, selectors pick the newest
    matching run comparable with it (and never the candidate itself)."""
    if selector.kind == "run":
        record = store.get_run(selector.text)
        return Selection(record, f"baseline: {describe(record)}")
    if selector.kind == "tag":
        scope = [candidate.experiment_id] if candidate is not None else store.experiment_ids()
        where = "in the candidate's experiment" if candidate is not None else "in any experiment"
        matches = store.iter_runs(scope, f"{tag_filter(selector.key, selector.value)} and {FINISHED_FILTER}")
    else:
        experiment_id = store.experiment_id(selector.value, create=False)
        if experiment_id is None:
            raise TrackingError(f"--baseline {selector.text}: no experiment named '{selector.value}' in {store.uri}")
        where = f"in experiment '{selector.value}'"
        matches = store.iter_runs([experiment_id], FINISHED_FILTER)
    runs = _ragexp_runs(matches, exclude=candidate.run_id if candidate is not None else None)
    if candidate is not None and selector.kind == "tag":
        return _tagged_comparable(store, selector, candidate, runs)
    if candidate is not None:
        return _newest_comparable(runs, candidate, role="baseline", asked=selector.text, where=where)
    if selector.kind == "latest":
        newest = next(runs, None)
        if newest is None:
            raise TrackingError(f"--baseline {selector.text}: no finished ragexp run {where}")
        return Selection(newest, f"baseline: {selector.text} -> {describe(newest)}", selector.text)
    return _only_comparable(list(runs), selector.text, where)


def _tagged_comparable(
    store: Store, selector: Selector, candidate: RunRecord, in_experiment: Iterator[RunRecord]
) -> Selection:
    """``tag:`` with a candidate: the newest comparable tagged run in the candidate's experiment,
    else in any experiment (a production baseline often lives in an experiment of its own)."""
    try:
        return _newest_comparable(
            in_experiment, candidate, role="baseline", asked=selector.text, where="in the candidate's experiment"
        )
    except TrackingError as first:
        query = f"{tag_filter(selector.key, selector.value)} and {FINISHED_FILTER}"
        others = [e for e in store.experiment_ids() if e != candidate.experiment_id]
        elsewhere = _ragexp_runs(store.iter_runs(others, query), exclude=candidate.run_id) if others else iter(())
        try:
            return _newest_comparable(
                elsewhere, candidate, role="baseline", asked=selector.text, where="in any other experiment"
            )
        except TrackingError as second:
            raise TrackingError(f"{first}; {str(second).split(': ', 1)[1]}") from None


def choose_candidate(store: Store, baseline: RunRecord) -> Selection:
    """The newest finished run created after the baseline in its experiment that is comparable with it."""
    experiment = store.experiment_name(baseline.experiment_id)
    after = f"{FINISHED_FILTER} and attributes.start_time > {baseline.start_time}"
    runs = _ragexp_runs(store.iter_runs([baseline.experiment_id], after), exclude=baseline.run_id)
    where = f"created after the baseline in experiment '{experiment}'"
    return _newest_comparable(runs, baseline, role="candidate", asked="", where=where)


LOOKED_AT = 50
"""How many earlier runs :func:`previous_comparable` reads before giving up (a hint, not a search)."""


def previous_comparable(store: Store, run: RunRecord) -> RunRecord | None:
    """The newest finished run created before ``run`` in its experiment, comparable with it and of
    another config: the baseline a run just made as a candidate is most likely compared with (the
    ``next:`` lines after ``ragexp run``); None when there is none."""
    before = f"{FINISHED_FILTER} and attributes.start_time < {run.start_time}"
    own = run.tag("config_hash")
    newest = islice(store.iter_runs([run.experiment_id], before, page_size=LOOKED_AT), LOOKED_AT)
    for record in _ragexp_runs(newest, exclude=run.run_id):
        if record.tag("config_hash") != own and not identity_differences(record, run):
            return record
    return None


def previous_run_id(tracking_uri: str, run_id: str) -> str | None:
    """:func:`previous_comparable` of a run just logged, by id; None also when the store cannot say
    (a hint is never worth failing a finished run over)."""
    try:
        store = Store(tracking_uri, must_exist=True)
        found = previous_comparable(store, store.get_run(run_id))
    except RagexpError:
        return None
    return found.run_id if found is not None else None


def _ragexp_runs(records: Iterable[RunRecord], *, exclude: str | None) -> Iterator[RunRecord]:
    """Runs logged by ``ragexp run`` (not sweep parents, not foreign runs, not the swapped cells of
    ``diff --attribute``, which replay a subset of the cases), other than ``exclude``."""
    return (r for r in records if r.tag("config_hash") and not r.tag("attribution.of") and r.run_id != exclude)


def _newest_comparable(
    runs: Iterator[RunRecord], reference: RunRecord, *, role: str, asked: str, where: str
) -> Selection:
    """The first of ``runs`` (newest first) comparable with ``reference``; ``role`` is what is being chosen."""
    who = f"--baseline {asked}" if asked else role
    skipped: list[tuple[RunRecord, list[str]]] = []
    for record in runs:
        pair = (record, reference) if role == "baseline" else (reference, record)
        found = identity_differences(*pair)
        if not found:
            note = ""
            if skipped:
                first, why = skipped[0]
                note = f"; skipped {len(skipped)} newer run(s) not comparable ({first.run_id}: {'; '.join(why)})"
            resolved = f"{asked} -> " if asked else ""
            return Selection(
                record,
                f"{role}: {resolved}{describe(record)}, the newest finished run {where} comparable with "
                f"{reference.run_id}{note}",
                asked or "default",
            )
        skipped.append((record, found))
    if not skipped:
        hint = " (nothing to gate; give --candidate)" if role == "candidate" else ""
        raise TrackingError(f"{who}: no finished ragexp run {where}{hint}")
    newest, found = skipped[0]
    raise TrackingError(
        f"{who}: none of the {len(skipped)} finished run(s) {where} is comparable with {reference.run_id} "
        f"(newest {newest.run_id}: {'; '.join(found)})"
    )


def _only_comparable(runs: list[RunRecord], asked: str, where: str) -> Selection:
    """Without a candidate, a tag may name several runs only if they can all be compared with one another."""
    if not runs:
        raise TrackingError(f"--baseline {asked}: no finished ragexp run carries that tag {where}")
    newest = runs[0]
    for other in runs[1:]:
        found = identity_differences(other, newest)
        if found:
            raise TrackingError(
                f"--baseline {asked}: {len(runs)} finished runs carry that tag {where} and they are not comparable "
                f"with one another ({other.run_id} vs {newest.run_id}: {'; '.join(found)}); give --candidate to "
                "pick the one comparable with it"
            )
    note = f" (the newest of {len(runs)} comparable runs with that tag)" if len(runs) > 1 else ""
    return Selection(newest, f"baseline: {asked} -> {describe(newest)}{note}", asked)
