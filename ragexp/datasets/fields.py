"""What each field of a case may hold: one rule per field (:data:`RULES`), each with the words for a
value it refuses; the loader applies them line by line."""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ragexp import limits
from ragexp.metrics.registry import METRICS, labelled_metric

Reason = str | tuple[str, str]
"""Why a value is refused: the reason, or a sub-field (``human.faithfulness``) and the reason."""


@dataclass(frozen=True, slots=True)
class FieldRule:
    """What one field of a case may hold, and the words for a value that does not."""

    name: str
    type: str
    """The field's type as docs/datasets.md states it."""
    check: Callable[[Any], Reason | None]
    """None when a value (never null: null is an absent field) is fine, else why it is not."""
    required: str | None = None
    """The reason when the field is absent or null; None for an optional field."""


def type_name(value: Any) -> str:
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean", type(None): "null"}
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    return names.get(type(value), type(value).__name__)


def case_id_problem(value: Any) -> str | None:
    if type(value) is not str or not value.strip():
        return "required: a non-empty string"
    reason = limits.problem(limits.CASE_ID, value)
    return None if reason is None else f"{value[:60]!r} {reason} (an id is stored in MLflow and shown in reports)"


def _text(value: Any) -> str | None:
    """1 to MAX_TEXT characters, not blank."""
    if type(value) is not str:
        return f"expected a string, got {type_name(value)}"
    if not value.strip():
        return "must not be empty"
    if len(value) > MAX_TEXT:
        return f"too long: {len(value):,} characters (at most 1,000,000)"
    return None


def _string(value: Any) -> str | None:
    """Any string, empty included (a recorded answer may be empty)."""
    return None if type(value) is str else f"expected a string, got {type_name(value)}"


def _strings(value: Any) -> str | None:
    """A list of non-blank strings of at most MAX_TEXT characters."""
    return _text_list(value, blank=False)


def _passages(value: Any) -> str | None:
    """A list of strings of at most MAX_TEXT characters, empty ones included (retrieved text)."""
    return _text_list(value, blank=True)


def _text_list(value: Any, *, blank: bool) -> str | None:
    if type(value) is not list:
        return f"expected a list of strings, got {type_name(value)}"
    for index, item in enumerate(value):
        if type(item) is not str:
            return f"item {index} is {type_name(item)}, expected a string"
        if not blank and not item.strip():
            return f"item {index} is an empty string"
        if len(item) > MAX_TEXT:
            return f"item {index} is longer than 1,000,000 characters"
    return None


def _boolean(value: Any) -> str | None:
    return None if type(value) is bool else f"expected true or false, got {type_name(value)}"


def _citations(value: Any) -> str | None:
    """A list of 1-based integers (positions in the retrieved contexts); booleans are not numbers."""
    if type(value) is not list:
        return "expected a list of 1-based integers"
    for item in value:
        if type(item) is not int or item < 1:
            return "expected a list of 1-based integers"
    return None


def _seconds(value: Any) -> str | None:
    if type(value) not in (int, float) or value < 0:
        return "expected a non-negative number"
    return limits.seconds_problem(value)


def object_problem(value: Any) -> str | None:
    return None if type(value) is dict else f"expected an object, got {type_name(value)}"


GRADED = "graded"
"""The key of a ``human`` object that says which output its scores graded."""


_HEX64 = re.compile(r"[0-9a-f]{64}")


def _graded(value: Any) -> Reason | None:
    """``human.graded``: the sha256 of the graded output (see :func:`ragexp.records.graded_hash`),
    or that output itself, ``{"answer": str, "contexts": [str]}``."""
    at = f"human.{GRADED}"
    if type(value) is str:
        if _HEX64.fullmatch(value):
            return None
        return (
            at,
            f"expected the sha256 (64 lowercase hex digits) of the graded answer and contexts, got {value[:70]!r}",
        )
    if type(value) is not dict:
        return at, f"expected a sha256 or an object {{answer, contexts}}, got {type_name(value)}"
    for key in value:
        if key not in ("answer", "contexts"):
            return f"{at}.{key}", "unknown key (expected answer, contexts)"
    if "answer" not in value or _string(value["answer"]) is not None:
        return f"{at}.answer", "required: the graded answer (a string)"
    reason = _passages(value.get("contexts"))
    if reason is not None:
        return f"{at}.contexts", f"required: the contexts shown with the answer ({reason})"
    return None


def _human(value: Any) -> Reason | None:
    """``{metric: score}``: metrics that take human scores, each once, values in the metric's range;
    ``graded`` says which output they graded."""
    if type(value) is not dict:
        return f"expected an object {{metric: score}}, got {type_name(value)}"
    seen: set[str] = set()
    for name, score in value.items():
        if name == GRADED:
            reason = _graded(score)
            if reason is not None:
                return reason
            continue
        spec = labelled_metric(name)
        if spec is None:
            known = sorted(s.name for s in METRICS.values() if s.human_labels)
            close = difflib.get_close_matches(str(name), known, n=1)
            hint = f" (did you mean '{close[0]}'?)" if close else ""
            return f"human.{name}", f"not a metric that takes human scores{hint}: {', '.join(known)}"
        high = spec.high if spec.high is not None else math.inf
        if type(score) not in (int, float) or not spec.low <= score <= high:
            return f"human.{name}", f"expected a number in [{spec.low:g}, {high:g}], got {score!r}"
        if spec.name in seen:
            return f"human.{name}", f"repeats '{spec.name}'"
        seen.add(spec.name)
    return None


EVIDENCE_KEYS = ("doc", "span", "start", "end")


def _evidence(value: Any) -> Reason | None:
    """``[{"doc", "span"} | {"doc", "start", "end"}]``: text of a document, or offsets into it
    (checked against the documents once they are read, see :mod:`ragexp.datasets.evidence`)."""
    if type(value) is not list:
        return f"expected a list of {{doc, span}} or {{doc, start, end}} objects, got {type_name(value)}"
    seen: dict[tuple[Any, ...], int] = {}
    for index, item in enumerate(value):
        at = f"relevant[{index}]"
        key: tuple[Any, ...]
        if type(item) is not dict:
            return at, f"expected an object {{doc, span}} or {{doc, start, end}}, got {type_name(item)}"
        for name in item:
            if name not in EVIDENCE_KEYS:
                return f"{at}.{name}", f"unknown key (expected {', '.join(EVIDENCE_KEYS)})"
        doc = item.get("doc")
        if type(doc) is not str or not doc.strip():
            return f"{at}.doc", "required: the id of the document the evidence is in (a non-empty string)"
        span, start, end = item.get("span"), item.get("start"), item.get("end")
        if span is not None and (start is not None or end is not None):
            return at, "gives both span and offsets: one form per piece of evidence"
        if span is not None:
            reason = _text(span)
            if reason is not None:
                return f"{at}.span", reason
            key = (doc, span)
        else:
            for name, offset in (("start", start), ("end", end)):
                if offset is None:
                    return f"{at}.{name}", "required: give span (the text) or start and end (character offsets)"
                if type(offset) is not int or offset < 0:
                    return f"{at}.{name}", f"expected a non-negative integer, got {offset!r}"
            if end <= start:  # type: ignore[operator]  # both checked as integers above
                return f"{at}.end", f"must be greater than start ({start}), got {end}"
            key = (doc, start, end)
        if key in seen:
            return at, f"repeats relevant[{seen[key]}]"
        seen[key] = index
    return None


HOP_KEYS = ("relevant", "bridge")


MAX_HOPS = 9
"""Hops a case may give: each hop's metrics are logged apart (``recall_at_k.hop3``)."""


def _hops(value: Any) -> Reason | None:
    """``[{"relevant": [...], "bridge"?: str}, ...]``: each hop's gold, ids or evidence as the
    case's own (one form across the case's hops), and the entity it hands to the next hop."""
    if type(value) is not list or not value:
        return f"expected a non-empty list of {{relevant, bridge}} objects, got {type_name(value)}"
    if len(value) > MAX_HOPS:
        return f"at most {MAX_HOPS} hops, got {len(value)}"
    forms: set[bool] = set()
    for index, hop in enumerate(value):
        at = f"hops[{index}]"
        if type(hop) is not dict:
            return at, f"expected an object {{relevant, bridge}}, got {type_name(hop)}"
        for name in hop:
            if name not in HOP_KEYS:
                return f"{at}.{name}", f"unknown key (expected {', '.join(HOP_KEYS)})"
        relevant = hop.get("relevant")
        if type(relevant) is not list or not relevant:
            return f"{at}.relevant", "required: the hop's gold, a non-empty list of ids or {doc, span} evidence"
        ids = all(type(item) is str for item in relevant)
        forms.add(ids)
        if len(forms) > 1:
            return f"{at}.relevant", "ids in one hop, evidence in another: a case gives its gold in one form"
        reason = _strings(relevant) if ids else _evidence(relevant)
        if reason is not None:
            field, words = ("", reason) if isinstance(reason, str) else reason
            return f"{at}.relevant" + field.removeprefix("relevant"), words
        bridge = hop.get("bridge")
        if bridge is not None and (type(bridge) is not str or not bridge.strip()):
            return f"{at}.bridge", f"expected a non-empty string, got {bridge!r}"
    return None


def hop_union(hops: list[dict[str, Any]]) -> tuple[str, list[Any]]:
    """The case-level gold of checked ``hops``: the field it fills and the union of the hops'
    gold, in order, each item once."""
    seen: set[Any] = set()
    union: list[Any] = []
    ids = type(hops[0]["relevant"][0]) is str
    for hop in hops:
        for item in hop["relevant"]:
            key = item if ids else tuple(sorted(item.items()))
            if key not in seen:
                seen.add(key)
                union.append(item)
    return ("relevant_ids" if ids else "relevant"), union


def _draft(value: Any) -> Reason | None:
    """Provenance of a drafted case: its ``status`` is checked, its other keys kept as written."""
    if type(value) is not dict:
        return f"expected an object with 'status', got {type_name(value)}"
    status = value.get("status")
    if status not in DRAFT_STATUSES:
        return "draft.status", f"expected one of {', '.join(DRAFT_STATUSES)}, got {status!r}"
    return None


RULES: dict[str, FieldRule] = {
    rule.name: rule
    for rule in (
        FieldRule("id", "str", case_id_problem, required="required: a non-empty string"),
        FieldRule("question", "str", _text, required="required: a string of 1 to 1,000,000 characters"),
        FieldRule("relevant_ids", "list[str]", _strings),
        FieldRule("relevant", "list[object]", _evidence),
        FieldRule("expected_facts", "list[str]", _strings),
        FieldRule("reference", "str", _text),
        FieldRule("unanswerable", "bool", _boolean),
        FieldRule("response", "str", _string),
        FieldRule("retrieved_ids", "list[str]", _strings),
        FieldRule("retrieved_contexts", "list[str]", _passages),
        FieldRule("citations", "list[int]", _citations),
        FieldRule("latency_seconds", "number", _seconds),
        FieldRule("retrieved_doc_ids", "list[str]", _passages),
        FieldRule("metadata", "object", object_problem),
        FieldRule("human", "object", _human),
        FieldRule("draft", "object", _draft),
        FieldRule("hops", "list[object]", _hops),
    )
}
"""Every field a JSON Lines case may have, and what it may hold; the column format's columns
are checked by the rule of the field they fill (``user_input`` by ``question``'s)."""


REQUIRED = tuple((rule.name, rule.required) for rule in RULES.values() if rule.required is not None)


KNOWN_FIELDS = frozenset(RULES)


TURN_FIELDS = ("question", "relevant_ids", "relevant", "expected_facts", "unanswerable", "reference")
"""The fields a turn of a conversation may have, each checked by its rule in :data:`RULES`."""


CONVERSATION_FIELDS = ("id", "turns", "metadata")
"""The fields of a conversation case (``{"id", "turns": [...]}``); ``metadata`` fills every turn's templates."""


TURN_SEPARATOR = "#"
"""Between a conversation's id and a turn's 1-based position: ``conv-7#2``."""


def relevance_problem(unanswerable: bool, relevant: list[str], evidence: list[Any]) -> tuple[str, str] | None:
    """The one rule between fields: an answerable case is labelled once (ids or evidence), an
    unanswerable one is not labelled."""
    if relevant and evidence:
        return "relevant", "gives relevant_ids and relevant: a case gives its gold in one form, ids or evidence"
    if unanswerable and relevant:
        return "relevant_ids", "an unanswerable case must not have relevant ids"
    if unanswerable and evidence:
        return "relevant", "an unanswerable case must not have evidence"
    if not unanswerable and not relevant and not evidence:
        return "relevant_ids", "an answerable case needs at least one relevant id, or evidence in 'relevant'"
    return None


def unknown_field(key: str) -> str:
    close = difflib.get_close_matches(key, sorted(KNOWN_FIELDS), n=1)
    return "unknown field" + (f" (did you mean '{close[0]}'?)" if close else "")


MAX_TEXT = 1_000_000


DRAFT_STATUSES = ("draft", "screened")
"""``draft.status`` of a drafted case: ``draft`` until people screened it (see ``ragexp draft``)."""
