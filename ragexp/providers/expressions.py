"""The JMESPath expressions of a response mapping, compiled once (a plain path read without JMESPath's
interpreter), the projections a list is read through, and replies made plain JSON values."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, Protocol

import jmespath
import jmespath.exceptions
import jmespath.parser
from pydantic import BaseModel

from ragexp.errors import ConfigError

_PROJECTIONS = ("projection", "filter_projection", "value_projection")


@dataclass(frozen=True)
class Level:
    """One projection an expression reads items through: ``base`` finds the items it reads,
    ``result`` what it gives for them (None: the whole expression's value)."""

    base: Expression
    result: Expression | None


def levels_of(node: dict[str, Any]) -> list[Level]:
    """The projections of an expression, outermost first, along the chain a value comes through
    (``a.b[].c``, ``a[].b[].c``, ``a[?x].c``, ``*.c``); [] for an expression without one."""
    prefix: list[dict[str, Any]] = []
    if node["type"] == "subexpression" and node["children"][-1]["type"] in _PROJECTIONS:
        prefix, node = node["children"][:-1], node["children"][-1]
    levels: list[Level] = []
    while node["type"] in _PROJECTIONS:
        left = node["children"][0]
        if node["type"] == "filter_projection":
            identity = {"type": "identity", "children": []}
            base = {"type": "filter_projection", "children": [left, identity, node["children"][2]]}
        else:
            base = left
        result = None if not levels else _node_expression(_within(prefix, node))
        levels.append(Level(_node_expression(_within(prefix, base)), result))
        if left["type"] == "flatten" and left["children"][0]["type"] in _PROJECTIONS:
            node = left["children"][0]
        else:
            break
    return levels


def _within(prefix: list[dict[str, Any]], node: dict[str, Any]) -> dict[str, Any]:
    return {"type": "subexpression", "children": [*prefix, node]} if prefix else node


def _node_expression(node: dict[str, Any]) -> Expression:
    step = _path(node)
    return _Path(step) if step is not None else jmespath.parser.ParsedResult("", node)


class Expression(Protocol):
    """A compiled JMESPath expression."""

    def search(self, value: Any) -> Any: ...


def compile_expression(text: str, where: str) -> Expression:
    """One JMESPath expression, or a ConfigError naming ``where`` and the parser's reason."""
    if not text.strip():
        raise ConfigError(f"{where}: empty JMESPath expression")
    try:
        parsed = jmespath.compile(text)
    except jmespath.exceptions.JMESPathError as exc:
        reason = " ".join(str(exc).split())
        raise ConfigError(f"{where}: not a JMESPath expression: {reason}") from None
    path = _path(parsed.parsed)
    return _Path(path) if path is not None else parsed


Step = Callable[[Any], Any]


@dataclass(frozen=True)
class _Path:
    """The common shapes (``a.b``, ``a[0].b``, ``a.b[].c``) evaluated directly, with JMESPath's
    semantics: they run on every event of a streamed reply, where the general interpreter's
    per-call set-up is most of the cost of reading a case."""

    step: Step

    def search(self, value: Any) -> Any:
        return self.step(value)


def _path(node: dict[str, Any]) -> Step | None:
    kind = node["type"]
    if kind == "field":
        name = node["value"]
        return lambda value: value.get(name) if type(value) is dict else None
    if kind == "index":
        index = node["value"]

        def at(value: Any) -> Any:
            if type(value) is not list:
                return None
            try:
                return value[index]
            except IndexError:
                return None

        return at
    if kind in ("subexpression", "index_expression"):
        steps = [_path(child) for child in node["children"]]
        if any(step is None for step in steps):
            return None
        chain = [step for step in steps if step is not None]

        def then(value: Any) -> Any:
            for step in chain:
                value = step(value)
            return value

        return then
    if kind == "projection" and node["children"][0]["type"] == "flatten":
        base = _path(node["children"][0]["children"][0])
        rhs = node["children"][1]
        each = (lambda value: value) if rhs["type"] == "identity" else _path(rhs)
        if base is None or each is None:
            return None
        return partial(_project, base, each)
    return None


def _project(base: Step, each: Step, value: Any) -> Any:
    items = base(value)
    if type(items) is not list:
        return None
    out = []
    for item in items:
        # Flattening merges nested lists one level, then the projection drops nulls.
        for element in item if type(item) is list else (item,):
            found = each(element)
            if found is not None:
                out.append(found)
    return out


def truthy(value: Any) -> bool:
    # JMESPath's notion of false: null, false, empty string, list or object.
    return value not in (None, False, "", [], {})


def value_kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return f"a number ({value!r})"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


_MAX_DEPTH = 64


def to_plain(value: Any) -> Any:
    """``value`` as JSON-like data (dicts with string keys, lists, strings, numbers, booleans,
    null): mappings, sequences, dataclasses, pydantic models and objects with public attributes
    are taken apart field by field (a LangChain ``Document`` keeps ``id``, ``page_content`` and
    ``metadata``; a LlamaIndex ``NodeWithScore`` its ``node`` and ``score``). Data that is
    JSON-like already (exact types) is returned as it is, not copied."""
    if _is_json(value, 0):
        return value
    return _plain(value, 0, set())


_JSON_SCALARS = frozenset({str, int, float, bool, type(None)})


_JSON_CHECK_DEPTH = 16
"""Deeper data is copied by :func:`_plain`, which also breaks cycles."""


def _is_json(value: Any, depth: int) -> bool:
    kind = type(value)
    if kind in _JSON_SCALARS:
        return True
    if depth >= _JSON_CHECK_DEPTH:
        return False
    if kind is list:
        for item in value:  # noqa: SIM110 - all() over a generator costs several times this loop
            if type(item) is not str and not _is_json(item, depth + 1):
                return False
        return True
    if kind is dict:
        for key, item in value.items():
            if type(key) is not str or (type(item) is not str and not _is_json(item, depth + 1)):
                return False
        return True
    return False


def _plain(value: Any, depth: int, active: set[int]) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if _numpy_scalar(value):
        return _plain(value.item(), depth + 1, active)
    if depth > _MAX_DEPTH or id(value) in active:
        return repr(value)  # a cycle or a runaway structure: its text, not a hang
    if isinstance(value, enum.Enum):
        return _plain(value.value, depth + 1, active)
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", errors="replace")
    active.add(id(value))
    try:
        return _container(value, depth + 1, active)
    finally:
        active.discard(id(value))


def _numpy_scalar(value: Any) -> bool:
    """A numpy scalar (``np.float32(0.5)``, ``np.int64(3)``, ``np.bool_(True)``) or 0-d array:
    its ``item()`` is the Python number (numpy is not imported to ask)."""
    return (
        type(value).__module__ == "numpy"
        and getattr(value, "ndim", None) == 0
        and callable(getattr(value, "item", None))
    )


def _key(key: Any) -> str:
    # An enum key is its value, as JSON has it (LlamaIndex's relationships are keyed by
    # NodeRelationship, whose SOURCE is "1"), not its Python name.
    return str(key.value) if isinstance(key, enum.Enum) else str(key)


def _container(value: Any, depth: int, active: set[int]) -> Any:
    if isinstance(value, Mapping):
        return {_key(key): _plain(item, depth, active) for key, item in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [_plain(item, depth, active) for item in value]
    if isinstance(value, BaseModel):
        fields = type(value).model_fields
        data = {name: getattr(value, name, None) for name in fields}
        return {name: _plain(item, depth, active) for name, item in data.items()}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name), depth, active) for f in dataclasses.fields(value)}
    if hasattr(value, "model_dump") and callable(value.model_dump):  # pydantic v1-style or look-alikes
        try:
            return _plain(value.model_dump(), depth, active)
        except Exception:  # a failing dump falls back to the attributes
            pass
    attributes = getattr(value, "__dict__", None)
    if isinstance(attributes, dict):
        return {
            str(name): _plain(item, depth, active)
            for name, item in attributes.items()
            if not str(name).startswith("_") and not callable(item)
        }
    if hasattr(value, "__iter__") and not hasattr(value, "__dict__"):
        try:
            return [_plain(item, depth, active) for item in value]
        except TypeError:
            pass
    return str(value)
