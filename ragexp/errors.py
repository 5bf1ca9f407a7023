"""The one error hierarchy of ragexp.

The CLI catches :class:`RagexpError`, prints ``str(error)`` as a single line and exits with
``error.exit_code``. Anything else escaping is a bug and keeps its traceback.
"""

from __future__ import annotations


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
