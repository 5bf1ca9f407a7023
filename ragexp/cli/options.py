"""Options several commands share, declared once (help texts included).

Imports nothing but typer: every command module imports this one, and ``ragexp --help`` imports
every command module.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Annotated, Any

import typer

Overrides = Annotated[
    list[str] | None, typer.Argument(help="Hydra overrides, e.g. k=10 dataset=scifacts_zh provider=replay")
]
JsonFlag = Annotated[bool, typer.Option("--json", help="Print exactly one JSON object on stdout.")]
AllowDraft = Annotated[
    bool, typer.Option("--allow-draft", help="Accept cases still draft.status 'draft' (a run is tagged ragexp.draft).")
]
TrackingUri = Annotated[
    str | None,
    typer.Option(
        "--tracking-uri",
        help="MLflow tracking URI, the same as tracking.uri=URI (default: tracking.uri of your config, else "
        "$MLFLOW_TRACKING_URI, else sqlite:///mlruns/mlflow.db).",
    ),
]
StoreOverrides = Annotated[
    list[str] | None,
    typer.Argument(
        help="tracking.uri=URI: the store, as --tracking-uri (the one override this command takes).", show_default=False
    ),
]
ConfigDir = Annotated[
    str | None,
    typer.Option(
        "--config-dir",
        help="Your config folder, composed over the packaged defaults "
        "(default: $RAGEXP_CONFIG_DIR, else ./conf when it exists).",
    ),
]
Baseline = Annotated[
    str,
    typer.Option(
        "--baseline",
        help="Run id of the baseline, or tag:KEY=VALUE / latest:EXPERIMENT (the newest finished comparable run).",
    ),
]
AllowIncomparable = Annotated[
    bool, typer.Option("--allow-incomparable", help="Compare runs with different dataset, cases, K, metrics or judge.")
]
CommonCases = Annotated[
    bool,
    typer.Option(
        "--common-cases",
        help="Runs of two versions of a dataset: compare them on the cases both versions hold unchanged "
        "(same question, history and gold), and show the ledger of what changed.",
    ),
]
BridgeJudge = Annotated[
    str | None,
    typer.Option(
        "--bridge-judge",
        help="Compare runs judged by different judges: 'rejudge' grades the baseline's outputs with the "
        "candidate's judge (judge calls only); 'canaries' corrects each run by its own canary agreement.",
    ),
]
SummaryFile = Annotated[
    str | None, typer.Option("--summary", help="Write a Markdown summary here (e.g. $GITHUB_STEP_SUMMARY).")
]
Language = Annotated[
    str | None, typer.Option("--language", help="Language of --summary: zh or en (default: report.language).")
]
UiUrl = Annotated[
    str | None,
    typer.Option("--ui-url", help="MLflow UI address for links in --summary (default: the tracking URI if a server)."),
]


def use_config_dir(config_dir: str | None) -> None:
    """``--config-dir``, given before or after the command name."""
    if config_dir:
        from ragexp.paths import CONFIG_DIR_ENV  # here: importlib.resources is not for --help

        os.environ[CONFIG_DIR_ENV] = config_dir  # read by composition, data paths and sweep workers alike


def store_option(command: str, tracking_uri: str | None, overrides: list[str] | None) -> str | None:
    """The store of a command that composes no config, from ``--tracking-uri`` and ``tracking.uri=``
    (:func:`ragexp.config.tracking.store_uri`: one precedence for every command)."""
    from ragexp.config.tracking import store_uri  # here: --help imports no config code

    return store_uri(command, tracking_uri, overrides or [])


def interrupt_on_sigterm(signum: int, frame: Any) -> None:
    """SIGTERM ends a command that evaluates like Ctrl-C does: the run is marked interrupted and
    its checkpoint kept for a resume."""
    raise KeyboardInterrupt


def continue_with(exc: Exception, command: str, args: list[str]) -> None:
    """End a stopped run's line with the rerun that continues it: ``ragexp COMMAND ARGS...``."""
    import shlex

    exc.args = (f"{exc}; continue with: {shlex.join(['ragexp', command, *args])}",)


@contextlib.contextmanager
def resumable(command: str, args: list[str], *, replaying: bool) -> Iterator[None]:
    """While a command replays cases (``replaying``: ``--attribute``): SIGTERM as Ctrl-C, and a
    stopped replay's line ends with ``ragexp COMMAND ARGS...``, the rerun that continues it."""
    if not replaying:
        yield
        return
    import signal

    from ragexp.errors import Stopped

    previous = signal.signal(signal.SIGTERM, interrupt_on_sigterm)
    try:
        yield
    except Stopped as exc:
        continue_with(exc, command, args)
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)


UntilDecided = Annotated[
    bool,
    typer.Option(
        "--until-decided",
        help="With --baseline: evaluate in seeded random batches until the gate is decided (docs/gates.md).",
    ),
]
DecidedAgainst = Annotated[
    str | None, typer.Option("--baseline", help="With --until-decided: the run the gate compares with.")
]
Resume = Annotated[
    str | None,
    typer.Option(
        "--resume", help="Continue this interrupted run (same config): only the cases it lacks are evaluated."
    ),
]
Multirun = Annotated[
    bool,
    typer.Option(
        "--multirun",
        "-m",
        help="Sweep: one run per point of comma-separated values (k=3,5,10), grouped under a parent run.",
    ),
]
RetryErrors = Annotated[
    bool,
    typer.Option(
        "--retry-errors",
        help="With --resume: also ask again the cases that failed for other reasons than the transport.",
    ),
]
