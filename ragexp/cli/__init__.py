"""The ``ragexp`` command line.

:func:`main` is the console entry point. It imports nothing heavy itself, so that a Ctrl-C at
any moment of start-up (while Python imports typer, MLflow, Hydra) is one line and exit 130, like
a Ctrl-C during a command; while a command runs, Ctrl-C is a ``KeyboardInterrupt`` that the
command cleans up after (a run is marked interrupted, its checkpoint kept).
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

INTERRUPTED = 130
"""Exit code of an interrupted command (128 + SIGINT, what a shell reports for Ctrl-C)."""


def _exit_interrupted(signum: int = signal.SIGINT, frame: Any = None) -> None:
    # Nothing to clean up before a command starts or once it has ended: leave at once, without
    # the interpreter's shutdown (which a second Ctrl-C would turn into a traceback).
    os.write(2, b"ragexp: interrupted\n")
    os._exit(INTERRUPTED)


def _started_as_the_console_script() -> bool:
    main_module = sys.modules.get("__main__")
    return os.path.basename(getattr(main_module, "__file__", None) or "") == "ragexp"


if _started_as_the_console_script():
    # Here, not only in main(): the console script imports this package first and calls main()
    # after, and a Ctrl-C between the two would otherwise be a traceback. Only in that process:
    # anything else importing ragexp.cli keeps its own Ctrl-C.
    signal.signal(signal.SIGINT, _exit_interrupted)


def main() -> None:
    """Console entry point: the commands of :mod:`ragexp.cli.app`, Ctrl-C-safe before and after."""
    signal.signal(signal.SIGINT, _exit_interrupted)
    try:
        from ragexp.cli.app import main as run_command

        signal.signal(signal.SIGINT, signal.default_int_handler)
        run_command()
    except KeyboardInterrupt:  # between the handlers: nothing has started that needs cleaning up
        _exit_interrupted()
    finally:
        signal.signal(signal.SIGINT, _exit_interrupted)
