"""Text from users' data and services that leaves the process stays text wherever it lands.

The same hostile strings go through every destination's escaping function (terminal, Markdown,
XML, HTML), each output checked by a real parser of that destination; then hostile case ids and a
service's hostile body go through real runs into ``diff`` and ``validate`` output, the
``--summary`` of ``diff`` and ``gate``, the JUnit file and ``report.md``/``report.html``.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
import xmlschema
from markdown_it import MarkdownIt
from markdown_it.token import Token

from ragexp import escape
from tests.conftest import ROOT, write_jsonl
from tests.servers.faulty import HOSTILE_BODY
from tests.servers.procs import FAULTY, serve
from tests.test_http import labelled

HOSTILE = [
    "\x1b[2J\x1b[31mred\x1b[0m",
    "\x1b]8;;http://evil.example/\x1b\\click here\x1b]8;;\x1b\\",
    "\x1b]8;;http://evil.example/\x07bel-terminated\x1b]8;;\x07",
    "over\rwrite",
    "nul\x00byte and \x7f del and \x9b csi",
    "bidi \u202eevil\u202c and \u2066isolate\u2069",
    "[x](javascript:alert(1))",
    "![i](http://evil.example/p.png)",
    "[ref]: http://evil.example/",
    "<script>alert(1)</script>",
    '<img src=x onerror="alert(1)">',
    "<http://evil.example/autolink>",
    "http://evil.example/bare and www.evil.example and mail@evil.example",
    "`tick` and ``double`` and a lone `",
    "a|b|c",
    "line one\nline two\n\n# heading\n- item\n1. item",
    "]]> <![CDATA[x]]> &amp; &lt;b&gt;",
    "*em* _em_ **strong** ~~gone~~ $math$ [^1]",
    "- leading dash",
    "---",
    "42. numbered",
    "back\\slash \\[x\\]",
    "中文 [链接](http://evil.example/) 结束",
]
"""One string per trick: terminal control, hyperlinks, Markdown links and images, HTML, XML."""

INVISIBLE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
MARKUP_TOKENS = {"link_open", "image", "html_inline", "html_block", "em_open", "strong_open", "s_open", "heading_open"}


def visible(text: str) -> str:
    """What every destination shows for ``text``: invisible characters as Python writes them."""
    return INVISIBLE.sub(lambda m: {"\n": "\\n", "\r": "\\r", "\t": "\\t"}.get(m.group(0), _code(m.group(0))), text)


def _code(ch: str) -> str:
    return f"\\x{ord(ch):02x}" if ord(ch) < 0x100 else f"\\u{ord(ch):04x}"


def one_line(text: str) -> str:
    """Markdown is one line a value: the visible text with each run of white space one space."""
    return " ".join(visible(text.replace("\n", " ").replace("\r", " ").replace("\t", " ")).split(" ")).strip()


def flat(tokens: list[Token]) -> list[Token]:
    found = []
    for token in tokens:
        found.append(token)
        found += flat(token.children or [])
    return found


def gfm() -> MarkdownIt:
    return MarkdownIt("commonmark").enable(["table", "strikethrough"])


def cells(tokens: list[Token]) -> list[list[Token]]:
    """The inline children of each body cell."""
    out, inside = [], False
    for token in tokens:
        if token.type == "tbody_open":
            inside = True
        if inside and token.type == "inline":
            out.append(token.children or [])
    return out


@pytest.mark.parametrize("text", HOSTILE)
def test_every_destination_shows_the_same_hostile_string_as_text(text: str) -> None:
    # Terminal: nothing invisible reaches it; what is printable is kept as it is.
    shown = escape.terminal(text)
    assert INVISIBLE.search(shown) is None
    assert shown == visible(text)

    expected = " ".join(one_line(text).split())
    md = gfm()
    # Markdown, plain: in a table cell and in a paragraph, it is exactly one text, never markup.
    plain = escape.markdown(text)
    assert "\n" not in plain and INVISIBLE.search(plain) is None
    for source in (f"| h |\n|---|\n| {plain} |\n", f"before\n\n{plain}\n"):
        tokens = md.parse(source)
        assert MARKUP_TOKENS.isdisjoint(t.type for t in flat(tokens)), source
        assert not any(t.type in {"bullet_list_open", "ordered_list_open", "hr", "code_inline"} for t in flat(tokens))
        inline = [t for t in tokens if t.type == "inline"][-1]
        assert "".join(c.content for c in inline.children or [] if c.type == "text") == expected, source
    rows = cells(md.parse(f"| h |\n|---|\n| {plain} |\n"))
    assert len(rows) == 1  # the pipes in it did not make more columns
    # GitHub also links bare addresses (its autolink extension, not in CommonMark): each is broken
    # by an escape. (The summaries show data as code spans, which nothing links.)
    assert re.search(r"(?<!\\)://|(?<![\w.\\])www\.|(?<!\\)@", plain) is None

    # Markdown, as code: one code span holding the text, in a cell and in a line.
    code = escape.markdown(text, code=True)
    for source in (f"| h |\n|---|\n| {code} |\n", f"- case {code} here\n"):
        children = [t for t in flat(md.parse(source)) if t.type not in {"text"} and t.nesting == 0]
        spans = [t for t in children if t.type == "code_inline"]
        assert len(spans) == 1 and MARKUP_TOKENS.isdisjoint(t.type for t in children), source
        content = spans[0].content if source.startswith("|") else spans[0].content.replace("\\|", "|")
        assert content.strip() == expected.strip(), source

    # XML: an attribute and a text of a real document, parsed back to the visible text.
    element = ET.Element("testcase", {"name": escape.xml(text)})
    element.text = escape.xml(text)
    parsed = ET.fromstring(ET.tostring(element, encoding="utf-8"))
    assert parsed.get("name") == parsed.text == visible(text).replace("\\n", "\n").replace("\\t", "\t")

    # HTML: no element but the one it is put in, and the text the reader sees is the visible text.
    page = Page()
    page.feed(f"<td>{escape.html(text)}</td>")
    page.close()
    assert page.tags == ["td"]
    assert "".join(page.text) == visible(text).replace("\\n", "\n").replace("\\t", "\t")


class Page(HTMLParser):
    """Start tags, attributes and text of an HTML document, as a browser's tokenizer sees them."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[str] = []
        self.attributes: list[tuple[str, str | None]] = []
        self.text: list[str] = []
        self.scripts: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        self.attributes += attrs
        self._in_script = tag == "script"

    def handle_endtag(self, tag: str) -> None:
        self._in_script = False

    def handle_data(self, data: str) -> None:
        (self.scripts if self._in_script else self.text).append(data)


# --- through real runs ---------------------------------------------------------------------------

HOSTILE_IDS = [
    "hostile-[x](javascript:alert(1))",
    "hostile-![i](http://evil.example/p.png)",
    "hostile-<script>alert(1)</script>",
    "hostile-`tick`|pipe",
    "hostile-\u202eevil",
]
"""Case ids the candidate's service answers with HOSTILE_BODY (an error for each)."""


def no_raw_controls(text: str) -> bool:
    return "\x1b" not in text and "\u202e" not in text and "\r" not in text and "\x07" not in text


@pytest.fixture
def hostile_pair(ragexp: Any, tmp_path: Path) -> tuple[str, str]:
    """A perfect baseline and a candidate whose service errs with a hostile body on the hostile ids
    and answers the others with text taken from their ids (HTML among it)."""
    ids = ["ok-<img src=x onerror=alert(1)>", "ok-<script>alert(2)</script>", "ok-1", *HOSTILE_IDS]
    rows = labelled(ids)
    for row in rows[:2]:  # answered wrongly, so that the report lists them (and their answers) as worst
        row.update(relevant_ids=["rel-none"], expected_facts=["no such fact"])
    data = write_jsonl(tmp_path / "cases.jsonl", rows)
    common = [f"dataset.path={data}", "k=2", "--json"]
    base = ragexp("run", "provider=fake", *common)
    assert base.code == 0, base.stderr
    with serve(FAULTY) as url:
        cand = ragexp("run", "provider=http", f"provider.system.url={url}", "provider.system.max_retries=0", *common)
    assert cand.code == 0, cand.stderr
    assert cand.json()["error_count"] == len(HOSTILE_IDS)
    return base.json()["run_id"], cand.json()["run_id"]


@pytest.mark.system
def test_hostile_ids_and_bodies_stay_text_in_summaries_junit_report_and_terminal(
    ragexp: Any, hostile_pair: tuple[str, str], tmp_path: Path
) -> None:
    base, cand = hostile_pair
    md = gfm()

    # diff on the terminal: escapes are shown, never sent.
    shown = ragexp("diff", base, cand)
    assert shown.code == 0, shown.stderr
    assert no_raw_controls(shown.stdout) and no_raw_controls(shown.stderr)
    assert "\\x1b[2J\\x1b[31mred" in shown.stdout and "hostile-\\u202eevil" in shown.stdout

    # --summary of diff and gate: the ids as code, the bodies as text; no link, image or HTML.
    diff_md, gate_md, junit = tmp_path / "diff.md", tmp_path / "gate.md", tmp_path / "gate.xml"
    assert ragexp("diff", base, cand, "--summary", str(diff_md), "--language", "en").code == 0
    gated = ragexp("gate", "--baseline", base, "--candidate", cand, "--summary", str(gate_md), "--junit", str(junit))
    assert gated.code == 2, gated.stderr
    worst = ragexp("diff", base, cand, "--json", "--top", "5").json()["cases"]
    listed = {visible(case["id"]) for case in worst}
    assert len(listed) == 5 and len(listed & {visible(i) for i in HOSTILE_IDS}) >= 3
    for path in (diff_md, gate_md):
        text = path.read_text(encoding="utf-8")
        assert no_raw_controls(text)
        tokens = flat(md.parse(text))
        assert not {t.type for t in tokens} & {"link_open", "image", "html_block"}
        assert all(t.content in {"<sub>", "</sub>"} for t in tokens if t.type == "html_inline")  # the footer's
        code = {t.content for t in tokens if t.type == "code_inline"}
        assert listed <= code, (listed - code, path)
        assert "://" not in re.sub(r"`+[^`]*`+", "", text)  # no bare address outside code for GitHub to link
        # The body is shown in full (as far as a cell shows it), as text.
        body = one_line(HOSTILE_BODY)[:60]
        assert any(body in "".join(c.content for c in row) for row in _texts(md.parse(text)))

    # JUnit: valid against the schema, every rule a test case, nothing raw in it.
    xmlschema.XMLSchema(ROOT / "tests/schemas/junit-10.xsd").validate(str(junit))
    assert no_raw_controls(junit.read_text(encoding="utf-8"))

    # report.md and report.html: the answers' HTML and the ids stay text.
    out = tmp_path / "report"
    made = ragexp("report", cand, "--baseline", base, "--out", str(out), "--language", "en")
    assert made.code == 0, made.stderr
    report_md = (out / "report.md").read_text(encoding="utf-8")
    assert no_raw_controls(report_md)
    tokens = flat(md.parse(report_md))
    assert not {t.type for t in tokens} & {"link_open", "html_inline", "html_block"}
    assert all(t.attrs.get("src", "").startswith("plots/") for t in tokens if t.type == "image")
    words = "".join(t.content for t in tokens if t.type == "text")
    assert "fact <img src=x onerror=alert(1)>. [1]" in words and "fact <script>alert(2)</script>. [1]" in words
    assert "hostile-[x](javascript:alert(1))" in words and one_line(HOSTILE_BODY)[:60] in words
    page = Page()
    page.feed((out / "report.html").read_text(encoding="utf-8"))
    assert page.tags.count("script") == 1  # the page's own check, in <head>
    assert "img" not in page.tags and not any(name.startswith("on") for name, _ in page.attributes)
    assert "alert(2)" not in "".join(page.scripts) and "<script>alert(2)</script>" in "".join(page.text)


@pytest.mark.parametrize("text", HOSTILE)
def test_a_review_preview_shows_a_hostile_answer_fact_and_context_as_text(text: str) -> None:
    """The trace's response preview is Markdown the MLflow UI renders: the answer, an expected
    fact, a retrieved id and its context from data stay text, and the list stays one list."""
    from ragexp.case_traces import CaseTrace, review_preview

    case = CaseTrace("c1", "q", text, None, 0.1, [text, "d2"], [text, "second"], {}, {"expected_facts": [text, "f2"]})
    preview = review_preview(case)
    assert len(preview) <= 1000 and no_raw_controls(preview)
    tokens = flat(gfm().parse(preview))
    types = [t.type for t in tokens]
    assert (MARKUP_TOKENS - {"strong_open"}).isdisjoint(types), preview
    # Its own markup only: two bold labels (expected facts, contexts), one list item per id.
    assert types.count("strong_open") == 2 and types.count("list_item_open") == 2, preview
    words = "".join(t.content for t in tokens if t.type in ("text", "code_inline"))
    assert " ".join(one_line(text).split()) in words, (words, preview)


def _texts(tokens: list[Token]) -> list[list[Token]]:
    return [t.children or [] for t in tokens if t.type == "inline"]


def test_validate_shows_escapes_from_labels_and_ids(ragexp: Any, tmp_path: Path) -> None:
    # The label audit quotes a relevant id the corpus lacks; a duplicate id is quoted too.
    data = write_jsonl(
        tmp_path / "v.jsonl",
        [{"id": "c1", "question": "q", "relevant_ids": ["a\x1b[2J\x1b]8;;http://evil.example/\x07x"]}],
    )
    corpus = write_jsonl(tmp_path / "corpus.jsonl", [{"id": "b", "text": "t"}])
    checked = ragexp("validate", "--path", str(data), "--corpus", str(corpus))
    assert checked.code == 0, checked.stderr
    assert no_raw_controls(checked.stdout + checked.stderr)
    assert "relevant id 'a\\x1b[2J\\x1b]8;;http://evil.example/\\x07x' is not in the corpus" in checked.stdout
    twice = write_jsonl(tmp_path / "twice.jsonl", [{"id": "d\x1b[1m", "question": "q", "relevant_ids": ["r"]}] * 2)
    refused = ragexp("validate", "--path", str(twice))
    assert refused.code == 1 and no_raw_controls(refused.stderr) and "\\x1b[1m" in refused.stderr


def test_terminal_tables_show_escapes_and_keep_their_columns() -> None:
    from ragexp.cli.render import table

    text = table(["id", "why"], [["a\x1b[2Jb", "x\ny"], ["中文", "ok"]])
    lines = text.splitlines()
    assert len(lines) == 4 and no_raw_controls(text)
    assert lines[2] == "a\\x1b[2Jb  x\\ny" and lines[3].startswith("中文")
