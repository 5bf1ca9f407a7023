"""A rationale as a code: the phrases it is made of and what fills them, rendered in any language.

:mod:`ragexp.metrics.reasons` writes each offline rationale twice: as text in the run's language
(``cases.jsonl``'s ``rationale``, the trace assessment's ``rationale`` the MLflow UI shows) and as a
code (``cases.jsonl``'s ``rationale_codes``) that :func:`render` turns into the same sentence in
either language. ``report --language`` and ``diff`` read the code, so a run made in one language
is read in another.

A code is JSON: a list of parts, joined by ``; `` (``；`` in Chinese). A part is
``[key, *args]``: ``key`` a phrase of :data:`ragexp.phrases.PHRASES`, ``args`` its placeholders
in the order the English phrase names them (:data:`FIELDS`). An argument is a number or a string
(put in as it is) or an object:

- ``{"q": text}``: ``text`` quoted (``"text"``, ``「text」`` in Chinese), already cut to length;
- ``{"ranks": [1, 3]}``: the ranks, ``1, 3`` (the phrase ``none`` when there are none);
- ``[item, ...]``: the items joined by ``, `` (``、`` in Chinese); ``{"items": [item, ...],
  "more": n}``: the same, then ``and n more``.

An item is a string, ``{"q": text}``, ``{"p": part}`` (a phrase), ``{"t": text, "p": part}``
(``text (phrase)``) or ``{"t": text, "q": span}`` (``text "span"``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from string import Formatter
from typing import Any

from ragexp.phrases import PHRASES

Code = Sequence[Sequence[Any]]
"""One rationale: its parts (module docstring); lists or tuples, JSON arrays either way."""

KEY = "rationale_codes"
"""The ``cases.jsonl`` key of a case's codes: ``{metric: code}`` (the text is under ``rationale``)."""

SEP = {"zh": "、", "en": ", "}
"""Between listed items."""
JOIN = {"zh": "；", "en": "; "}
"""Between the parts of one rationale."""

FIELDS: dict[str, tuple[str, ...]] = {
    key: tuple(dict.fromkeys(name for _, name, _, _ in Formatter().parse(text["en"]) if name))
    for key, text in PHRASES.items()
}
"""Phrase -> its placeholders in the order the English phrase names them: a part's arguments."""


class CaseCodes(Mapping[str, Code]):
    """One case's codes, metric -> code, read from the run's columns (a list per metric, over the
    cases :func:`ragexp.metrics.reasons.fill_rationales` was given) rather than a dict per case:
    a run of many cases keeps one reference a case."""

    __slots__ = ("columns", "index")

    def __init__(self, columns: dict[str, list[Code | None]], index: int) -> None:
        self.columns = columns
        self.index = index

    def __getitem__(self, name: str) -> Code:
        code = self.columns[name][self.index]
        if code is None:
            raise KeyError(name)
        return code

    def __iter__(self) -> Iterator[str]:
        return (name for name, column in self.columns.items() if column[self.index] is not None)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def to_json(self) -> dict[str, Code]:
        i = self.index
        return {name: code for name, column in self.columns.items() if (code := column[i]) is not None}


def quote(text: str, language: str) -> str:
    return f"「{text}」" if language == "zh" else f'"{text}"'


def render(code: Code, language: str) -> str:
    """The rationale ``code`` in ``language`` (``en`` or ``zh``)."""
    return JOIN[language].join(_part(part, language) for part in code)


def _part(part: Sequence[Any], language: str) -> str:
    key, *args = part
    text = PHRASES[key][language]
    if not args:
        return text
    return text.format(**{name: _arg(arg, language) for name, arg in zip(FIELDS[key], args, strict=True)})


def _arg(arg: Any, language: str) -> object:
    if isinstance(arg, list | tuple):
        return SEP[language].join(_item(item, language) for item in arg)
    if not isinstance(arg, dict):
        return arg
    if "q" in arg:
        return quote(arg["q"], language)
    if "ranks" in arg:
        return ", ".join(str(rank) for rank in arg["ranks"]) if arg["ranks"] else PHRASES["none"][language]
    listed = SEP[language].join(_item(item, language) for item in arg["items"])
    more = arg.get("more")
    return listed + PHRASES["reason_more"][language].format(n=more) if more else listed


def _item(item: Any, language: str) -> str:
    if isinstance(item, str):
        return item
    if "t" not in item:
        return quote(item["q"], language) if "q" in item else _part(item["p"], language)
    if "q" in item:
        return f"{item['t']} {quote(item['q'], language)}"
    return f"{item['t']} ({_part(item['p'], language)})"


def rendered(row: dict[str, Any], language: str) -> tuple[dict[str, str], list[str]]:
    """A ``cases.jsonl`` row's rationales, metric -> text: rendered in ``language`` from the row's
    code where it has one, its recorded text otherwise; and the metrics whose text is shown as
    recorded (a run written before rationales had codes, a custom or judge metric's own words)."""
    said = row.get("rationale")
    texts = {str(k): str(v) for k, v in said.items() if v is not None} if isinstance(said, dict) else {}
    codes = row.get(KEY)
    done = set()
    if isinstance(codes, dict):
        for name, code in codes.items():
            try:
                texts[str(name)] = render(code, language)
            except (KeyError, TypeError, ValueError, IndexError, AttributeError):
                continue  # a code this version cannot read: its recorded text stays
            done.add(str(name))
    return texts, [name for name in texts if name not in done]
