"""``ragexp demo``."""

from __future__ import annotations

from typing import Annotated

import typer


def demo(
    store: Annotated[
        str, typer.Option("--store", help="Folder for the demo's own MLflow store; emptied if a previous demo made it.")
    ] = "ragexp-demo",
) -> None:
    """The whole loop on the bundled sample system: baseline, candidate, diff, gate (fails on purpose), report."""
    from pathlib import Path

    from ragexp.cli.demo import DemoScreen
    from ragexp.workflows.demo import run_demo

    run_demo(Path(store), DemoScreen())
