"""What ragexp knows of MLflow's SQL schema, and the one compatibility check of every direct path.

A direct path (a read or a write of MLflow's tables without MLflow's store) is right only for a
schema the differential tests compared with MLflow's own rows and answers, under an MLflow they
ran with. Both are checked: the installed MLflow's version once per process (its distribution
metadata, without importing it), and the store's alembic revision inside each transaction
(:data:`REVISION_SQL`), so a store migrated in the meantime, by this process or another, is
never written directly again.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import sys
from contextlib import closing
from functools import cache
from pathlib import Path

KNOWN_REVISIONS = frozenset({"dc11669786a5", "e7d1f4b2a9c6", "8b6ad64cb8f5", "f4a9b2c7d1e6"})
"""Alembic revisions of MLflow's schema the direct paths were checked against: MLflow 3.17's
head and 3.18's three migrations (skill registry, issues, MCP versions; none touches a table
ragexp reads or writes)."""
KNOWN_MLFLOW = frozenset({"3.17", "3.18"})
"""MLflow releases (major.minor) the differential tests passed with."""
HEADS = {"dc11669786a5": "3.17", "f4a9b2c7d1e6": "3.18"}
"""The MLflow release whose newest migration each revision is."""
REVISION_SQL = "SELECT version_num FROM alembic_version"
_SAID: set[str] = set()


class Declined(Exception):
    """A direct path cannot do this call as MLflow would: MLflow's public API does it.

    ``reason`` set: the store or the installed MLflow is not one the direct paths were checked
    against, so no direct path is taken again in this process (the reason is said once on
    stderr); None: only this call (a key MLflow would refuse, a remote artifact folder)."""

    def __init__(self, reason: str | None = None) -> None:
        super().__init__(reason or "declined")
        self.reason = reason


def installed_mlflow() -> str:
    """The installed MLflow's version ('' when it is not installed)."""
    try:
        return importlib.metadata.version("mlflow")
    except importlib.metadata.PackageNotFoundError:
        return ""


def _release(version: str) -> str:
    return ".".join(version.split(".")[:2])


def check_mlflow() -> None:
    """Raise :class:`Declined` when the installed MLflow is not one the direct paths know."""
    version = installed_mlflow()
    if _release(version) not in KNOWN_MLFLOW:
        raise Declined(f"MLflow {version or '(none)'} is installed, which ragexp's direct paths were not checked with")


def check_revision(revision: str | None, uri: str) -> None:
    """Raise :class:`Declined` unless ``revision`` (the store's) is one the direct paths know."""
    if revision not in KNOWN_REVISIONS:
        raise Declined(
            f"tracking store {uri} is at schema revision {revision}, which ragexp's direct paths were not "
            "checked against"
        )


def say_once(reason: str) -> None:
    """The one stderr line of a direct path declined for good (once per reason and process)."""
    if reason not in _SAID:
        _SAID.add(reason)
        print(f"ragexp: {reason}: using MLflow's API instead (slower, same results)", file=sys.stderr)


@cache
def installed_revisions() -> tuple[frozenset[str], str | None]:
    """(every revision, the head) of the installed MLflow's migrations, read from its files: the
    head is the revision no other one follows."""
    spec = importlib.util.find_spec("mlflow")
    if spec is None or not spec.submodule_search_locations:
        return frozenset(), None
    folder = Path(next(iter(spec.submodule_search_locations))) / "store" / "db_migrations" / "versions"
    revisions: set[str] = set()
    parents: set[str] = set()
    for path in folder.glob("*.py"):
        text = path.read_text(encoding="utf-8")
        found = re.search(r'^revision\s*=\s*["\'](\w+)["\']', text, re.MULTILINE)
        if found is None:
            continue
        revisions.add(found.group(1))
        down = re.search(r"^down_revision\s*=\s*(.+)$", text, re.MULTILINE)
        if down is not None:
            parents.update(re.findall(r"[\"'](\w+)[\"']", down.group(1)))
    heads = revisions - parents
    return frozenset(revisions), (heads.pop() if len(heads) == 1 else None)


def refusal(revision: str | None, uri: str, *, allow_upgrade: bool) -> str | None:
    """Why MLflow must not open this existing store, in one line; None when it may.

    A revision older than the installed MLflow's head would be migrated by MLflow on open, and
    older clients could no longer open the store (there is no downgrade); a revision the installed
    MLflow does not know was migrated by a newer MLflow, whose advice ('mlflow db upgrade') cannot
    work here."""
    if revision is None:
        return None
    version = installed_mlflow()
    if HEADS.get(revision) == _release(version):
        return None
    known, head = installed_revisions()
    if revision == head:
        return None
    if revision in known:
        if allow_upgrade:
            return None
        return (
            f"tracking store {uri} is at schema revision {revision} and the installed MLflow {version} would "
            f"migrate it to {head}, after which older MLflow clients could no longer open it: back the store "
            "up, then pass --allow-store-upgrade (or set RAGEXP_ALLOW_STORE_UPGRADE=1), or run "
            f"'mlflow db upgrade {uri}'"
        )
    reader = f"MLflow {HEADS[revision]}" if revision in HEADS else f"an MLflow newer than {version}"
    return (
        f"tracking store {uri} was migrated by a newer MLflow than the installed {version} (schema revision "
        f"{revision}): open it with {reader} or newer ('mlflow db upgrade' from MLflow {version} cannot)"
    )


def store_revision(uri: str) -> str | None:
    """The schema revision of an existing SQL store (None: not a SQL store, or not created yet)."""
    if uri.startswith("sqlite:///"):
        import sqlite3

        path = uri[len("sqlite:///") :]
        try:
            with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=20.0)) as db:
                row = db.execute(REVISION_SQL).fetchone()
        except sqlite3.Error:
            return None
        return str(row[0]) if row else None
    scheme = uri.split(":", 1)[0].split("+", 1)[0]
    if scheme not in ("postgresql", "mysql", "mssql"):
        return None
    import sqlalchemy

    engine = sqlalchemy.create_engine(uri)
    try:
        with engine.connect() as connection:
            value = connection.execute(sqlalchemy.text(REVISION_SQL)).scalar()
    except sqlalchemy.exc.SQLAlchemyError:
        return None
    finally:
        engine.dispose()
    return str(value) if value is not None else None
