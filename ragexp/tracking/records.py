"""What the tracking layer hands back and how it words a store's failures: shared by
:mod:`ragexp.tracking.store` and the direct backend under :mod:`ragexp.tracking.mlflow_sql`."""

from __future__ import annotations

import errno
import re
from dataclasses import dataclass, field

from ragexp.errors import StorageError, StoreUnreachable, TrackingError
from ragexp.secrets import mask_url

TAG_PREFIX = "ragexp."


@dataclass
class RunRecord:
    """What ragexp reads back about a run."""

    run_id: str
    name: str
    experiment_id: str
    status: str
    start_time: int
    end_time: int | None
    tags: dict[str, str] = field(default_factory=dict)
    params: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)

    def tag(self, name: str, default: str = "") -> str:
        return self.tags.get(TAG_PREFIX + name, default)


CONNECTION_LOST = re.compile(
    r"Max retries exceeded|Connection(Error| refused| reset| aborted)|timed out|Timeout", re.IGNORECASE
)
"""What MLflow's REST client says when the server is gone, as opposed to an answer it gave."""


def connection_lost(exc: BaseException) -> bool:
    """Whether a failure means the store did not answer at all (refused, reset, timed out), as
    opposed to an answer it gave: any further call would wait for its own timeout too."""
    if isinstance(exc, StoreUnreachable):
        return True
    if isinstance(exc, TrackingError | StorageError):
        return False
    import httpx  # only on a failure: reading a store needs no HTTP client

    if isinstance(exc, httpx.TransportError):
        return True
    if isinstance(exc, ConnectionError | TimeoutError):
        return True
    if isinstance(exc, OSError):  # requests' errors are OSErrors; a full disk is not a lost store
        return exc.errno not in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES)
    return "failed with exception" in str(exc) and CONNECTION_LOST.search(str(exc)) is not None


def store_os_error(exc: OSError, uri: str, what: str) -> TrackingError | StorageError:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        where = f" ({exc.filename})" if exc.filename else ""
        return StorageError(f"disk full: {what}: no space left for the tracking store {uri}{where}")
    if exc.errno == errno.EROFS:
        return TrackingError(f"{what}: tracking store {uri} is on a read-only file system")
    return StoreUnreachable(f"{what}: tracking store {mask_url(uri)} unreachable ({one_line(exc)})")


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def database_error(text: str, uri: str, what: str) -> TrackingError | StorageError | None:
    """A database's refusal of the disk or the file, not the call (None: anything else)."""
    if "database or disk is full" in text:
        return StorageError(f"disk full: {what}: the tracking store {uri} cannot grow")
    if "readonly" in text or "read-only" in text:
        return TrackingError(f"{what}: tracking store {uri} is read-only")
    return None
