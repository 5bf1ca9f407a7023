"""``ragexp run [OVERRIDES]``."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from ragexp.cli.console import emit_json, info
from ragexp.cli.options import AllowDraft, ConfigDir, JsonFlag, Overrides, TrackingUri, use_config_dir

RetryErrors = Annotated[
    bool,
    typer.Option(
        "--retry-errors",
        help="With --resume: also ask again the cases that failed for other reasons than the transport.",
    ),
]


def _interrupt(signum: int, frame: Any) -> None:
    # SIGTERM ends a run like Ctrl-C does: marked interrupted, checkpoint kept for --resume.
    raise KeyboardInterrupt


def run(
    overrides: Overrides = None,
    config_dir: ConfigDir = None,
    resume: Annotated[
        str | None,
        typer.Option(
            "--resume", help="Continue this interrupted run (same config): only the cases it lacks are evaluated."
        ),
    ] = None,
    multirun: Annotated[
        bool,
        typer.Option(
            "--multirun",
            "-m",
            help="Sweep: one run per point of comma-separated values (k=3,5,10), grouped under a parent run.",
        ),
    ] = False,
    retry_errors: RetryErrors = False,
    allow_draft: AllowDraft = False,
    tracking_uri: TrackingUri = None,
    as_json: JsonFlag = False,
) -> None:
    """Compose the config, validate the dataset, evaluate every case and log one MLflow run."""
    use_config_dir(config_dir)
    if multirun:
        _sweep(overrides or [], resume, as_json, tracking_uri)
        return
    import shlex
    import signal

    from ragexp.cli.views import run_warning, show_next, show_run
    from ragexp.runner import Interrupted, Stopped, run_config

    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        evaluation = run_config(
            overrides or [],
            resume=resume,
            retry_errors=retry_errors,
            allow_draft=allow_draft,
            tracking_uri=tracking_uri,
        )
    except Stopped as exc:
        if as_json and isinstance(exc, Interrupted):
            emit_json({"status": "interrupted", "run_id": exc.run_id})
        store = ["--tracking-uri", tracking_uri] if tracking_uri else []
        command = " ".join(["ragexp", "run", *map(shlex.quote, [*(overrides or []), *store]), "--resume", exc.run_id])
        exc.args = (f"{exc}; continue with: {command}",)
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
    run_warning(evaluation.outcome)
    if as_json:
        emit_json(evaluation.outcome.to_json())
        return
    show_run(evaluation)
    show_next(evaluation)


def _sweep(overrides: list[str], resume: str | None, as_json: bool, tracking_uri: str | None) -> None:
    from ragexp.cli.views import show_sweep, sweep_json
    from ragexp.errors import ConfigError
    from ragexp.sweep import run_sweep

    if resume:
        raise ConfigError("--resume continues one run; it cannot be combined with -m")
    outcome = run_sweep(overrides, tracking_uri=tracking_uri)
    if as_json:
        emit_json(sweep_json(outcome))
    else:
        show_sweep(outcome)
    for number, reason in sorted(outcome.failures.items()):
        info(f"ragexp: sweep point {number} failed: {reason}")
    if outcome.failures:
        raise typer.Exit(1)
