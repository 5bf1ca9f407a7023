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
