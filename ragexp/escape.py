"""Text that leaves the process, escaped for where it lands: one function per destination.

Case ids, answers, error bodies, run names and tag values come from users' datasets and
services. Wherever such text is shown it must stay text: never move the terminal's cursor, clear
its screen or open a hyperlink (:func:`terminal`), never become a link, an image or HTML in a
pull-request summary or ``report.md`` (:func:`markdown`), never break a JUnit file
(:func:`xml`) or a page (:func:`html`).

Characters that are invisible or that change how the text around them is shown (C0 and C1
controls, DEL, bidirectional overrides and isolates, line and paragraph separators) are made
visible the way Python writes them (``\\x1b``, ``\\u202e``) in every destination, so what a
reader sees is what the data holds.
"""

from __future__ import annotations

import html as _html
import re
import unicodedata
from collections.abc import Iterable

_INVISIBLE = re.compile(
    "[\x00-\x1f\x7f-\x9f\xad\u061c\u180e\u200b-\u200f\u2028\u2029\u202a-\u202e\u2060-\u2064\u2066-\u2069"
    "\ufeff\ufffe\uffff\ud800-\udfff]"
)
"""Controls, soft hyphen, zero-width spaces and joiners, bidi marks, overrides and isolates,
separators, word joiner and invisible operators, BOM, non-characters, lone surrogates."""

_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}

_MARKDOWN_SYNTAX = re.compile(r"[\\`*\[\]<!|~$&@#]|_+|:(?=//)|(?<![\w.])www\.")
"""What can start Markdown or HTML inside a line: a link, an image or a footnote (``[ ] !``), an
autolink (``<``, the ``:`` of ``http://``, ``www.``, the ``@`` of an address), code, emphasis,
strikethrough, a table cell, an entity, math, an issue reference. CommonMark lets a backslash make
any ASCII punctuation literal; what cannot start anything without one of these stays as it is, for
readability: ``( ) . , - + = > /``, other colons, and ``_`` inside a word (``recall_at_k``),
which is never emphasis."""
_MARKDOWN_LINE_START = re.compile(r"^(?:[>+=]|-(?=\s|$|-)|\d{1,9}(?=[.)](?:\s|$)))")
"""What starts a block at the beginning of a line: a quote, a list item, a rule, a heading underline."""


def _visible(text: str, keep: str = "") -> str:
    def one(match: re.Match[str]) -> str:
        ch = match.group(0)
        if ch in keep:
            return ch
        if ch in _NAMED:
            return _NAMED[ch]
        code = ord(ch)
        return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"

    return _INVISIBLE.sub(one, text)


def folded(text: str) -> str:
    """``text`` as a reader sees it: NFC, invisible characters dropped. Two names with the same
    folded form look the same on every screen though they differ (NFC and NFD, a zero-width space)."""
    if text.isascii() and text.isprintable():
        return text
    return unicodedata.normalize("NFC", _INVISIBLE.sub("", text))


def code_points(text: str) -> str:
    """``text`` as its code points (``U+0065 U+0301``): what tells look-alike names apart."""
    return " ".join(f"U+{ord(ch):04X}" for ch in text)


def look_alike(wanted: str, known: Iterable[str]) -> str | None:
    """The first of ``known`` that looks the same as ``wanted`` (the same :func:`folded` form)
    though written with other code points; None when there is none."""
    target = folded(wanted)
    return next((name for name in known if name != wanted and folded(name) == target), None)


def other_code_points(name: str, other: str) -> str:
    """How two look-alike names differ, for a message."""
    return f"written with other code points ({code_points(name)}, not {code_points(other)})"


def terminal(text: object) -> str:
    """One value for a terminal line: every control character shown as an escape, so an ESC
    sequence, an OSC-8 hyperlink, a carriage return or a newline in it cannot rewrite the
    screen or forge a line."""
    return _visible(str(text))


def markdown(text: object, *, code: bool = False) -> str:
    """One value for GitHub-flavoured Markdown (a summary's line or table cell, ``report.md``).

    White space runs become one space (a cell is one line). Plain (default): every character
    that could start Markdown or HTML is backslash-escaped, so the value renders as the text it is.
    ``code=True``: the value as a code span, whose fence is longer than any run of backticks in
    it (inside a code span nothing is a link, an image or HTML); ``|`` is escaped there too,
    as GitHub's tables split cells on it even inside code.
    """
    flat = " ".join(_visible(str(text), keep="\t\n\r").split())
    if not code:
        escaped = _MARKDOWN_SYNTAX.sub(_markdown_escape, flat)
        # "1. x" is escaped after the number ("1\. x"), the others before their character.
        return _MARKDOWN_LINE_START.sub(
            lambda m: m.group(0) + "\\" if m.group(0).isdigit() else "\\" + m.group(0), escaped
        )
    if not flat:
        return "` `"
    longest = max((len(run) for run in re.findall(r"`+", flat)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if flat.startswith("`") or flat.endswith("`") else ""
    return f"{fence}{pad}{flat.replace('|', chr(92) + '|')}{pad}{fence}"


def _markdown_escape(match: re.Match[str]) -> str:
    found, text = match.group(0), match.string
    if found.endswith("."):
        return "www\\."
    if found.startswith("_"):
        before = text[match.start() - 1] if match.start() > 0 else " "
        after = text[match.end()] if match.end() < len(text) else " "
        if before.isalnum() and after.isalnum():
            return found
        return "\\_" * len(found)
    return "\\" + found


def xml(text: object) -> str:
    """A value for an XML attribute or text (the JUnit report; the serializer escapes ``<&>"``).

    XML 1.0 cannot hold most control characters even as references; they are shown as escapes
    like in every other destination. Tabs and newlines stay (a failure's details have lines)."""
    return _visible(str(text), keep="\t\n")


def html(text: object) -> str:
    """A value for HTML text or a quoted attribute: markup characters as entities, invisible
    characters as escapes."""
    return _html.escape(_visible(str(text), keep="\t\n"), quote=True)


_PROMPT_TAG: dict[str, re.Pattern[str]] = {}


def prompt_block(text: object, tag: str) -> str:
    """Text inside a ``<tag ...>`` block of a model prompt (the draft prompts' ``<chunk>``): every
    ``<tag`` or ``</tag`` in it (any case, spaces allowed) has its ``<`` written ``&lt;``, so a
    document cannot close its own block or open a forged one. Everything else stays verbatim:
    the model copies facts from the text character for character."""
    pattern = _PROMPT_TAG.get(tag)
    if pattern is None:
        pattern = _PROMPT_TAG[tag] = re.compile(rf"<(?=\s*/?\s*{re.escape(tag)}\b)", re.IGNORECASE)
    return pattern.sub("&lt;", str(text))


def prompt_attribute(text: object) -> str:
    """A value for a double-quoted attribute of a prompt's tag (a chunk's id): ``& < > "`` as
    entities, line breaks and other invisible characters as escapes, so it stays one attribute."""
    return _html.escape(_visible(str(text)), quote=True)
