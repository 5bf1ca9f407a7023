"""One door to MLflow's private contract: only ``ragexp/tracking/mlflow_sql/`` touches a private
MLflow symbol (an ``_``-prefixed name or module of mlflow, ``mlflow.store`` internals, MLflow's
ORM models or session maker) or names an MLflow table in SQL."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.test_structure import imported_modules

PACKAGE = ROOT / "ragexp"
DOOR = PACKAGE / "tracking" / "mlflow_sql"
PRIVATE_NAMES = re.compile(r"^(_\w+|dbmodels|ManagedSessionMaker)$")
TABLES = (
    "alembic_version|runs|tags|params|metrics|latest_metrics|experiments|datasets|inputs|input_tags|"
    "trace_info|trace_tags|trace_request_metadata|assessments|spans"
)
SQL = re.compile(rf"\b(FROM|INTO|UPDATE|JOIN|TABLE)\s+({TABLES})\b", re.IGNORECASE)


def private_uses(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "mlflow":
            parts = node.module.split(".")
            if parts[:2] == ["mlflow", "store"] or any(p.startswith("_") for p in parts):
                found.append(f"from {node.module} import ...")
            found.extend(f"{node.module}.{alias.name}" for alias in node.names if PRIVATE_NAMES.match(alias.name))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "mlflow" and (parts[:2] == ["mlflow", "store"] or any(p.startswith("_") for p in parts)):
                    found.append(f"import {alias.name}")
        elif (
            isinstance(node, ast.Attribute)
            and PRIVATE_NAMES.match(node.attr)
            and node.attr
            in (
                "_tracking_client",
                "_get_server_version",
                "_get_trace_artifact_location_tag",
                "ManagedSessionMaker",
                "dbmodels",
            )
        ):
            found.append(f".{node.attr}")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and SQL.search(node.value):
            found.append(f"SQL on an MLflow table: {node.value[:60]!r}")
    return [f"{path.relative_to(ROOT)}:{item}" for item in found]


def test_only_the_mlflow_sql_package_touches_mlflow_internals() -> None:
    outside = [path for path in PACKAGE.rglob("*.py") if DOOR not in path.parents]
    assert len(outside) > 50
    assert [use for path in outside for use in private_uses(path)] == []


def test_the_check_sees_what_the_door_holds() -> None:
    # The rule finds the private uses inside the door: it is not a check that cannot fail.
    inside = [use for path in DOOR.rglob("*.py") for use in private_uses(path)]
    assert any("dbmodels" in use for use in inside)
    assert any("_tracking_client" in use for use in inside)
    assert any("SQL on an MLflow table" in use for use in inside)


INTERNALS = DOOR / "internals.py"
STDLIB_PRIVATE = {"_exit"}
"""Underscore names of the standard library the package calls (``os._exit``): not MLflow's."""
MLFLOW_INTERNAL_NAMES = {"ManagedSessionMaker", "dbmodels"}
"""MLflow's internals without an underscore: its SQL store's session maker and ORM models' module."""


def _defined_in(paths: list[Path]) -> set[str]:
    """Every name the package itself defines: functions, classes, assigned names and attributes."""
    names: set[str] = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store | ast.Del):
                names.add(node.attr)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
    return names


def private_mlflow_symbols(path: Path, own: set[str]) -> list[str]:
    """The private MLflow symbols ``path`` uses: an import of ``mlflow.store`` or of an
    ``_``-prefixed mlflow module or name; an ``_``-prefixed attribute (or ``getattr`` name) the
    package does not define itself, which is a private symbol of a library (of MLflow: the package
    imports no other library's privates); MLflow's session maker and ORM models."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        for module in imported_modules(node):
            parts = module.split(".")
            names = [alias.name for alias in node.names] if isinstance(node, ast.ImportFrom) else []
            if parts[0] == "mlflow" and (
                parts[:2] == ["mlflow", "store"] or any(p.startswith("_") for p in parts + names)
            ):
                found.append(f"import {module}")
        if isinstance(node, ast.Attribute):
            foreign = node.attr.startswith("_") and not node.attr.startswith("__") and node.attr not in own
            if (foreign and node.attr not in STDLIB_PRIVATE) or node.attr in MLFLOW_INTERNAL_NAMES:
                found.append(f".{node.attr}")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr"):
            name = node.args[1] if len(node.args) > 1 else None
            text = str(name.value) if isinstance(name, ast.Constant) else ""
            if text.startswith("_") and not text.startswith("__") and text not in own:
                found.append(f"getattr {text}")
    return [f"{path.relative_to(ROOT)}: {item}" for item in found]


@pytest.mark.system  # a whole run: `make test`, not the edit loop
def test_every_private_mlflow_symbol_is_in_internals() -> None:
    paths = sorted(PACKAGE.rglob("*.py"))
    own = _defined_in(paths)
    outside = [use for path in paths if path != INTERNALS for use in private_mlflow_symbols(path, own)]
    assert outside == []
    # The rule finds each kind of private use, where internals.py holds them.
    inside = " ".join(private_mlflow_symbols(INTERNALS, own))
    for kind in ("import mlflow.store.tracking.dbmodels", "._tracking_client", ".ManagedSessionMaker"):
        assert kind in inside
    assert "getattr _get_server_version" in inside and "._get_trace_artifact_location_tag" in inside
