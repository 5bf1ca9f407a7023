"""The one error hierarchy of ragexp.

The CLI catches :class:`RagexpError`, prints ``str(error)`` as a single line and exits with
``error.exit_code``. Anything else escaping is a bug and keeps its traceback.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ragexp.workflows.run import RunOutcome


class RagexpError(Exception):
    """Base class of every error a user can cause or fix."""

    exit_code = 1


class ConfigError(RagexpError):
    """The composed configuration is invalid (unknown key, wrong value, bad override)."""


class DatasetError(RagexpError):
    """A dataset file is unreadable or breaks the format; the message names file, line, field."""

    def __init__(self, path: str, line: int | None, field: str | None, reason: str) -> None:
        self.path = path
        self.line = line
        self.field = field
        self.reason = reason
        where = f"{path}:{line}" if line is not None else path
        what = f"field '{field}': " if field else ""
        super().__init__(f"{where}: {what}{reason}")


class DatasetErrors(RagexpError):
    """Several dataset problems at once; the first one is the message, all are kept."""

    def __init__(self, errors: list[DatasetError]) -> None:
        self.errors = errors
        more = f" (and {len(errors) - 1} more; see 'ragexp validate')" if len(errors) > 1 else ""
        super().__init__(f"{errors[0]}{more}")


class MetricError(RagexpError):
    """A metric list is invalid or asks for fields the dataset lacks."""


class ProviderError(RagexpError):
    """A provider cannot work at all (unreachable service, missing secret, bad TLS file)."""


class TrackingError(RagexpError):
    """The tracking store is unreachable or a run id is unknown."""


class UnknownRunError(TrackingError):
    """A run id the store does not hold (the store itself answered)."""


class StoreUnreachable(TrackingError):
    """The tracking store stopped answering (connection refused, timed out): any further call
    would wait for its own timeout."""


class StorageError(RagexpError):
    """A local file cannot be written (disk full, read-only file system)."""


class RunLockedError(RagexpError):
    """Another process is running or resuming this run."""


class IncomparableRunsError(RagexpError):
    """Two runs differ in what makes their scores comparable."""

    exit_code = 3


class PromotionConflict(TrackingError):
    """``gate --promote`` lost a race: the baseline tag moved while the gate ran."""

    def __init__(self, message: str, holders: list[str]) -> None:
        self.holders = holders
        self.warning: str | None = None
        """Set when the promotion lock could not be removed after the race was lost."""
        super().__init__(message)


class Stopped(RagexpError):
    """A run stopped before it finished and can be resumed; the CLI adds the command to do so."""

    def __init__(self, message: str, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(message)


class Interrupted(Stopped):
    """Ctrl-C or SIGTERM stopped a run; it is marked and can be resumed."""

    exit_code = 130

    def __init__(self, run_id: str, done: int, total: int) -> None:
        super().__init__(f"run {run_id} interrupted after {done} of {total} cases", run_id)


class StoreLost(Stopped):
    """The tracking store stopped answering during a run; the results are kept locally."""


class NotFinished(Stopped):
    """Every case was evaluated and logged, but the store did not mark the run finished: it is
    complete, and a ``--resume`` finishes it without asking any case again."""


class AllCasesErrored(RagexpError):
    """The run completed, but no case has a score: nothing it logged can be compared."""

    def __init__(self, message: str, outcome: RunOutcome) -> None:
        super().__init__(message)
        self.outcome = outcome
        """What was logged (``run --json`` prints it before the error line)."""
