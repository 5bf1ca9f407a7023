"""What commands write besides their rendered output: one JSON object on stdout, lines on stderr."""

from __future__ import annotations

import sys
from typing import Any

from ragexp import strict_json
from ragexp.escape import terminal
from ragexp.secrets import mask_urls


def emit_json(payload: dict[str, Any]) -> None:
    """The one writer of every command's ``--json``: one object, strict JSON (a non-finite number
    is ``null``, never ``NaN`` or ``Infinity``; :mod:`ragexp.strict_json`)."""
    sys.stdout.write(strict_json.dumps(payload) + "\n")


def info(message: str) -> None:
    """One line on stderr: credentials in any URL in it masked, control characters from data (case
    ids, service bodies) shown as escapes."""
    sys.stderr.write(terminal(mask_urls(message)) + "\n")
