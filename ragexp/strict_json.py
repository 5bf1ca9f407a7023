"""JSON text ragexp writes for other programs: strict JSON, always.

Python's ``json`` writes ``NaN``, ``Infinity`` and ``-Infinity`` for non-finite floats, which no
JSON parser but Python's accepts (``jq``, JavaScript's ``JSON.parse``, Go, Rust). A non-finite
number means "no value" wherever ragexp could hold one (a mean over no scored case, a figure a
store holds as NaN), so it is written as ``null``, as every other missing figure is. numpy scalars
and arrays are written as the numbers they hold. Anything else JSON cannot hold is a bug and
raises ``TypeError``.
"""

from __future__ import annotations

import json
import math
from typing import Any


def plain(value: Any) -> Any:
    """``value`` with every non-finite float as None and numpy values as Python ones."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if value is None or isinstance(value, str | int):
        return value
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [plain(item) for item in value]
    if type(value).__module__ == "numpy" and hasattr(value, "tolist"):
        return plain(value.tolist())
    return value


def dumps(value: Any, *, indent: int | None = None) -> str:
    """Strict JSON text of ``value`` (UTF-8 characters kept, not ``\\u`` escaped)."""
    return json.dumps(plain(value), ensure_ascii=False, indent=indent, allow_nan=False)
