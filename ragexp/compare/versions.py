"""Dataset versions: the case-level ledger of two versions (read by ``ragexp datasets diff``,
:mod:`ragexp.workflows.datasets`), and two runs of two versions compared on the cases both versions
hold unchanged (``--common-cases``).

A version is a dataset file, or a run: its ``cases.jsonl`` rows carry each case's content hashes
(:mod:`ragexp.datasets.ledger`). A run made before those hashes were recorded has them recomputed
from its dataset file when that file is still the version the run used (its dataset hash matches
the run's); otherwise the run has no ledger and ``--common-cases`` refuses it, saying why.
"""

from __future__ import annotations

from pathlib import Path

import orjson

from ragexp import artifacts
from ragexp.compare.data import RunData
from ragexp.compare.diff import differences
from ragexp.datasets.ledger import Ledger, case_hashes, compare, hashes_of_rows
from ragexp.datasets.loader import load_dataset, only_cases, resolve_path
from ragexp.errors import IncomparableRunsError, RagexpError
from ragexp.paths import data_roots, packaged_trees
from ragexp.tracking.store import Store

Hashes = dict[str, dict[str, str]]


def bundled_dataset(name: str) -> tuple[Path, str] | None:
    """The file and format of the bundled dataset option ``name`` (``kb_zh``), if there is one."""
    import yaml

    for tree in packaged_trees():
        option = tree / "dataset" / f"{name}.yaml"
        if option.is_file():
            group = yaml.safe_load(option.read_text(encoding="utf-8")) or {}
            return resolve_path(str(group.get("path", "")), data_roots()), str(group.get("format") or "auto")
    return None


def run_hashes(store: Store, data: RunData) -> Hashes:
    """The content hashes of the cases a run scored, by id in its order: from its ``cases.jsonl``,
    else from its dataset file while that is still the run's version; else refused, saying why."""
    lines = data.read_lines()
    found = hashes_of_rows(orjson.loads(line) for line in lines)
    if found is not None:
        return found
    stored = _from_dataset_file(store, data)
    if isinstance(stored, str):
        raise IncomparableRunsError(
            f"run {data.run_id} was made before ragexp recorded each case's content hash in cases.jsonl, "
            f"and {stored}: it has no case ledger (run it again to compare it on common cases)"
        )
    return stored


def _from_dataset_file(store: Store, data: RunData) -> Hashes | str:
    """The run's case hashes recomputed from its dataset file, or why they cannot be."""
    import yaml

    try:
        config = yaml.safe_load(store.read_artifact(data.run_id, artifacts.CONFIG))
        dataset = config["dataset"]
        path = resolve_path(str(dataset["path"]), data_roots())
    except (RagexpError, KeyError, TypeError, yaml.YAMLError):
        return "its config.yaml does not say which dataset file it read"
    try:
        loaded = load_dataset(path, str(dataset.get("format") or "auto"))
        if dataset.get("case_ids"):
            loaded = only_cases(loaded, list(dataset["case_ids"]))
    except RagexpError:
        return f"its dataset file {path} cannot be read any more"
    if loaded.dataset_hash != data.record.tag("dataset_hash"):
        return f"its dataset file {path} has changed since"
    hashes = case_hashes(loaded.cases)
    return {case_id: hashes[case_id] for case_id in data.case_ids if case_id in hashes}


def _versions_differ(baseline: RunData, candidate: RunData) -> bool:
    """The runs' dataset hashes differ (what identity compares: the hash without human scores
    where both runs have it)."""
    both = bool(baseline.record.tag("cases_hash") and candidate.record.tag("cases_hash"))
    tag = "cases_hash" if both else "dataset_hash"
    return baseline.record.tag(tag) != candidate.record.tag(tag)


def runs_ledger(store: Store, baseline: RunData, candidate: RunData) -> Ledger:
    """The ledger from the baseline's cases to the candidate's."""
    return compare(run_hashes(store, baseline), run_hashes(store, candidate))


def on_versions(
    store: Store, baseline: RunData, candidate: RunData, *, common_cases: bool, allow_incomparable: bool
) -> tuple[RunData, RunData, Ledger | None]:
    """Two runs ready to compare across dataset versions. Runs of one version come back as they
    are. Runs of two versions: with ``common_cases``, both restricted to the cases both versions
    hold unchanged, with the ledger; else refused (exit 3) naming the ledger's counts, unless
    ``allow_incomparable``."""
    if not _versions_differ(baseline, candidate):
        return baseline, candidate, None
    if not common_cases:
        if not allow_incomparable:
            _refuse(store, baseline, candidate)
        return baseline, candidate, None
    ledger = runs_ledger(store, baseline, candidate)
    if ledger.same:
        raise IncomparableRunsError(
            f"runs {baseline.run_id} and {candidate.run_id}: their dataset hashes differ but no case's content "
            "does (another dataset.match rule or labels outside the cases): --common-cases has nothing to set apart"
        )
    if not ledger.unchanged:
        raise IncomparableRunsError(
            f"runs {baseline.run_id} and {candidate.run_id} share no unchanged case ({ledger.words()}): "
            "nothing to compare"
        )
    ids = ledger.unchanged
    kept = set(ids)
    order = [case_id for case_id in baseline.case_ids if case_id in kept]
    return baseline.restrict(order), candidate.restrict(order), ledger


def _refuse(store: Store, baseline: RunData, candidate: RunData) -> None:
    found = differences(baseline, candidate)
    try:
        ledger: Ledger | None = runs_ledger(store, baseline, candidate)
    except IncomparableRunsError:
        ledger = None
    if ledger is None or ledger.same:
        hint = ""
    else:
        unchanged = len(ledger.unchanged)
        hint = f"; the dataset changed: {ledger.words()}; --common-cases compares the {unchanged} unchanged cases"
    raise IncomparableRunsError(
        f"runs {baseline.run_id} and {candidate.run_id} are not comparable: {'; '.join(found)}{hint} "
        "(--allow-incomparable to compare anyway)"
    )
