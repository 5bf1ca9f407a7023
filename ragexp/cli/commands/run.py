"""``ragexp run [OVERRIDES]``."""

from __future__ import annotations

from typing import Any

import typer

from ragexp.cli.console import emit_json
from ragexp.cli.options import (
    AllowDraft,
    ConfigDir,
    DecidedAgainst,
    JsonFlag,
    Multirun,
    Overrides,
    Resume,
    RetryErrors,
    TrackingUri,
    UntilDecided,
    continue_with,
    interrupt_on_sigterm,
    use_config_dir,
)
from ragexp.errors import AllCasesErrored, ConfigError, Interrupted, Stopped
from ragexp.outputs import info


def run(
    overrides: Overrides = None,
    config_dir: ConfigDir = None,
    resume: Resume = None,
    multirun: Multirun = False,
    retry_errors: RetryErrors = False,
    allow_draft: AllowDraft = False,
    tracking_uri: TrackingUri = None,
    baseline: DecidedAgainst = None,
    until_decided: UntilDecided = False,
    as_json: JsonFlag = False,
) -> None:
    """Compose the config, validate the dataset, evaluate every case and log one MLflow run."""
    use_config_dir(config_dir)
    if multirun:
        if until_decided:
            raise ConfigError("--until-decided decides one run against its baseline; it cannot be combined with -m")
        _sweep(overrides or [], resume, as_json, tracking_uri)
        return
    import signal

    from ragexp.cli.views import run_warning, show_next, show_run, show_sequential
    from ragexp.workflows.run import run_config
    from ragexp.workflows.sequential import run_until_decided

    if baseline is not None and not until_decided:
        raise ConfigError("--baseline goes with --until-decided (ragexp gate --baseline compares finished runs)")
    previous = signal.signal(signal.SIGTERM, interrupt_on_sigterm)
    given: dict[str, Any] = {"resume": resume, "retry_errors": retry_errors, "allow_draft": allow_draft}
    given["tracking_uri"] = tracking_uri
    try:
        decided = run_until_decided(overrides or [], baseline=baseline, **given) if until_decided else None
        evaluation = decided.evaluation if decided else run_config(overrides or [], **given)
    except AllCasesErrored as exc:
        if as_json:  # the run is logged: its figures, with the error line on stderr
            emit_json({**exc.outcome.to_json(), "status": "failed"})
        raise
    except Stopped as exc:
        if as_json and isinstance(exc, Interrupted):
            emit_json({"status": "interrupted", "run_id": exc.run_id})
        store = ["--tracking-uri", tracking_uri] if tracking_uri else []
        words = [*(overrides or []), *store, *(["--until-decided"] if until_decided else [])]
        continue_with(exc, "run", [*words, "--resume", exc.run_id])
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
    run_warning(evaluation.outcome)
    if as_json:
        emit_json({**evaluation.outcome.to_json(), **({"sequential": decided.sequential.to_json()} if decided else {})})
        return
    show_run(evaluation)
    if decided:
        show_sequential(decided.sequential)
    show_next(evaluation, overrides or [], tracking_uri)


def _sweep(overrides: list[str], resume: str | None, as_json: bool, tracking_uri: str | None) -> None:
    from ragexp.cli.views_sweep import show_sweep, sweep_json
    from ragexp.workflows.multirun import run_sweep

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
