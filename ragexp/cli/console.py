"""The one JSON object on stdout a command's ``--json`` writes (its lines on stderr: :func:`ragexp.outputs.info`)."""

from __future__ import annotations

import sys
from typing import Any

from ragexp import strict_json


def emit_json(payload: dict[str, Any]) -> None:
    """The one writer of every command's ``--json``: one object, strict JSON (a non-finite number
    is ``null``, never ``NaN`` or ``Infinity``; :mod:`ragexp.strict_json`)."""
    sys.stdout.write(strict_json.dumps(payload) + "\n")
