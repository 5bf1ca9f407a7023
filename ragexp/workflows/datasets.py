"""``ragexp datasets diff`` (:func:`datasets_diff`): what changed between two versions of a dataset."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ragexp.compare.data import load_run
from ragexp.compare.versions import Hashes, bundled_dataset, run_hashes
from ragexp.datasets.ledger import Ledger, case_hashes, compare
from ragexp.datasets.loader import load_dataset, resolve_path
from ragexp.errors import ConfigError, TrackingError
from ragexp.paths import data_roots
from ragexp.tracking.store import Store


@dataclass(frozen=True)
class VersionDiff:
    """``ragexp datasets diff OLD NEW``: what each side is and the ledger from one to the other."""

    old: str
    new: str
    """Each side as the user reads it: ``file PATH`` or ``run RUN_ID``."""
    ledger: Ledger

    def to_json(self) -> dict[str, Any]:
        return {"old": self.old, "new": self.new, **self.ledger.to_json()}


def datasets_diff(old: str, new: str, *, tracking_uri: str | None = None) -> VersionDiff:
    """The ledger from ``old`` to ``new``, each a dataset file, a bundled dataset's name
    (``kb_zh``) or a run id."""
    store: list[Store] = []

    def side(given: str, role: str) -> tuple[str, Hashes]:
        path = resolve_path(given, data_roots())
        if path.is_file():
            return f"file {path}", case_hashes(load_dataset(path).cases)
        bundled = bundled_dataset(given)
        if bundled is not None:
            return f"dataset={given} ({bundled[0]})", case_hashes(load_dataset(*bundled).cases)
        if Path(given).suffix in (".jsonl", ".json") or "/" in given:
            raise ConfigError(f"{role} {given}: no such file")
        if not store:
            store.append(Store(tracking_uri, must_exist=True))
        try:
            data = load_run(store[0], given)
        except TrackingError as exc:
            raise ConfigError(f"{role} {given}: neither a dataset file nor a run ({exc})") from None
        return f"run {data.run_id}", run_hashes(store[0], data)

    (old_name, old_hashes), (new_name, new_hashes) = side(old, "OLD"), side(new, "NEW")
    return VersionDiff(old_name, new_name, compare(old_hashes, new_hashes))
