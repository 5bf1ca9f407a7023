"""Settings the way users try them: ``ragexp init`` (inside a checkout of ragexp too), the store
option of every command, unknown keys, plain ``ragexp`` and ``--version``, what a run says after
its tables."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from ragexp.errors import ConfigError
from tests.conftest import ROOT, invoke


def tree(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` with its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def checkout_copy(tmp_path: Path) -> Path:
    """A copy of what makes a checkout of ragexp: its pyproject.toml, conf/ and .gitignore."""
    copy = tmp_path / "ragexp-clone"
    copy.mkdir()
    shutil.copy(ROOT / "pyproject.toml", copy / "pyproject.toml")
    shutil.copytree(ROOT / "conf", copy / "conf")
    shutil.copy(ROOT / ".gitignore", copy / ".gitignore")
    return copy


# --- ragexp init ----------------------------------------------------------------------------------


def test_init_inside_a_checkout_of_ragexp_refuses_in_one_line_and_writes_where_named(
    ragexp: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clone = checkout_copy(tmp_path)
    before = tree(clone)
    monkeypatch.chdir(clone)
    refused = ragexp("init")
    assert refused.code == 1
    assert refused.stderr.splitlines() == [
        f"ragexp: error: ragexp init .: {clone} is a checkout of ragexp itself (its conf/ is ragexp's packaged "
        "config tree); name a folder of your own project (ragexp init PATH)"
    ]
    assert tree(clone) == before  # neither conf/ nor the tracked .gitignore changed
    # Into the packaged tree of this very installation, or the package: refused the same way.
    from ragexp.cli.init import plan_init

    for inside, what in [(ROOT / "conf" / "mine", "is ragexp's packaged config tree"), (ROOT / "ragexp", "package")]:
        with pytest.raises(ConfigError, match=what):
            plan_init(inside)
    # Where the user names a folder of their own, it writes there, and that folder's conf/ is theirs.
    named = ragexp("init", str(tmp_path / "my-project"))
    assert named.code == 0, named.stderr
    assert (tmp_path / "my-project/conf/dataset/my_set.yaml").is_file() and tree(clone) == before
    monkeypatch.chdir(tmp_path / "my-project")
    assert ragexp("validate", "dataset=my_set").code == 0


def test_a_checkouts_conf_is_never_taken_for_a_users(ragexp: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # In a checkout of ragexp other than the installed one, ./conf is ragexp's packaged tree: it is
    # not composed over the installed tree (no "replaces the packaged ..." note for each file).
    clone = checkout_copy(tmp_path)
    monkeypatch.chdir(clone)
    checked = ragexp("validate")
    assert checked.code == 0, checked.stderr
    assert "replaces the packaged" not in checked.stderr and checked.stderr == ""
    # Named explicitly, it is refused in one line rather than half used.
    monkeypatch.setattr("os.environ", dict(__import__("os").environ))  # the option sets RAGEXP_CONFIG_DIR
    named = ragexp("validate", "--config-dir", str(clone / "conf"))
    assert named.code == 1
    assert named.stderr.splitlines() == [
        f"ragexp: error: {clone / 'conf'}: the conf/ of a checkout of ragexp (ragexp's packaged config tree), "
        "not a config folder of your own (--config-dir / RAGEXP_CONFIG_DIR)"
    ]


def test_init_writes_nothing_before_it_refuses(ragexp: Any, tmp_path: Path) -> None:
    cases = {
        # a starter file's path is a folder (the last one planned)
        "taken": lambda p: (p / "data/my_set.jsonl").mkdir(parents=True),
        # a starter file's folder is a file
        "blocked": lambda p: (p.mkdir(), (p / "data").write_text("x", encoding="utf-8")),
        # the .gitignore to append to is not text
        "binary-ignore": lambda p: (p.mkdir(), (p / ".gitignore").write_bytes(b"\xff\xfe\x00mlruns")),
    }
    messages = {
        "taken": "cannot write {p}/data/my_set.jsonl (a folder is there)",
        "blocked": "cannot write {p}/data/my_set.jsonl ({p}/data is a file)",
        "binary-ignore": "cannot read {p}/.gitignore (not UTF-8 text)",
    }
    for name, make in cases.items():
        folder = tmp_path / name
        make(folder)
        before = tree(folder)
        result = ragexp("init", str(folder), "--force")
        assert result.code == 1, name
        assert result.stderr.splitlines() == [
            f"ragexp: error: ragexp init {folder}: " + messages[name].format(p=folder)
        ], name
        assert tree(folder) == before, name
        assert not (folder / "conf").exists(), name
