"""What commands write besides their rendered output: one JSON object on stdout, lines on stderr."""

from __future__ import annotations

import json
import sys
from typing import Any

from ragexp.escape import terminal
from ragexp.secrets import mask_urls


def emit_json(payload: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(payload, ensure_ascii=False) + "\n")


def info(message: str) -> None:
    """One line on stderr: credentials in any URL in it masked, control characters from data (case
    ids, service bodies) shown as escapes."""
    sys.stderr.write(terminal(mask_urls(message)) + "\n")
