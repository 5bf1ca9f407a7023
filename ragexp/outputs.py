"""What a command writes besides its rendered output: lines on stderr (:func:`info`), and files
(``--junit``, ``--summary``), checked before any work and written whole or not at all."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from ragexp.errors import ConfigError
from ragexp.escape import terminal
from ragexp.secrets import mask_urls


def info(message: str) -> None:
    """One line on stderr: credentials in any URL in it masked, control characters from data (case
    ids, stage names, service bodies) shown as escapes."""
    sys.stderr.write(terminal(mask_urls(message)) + "\n")


def check_writable(option: str, path: str | None) -> Path | None:
    """Refuse, in one line and before any work, a path the command could not write at the end."""
    if path is None:
        return None
    target = Path(path)
    if not path.strip():
        raise ConfigError(f"{option}: empty path")
    if target.is_dir():
        raise ConfigError(f"{option} {path}: is a directory, not a file")
    existed = target.exists()
    blocking = next((p for p in target.parents if p.exists() and not p.is_dir()), None)
    if blocking is not None:
        raise ConfigError(f"{option} {path}: {blocking} is a file, not a folder")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with target.open("ab"):
            pass
    except OSError as exc:
        raise ConfigError(f"{option} {path}: cannot write there ({exc.strerror or exc})") from None
    if not existed:
        target.unlink()  # nothing is left behind if the command then fails
    return target


def write_file(option: str, target: Path, data: bytes) -> None:
    """Write through a temporary file beside the target, so a reader never sees half of it."""
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
            os.replace(tmp, target)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as exc:
        raise ConfigError(f"{option} {target}: could not write it ({exc.strerror or exc})") from None
