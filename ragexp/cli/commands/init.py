"""``ragexp init [DIR]``."""

from __future__ import annotations

from typing import Annotated

import typer

from ragexp.outputs import info


def init(
    directory: Annotated[str, typer.Argument(help="Folder to set up (created if missing).")] = ".",
    force: Annotated[bool, typer.Option("--force", help="Overwrite starter files that already exist.")] = False,
    system: Annotated[
        str,
        typer.Option(
            "--system",
            help="Template of conf/system/my_service.yaml: http (ragexp's contract), dify, ragflow, openai_chat, "
            "python, langchain, llamaindex.",
        ),
    ] = "http",
) -> None:
    """Write a starter conf/ (your dataset, your service, your gate), a two-case dataset and a .gitignore."""
    from pathlib import Path

    from ragexp.workflows.init import init_project, next_commands

    folder = Path(directory)
    for path in init_project(folder, force=force, system=system):
        info(f"wrote {path}")
    typer.echo("Next:")
    for line in next_commands(folder):
        typer.echo(f"  {line}")
