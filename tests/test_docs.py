"""The documentation holds together: every relative link and anchor resolves, and the README's
commands run as shown."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT

PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")


def _prose(text: str) -> str:
    """The page without its code blocks (a link inside one is an example, not a link)."""
    kept, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line.strip()):
            fenced = not fenced
            continue
        if not fenced:
            kept.append(line)
    return "\n".join(kept)


def _anchors(path: Path) -> set[str]:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens, repeats numbered."""
    found: set[str] = set()
    for line in _prose(path.read_text(encoding="utf-8")).splitlines():
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        slug = re.sub(r"[^\w\- ]", "", match.group(1).strip().lower()).replace(" ", "-")
        anchor, n = slug, 0
        while anchor in found:
            n += 1
            anchor = f"{slug}-{n}"
        found.add(anchor)
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_and_anchors_resolve(page: Path) -> None:
    assert page.is_file(), page
    broken = []
    for target in LINK.findall(_prose(page.read_text(encoding="utf-8"))):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):
            continue  # http(s), mailto: not checked offline
        path_part, _, anchor = target.partition("#")
        linked = (page.parent / path_part).resolve() if path_part else page
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
            broken.append(f"{target}: no such heading")
    assert broken == []


def test_readme_is_short_and_speaks_to_users() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 150
    assert "make run" in text and "make test" in text
    for page in PAGES:
        assert not re.search(r"\b(first|second) seed\b|\bthe seed's\b", page.read_text(encoding="utf-8")), page


def _readme_commands() -> list[list[str]]:
    commands, fenced = [], False
    for line in (ROOT / "README.md").read_text(encoding="utf-8").splitlines():
        if FENCE.match(line.strip()):
            fenced = not fenced
            continue
        if fenced and line.startswith("ragexp "):
            commands.append(shlex.split(line.split("  #")[0]))
    return commands


def test_readme_commands_run_as_shown(ragexp: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    commands = _readme_commands()
    assert [c[1] for c in commands][:6] == ["run", "run", "runs", "diff", "gate", "report"]
    ids: dict[str, str] = {}
    for command in commands:
        args = [arg.replace("/tmp/demo", str(tmp_path / "demo")) for arg in command[1:]]
        if ids:
            args = [ids.get(arg, arg) for arg in args]
        result = ragexp(*args)
        expected = {0, 2} if args[0] in {"gate", "demo"} else {0}
        assert result.code in expected, f"{' '.join(command)}: {result.stderr[-2000:]}"
        if args[0] == "runs" and not ids:
            listed = ragexp("runs", "--limit", "2", "--json").json()["runs"]
            ids = {"CANDIDATE_ID": listed[0]["run_id"], "BASELINE_ID": listed[1]["run_id"]}
            assert listed[0]["config_hash"] != listed[1]["config_hash"]
    assert (tmp_path / "report" / "report.html").is_file()


def _doc_commands() -> list[tuple[str, str]]:
    """(page, command line) for every ``ragexp`` command in a code block of ``docs/``."""
    found = []
    for page in sorted((ROOT / "docs").glob("*.md")):
        fenced = False
        for line in page.read_text(encoding="utf-8").splitlines():
            if FENCE.match(line.strip()):
                fenced = not fenced
                continue
            command = re.sub(r"^\s*(\$ )?(\.venv/bin/)?", "", line)
            if fenced and command.startswith("ragexp "):
                found.append((page.name, command.split("  #")[0].rstrip(" \\")))
    return found


def test_every_option_and_override_in_the_docs_is_exercised_by_a_test() -> None:
    # Commands that need a live service, an NPU or CI variables are run by the tests of their
    # subject (test_http, test_judge, test_release, test_scale); here each of their options and
    # override keys must appear in some test, so a documented spelling no test uses fails.
    sources = [p for p in (ROOT / "tests").glob("test_*.py") if p.name != "test_docs.py"]
    tests = "\n".join(p.read_text(encoding="utf-8") for p in sources)
    missing = []
    for page, command in _doc_commands():
        for token in (t.strip("[]") for t in command.split()[1:]):
            word = token.split("=", 1)[0] + "=" if "=" in token and not token.startswith("-") else token
            if re.fullmatch(r"--[a-z-]+|[a-z_+~/.]*[a-z_]=", word) and word.lstrip("+~") not in tests:
                missing.append(f"{page}: {word}")
    assert missing == []


def test_gate_and_sample_pages_commands_run_as_shown(
    ragexp: Any, tmp_path: Path, store_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ragexp.tracking.store import Store

    monkeypatch.chdir(tmp_path)
    base = ragexp("run", "--json").json()["run_id"]
    cand = ragexp("run", "provider.system.sample.chunking=sentence", "--json").json()["run_id"]
    Store(store_uri).set_tags(base, {"role": "production"})
    ids = {"BASELINE_ID": base, "B": base, "CANDIDATE_ID": cand, "C": cand}
    commands = [c for page, c in _doc_commands() if page in {"gates.md", "sample.md"}]
    assert len(commands) == 6
    for command in commands:
        args = [ids.get(arg, arg) for arg in shlex.split(command)[1:]]
        result = ragexp(*args)
        assert result.code in ({0, 2} if args[0] in {"gate", "demo"} else {0}), f"{command}: {result.stderr[-2000:]}"
    assert (tmp_path / "gate.xml").is_file() and (tmp_path / "gate.md").is_file()
    assert (tmp_path / "ragexp-demo").is_dir()
