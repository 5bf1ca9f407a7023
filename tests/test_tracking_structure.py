"""One door to MLflow's private contract: only ``ragexp/tracking/mlflow_sql/`` touches a private
MLflow symbol (an ``_``-prefixed name or module of mlflow, ``mlflow.store`` internals, MLflow's
ORM models or session maker) or names an MLflow table in SQL."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.conftest import ROOT

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
