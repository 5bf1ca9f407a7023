"""``ragexp``: the typer application. Each command lives in its own module under
:mod:`ragexp.cli.commands` and is imported only when it is asked for (or when ``--help`` lists
its options): ``ragexp run`` never imports the code of ``ragexp gate``."""

from __future__ import annotations

import gc
import importlib
import os
import sys
from difflib import get_close_matches
from typing import Any

import click
import typer
from typer.core import TyperGroup
from typer.exceptions import TyperException
from typer.main import get_command_from_info
from typer.models import CommandInfo

from ragexp.cli.commands import COMMANDS
from ragexp.cli.options import ConfigDir, use_config_dir
from ragexp.errors import RagexpError
from ragexp.outputs import info
from ragexp.secrets import scrub


class LazyCommands(TyperGroup):
    """The commands of :data:`~ragexp.cli.commands.COMMANDS`, each built from its module on first use."""

    # Contexts and commands are of typer's vendored click, a private module: left unnamed (Any),
    # made and read only through typer's public functions and their own methods.
    def list_commands(self, ctx: Any) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if cmd_name not in COMMANDS:
            return None
        if cmd_name not in self.commands:
            module = importlib.import_module(f"ragexp.cli.commands.{cmd_name}")
            modes = getattr(module, "MODES", {})
            self.commands[cmd_name] = self._built(cmd_name, getattr(module, cmd_name), _modes_list(cmd_name, modes))
        return self.commands[cmd_name]

    def _built(self, name: str, callback: Any, epilog: str | None = None) -> Any:
        command = get_command_from_info(
            CommandInfo(name=name, callback=callback, epilog=epilog),
            pretty_exceptions_short=True,
            rich_markup_mode=self.rich_markup_mode,
        )
        # click cuts a help's first sentence to fit the command list ("..."); given whole, it wraps.
        command.short_help = " ".join((command.help or "").split("\n\n")[0].split())
        return command

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        # `ragexp draft review FILE`: a command's MODES are commands of their own, named by two words.
        named = len(args) > 1 and args[0] in COMMANDS
        modes = getattr(importlib.import_module(f"ragexp.cli.commands.{args[0]}"), "MODES", {}) if named else {}
        if named and args[1] in modes:
            name = f"{args[0]} {args[1]}"
            if name not in self.commands:
                self.commands[name] = self._built(name, modes[args[1]])
            return name, self.commands[name], args[2:]
        try:
            return super().resolve_command(ctx, args)
        except TyperException as exc:  # a usage error: the only error resolving a command raises
            # typer suggests from the commands built so far; here that is none of them.
            message = exc.format_message()
            matches = get_close_matches(args[0], COMMANDS) if args else []
            if not matches or "Did you mean" in message:
                raise
            ctx.fail(f"{message.rstrip('.')}. Did you mean {', '.join(map(repr, matches))}?")


def _modes_list(command: str, modes: dict[str, Any]) -> str | None:
    """The ``Commands:`` lines of a command's help: each of its modes and what it does."""
    if not modes:
        return None
    lines = [
        f"ragexp {command} {mode}: {(function.__doc__ or '').strip().splitlines()[0]}"
        for mode, function in modes.items()
    ]
    return "Commands (each with its own --help):\n\n" + "\n\n".join(lines)


app = typer.Typer(
    name="ragexp",
    cls=LazyCommands,
    help="Config-driven RAG evaluation: run, compare and gate experiments tracked in MLflow.",
    no_args_is_help=True,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
    pretty_exceptions_enable=False,
    # click's plain help: a flag shows no value type, a paragraph rewraps to the terminal, and a long
    # default wraps instead of being cut to the width of rich's help column.
    rich_markup_mode=None,
)


UPGRADE_FLAG = "--allow-store-upgrade"


def _version(shown: bool) -> None:
    if shown:
        from importlib.metadata import PackageNotFoundError, version

        from ragexp import __version__

        try:
            mlflow = f" (MLflow {version('mlflow')})"
        except PackageNotFoundError:  # pragma: no cover - mlflow is a dependency
            mlflow = ""
        typer.echo(f"ragexp {__version__}{mlflow}")
        raise typer.Exit()


@app.callback()
def _options(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print ragexp's version and exit."
    ),
    config_dir: ConfigDir = None,
    allow_store_upgrade: bool = typer.Option(
        False,
        UPGRADE_FLAG,
        help="Let the installed MLflow migrate an existing tracking store (older MLflow clients then "
        "cannot open it; back it up first). Accepted before or after the command name.",
    ),
) -> None:
    """Config-driven RAG evaluation: run, compare and gate experiments tracked in MLflow."""
    use_config_dir(config_dir)


def main() -> None:
    """Console entry point: one line on stderr and the contract's exit code for any error."""
    # Commands build hundreds of thousands of long-lived objects (cases, rows) and exit soon after;
    # the cyclic collector would rescan them again and again (measured: a third of a 100k-case
    # run, two thirds of a 100k-case diff). Nothing here relies on collecting cycles.
    gc.disable()
    if UPGRADE_FLAG in sys.argv[1:]:  # every command opens a store: taken wherever it is given
        sys.argv.remove(UPGRADE_FLAG)
        os.environ["RAGEXP_ALLOW_STORE_UPGRADE"] = "1"  # read by Store before MLflow opens a store
    if not sys.argv[1:]:  # plain `ragexp`: what it can do, and a success
        sys.argv.append("--help")
    code: Any
    try:
        code = app(standalone_mode=False)
    except RagexpError as exc:
        kind = "interrupted" if exc.exit_code == 130 else "error"
        info(f"ragexp: {kind}: {scrub(str(exc))}")
        sys.exit(exc.exit_code)
    except (typer.Exit, click.exceptions.Exit) as exc:
        code = exc.exit_code
    except (KeyboardInterrupt, typer.Abort, click.exceptions.Abort):
        info("ragexp: interrupted")
        sys.exit(130)
    except (TyperException, click.ClickException) as exc:
        # Usage errors are errors (exit 1; 2 is a failed gate), in one line like every other error.
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        info(f"ragexp: error: {message} (see 'ragexp --help')")
        sys.exit(1)
    if code == 130:  # typer turns a KeyboardInterrupt (or SIGTERM) in a command into a silent 130
        info("ragexp: interrupted")
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
