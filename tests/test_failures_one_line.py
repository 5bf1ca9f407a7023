"""Every user-facing failure is one line, and a gate that checks nothing does not pass.

Malformed or binary YAML in a user's config folder, an ``init`` target that cannot be written,
Ctrl-C at any moment of start-up (a real process, signalled at several moments), a gate whose
rules bound nothing, a user file that silently replaces a packaged option, and credentials in a
printed tracking URI.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from ragexp.secrets import mask_url
from tests.conftest import write_jsonl
from tests.test_compare import replay_rows, run_replay

RAGEXP = Path(sys.executable).parent / "ragexp"
"""The installed console script: what a user's shell starts."""


def one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    return lines[0]


# --- YAML in a user's config folder -------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"name: release\nrules: {recall_at_k: {max_drop: 0.1}\n  bad: [\n", "line 3, column 3: invalid YAML"),
        (b"name: release\nrules:\n  mrr: {max_drop: 0.1\n", "line 4, column 1: invalid YAML"),
        (b"name: release\n\tbad: tab\n", "line 2, column 1: invalid YAML"),
        (b"name: ok\n\x00\x01\xff\xfe binary", "line 2, column 3: not UTF-8 text (byte 0xff)"),
    ],
)
def test_malformed_or_binary_yaml_is_one_line_with_file_line_and_column(
    ragexp: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, content: bytes, expected: str
) -> None:
    conf = tmp_path / "conf"
    (conf / "gates").mkdir(parents=True)
    bad = conf / "gates/release.yaml"
    bad.write_bytes(content)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RAGEXP_CONFIG_DIR", raising=False)
    for command in (["validate"], ["gate", "--baseline", "some-run"], ["run", "provider=fake"]):
        result = ragexp(*command)
        assert result.code == 1, (command, result.stderr)
        assert one_line(result.stderr).startswith(f"ragexp: error: {bad}: {expected}"), result.stderr
        assert result.stdout == ""


@pytest.mark.system  # a whole run: `make test`, not the edit loop
def test_binary_yaml_in_a_real_process_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "conf/dataset").mkdir(parents=True)
    (tmp_path / "conf/dataset/mine.yaml").write_bytes(bytes(range(256)))
    env = {k: v for k, v in os.environ.items() if k not in {"RAGEXP_CONFIG_DIR", "RAGEXP_CONF_DIR"}}
    done = subprocess.run(
        [str(RAGEXP), "validate", "dataset=mine"], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 1
    assert "not UTF-8 text" in one_line(done.stderr) and "Traceback" not in done.stderr


# --- a gate that checks nothing ------------------------------------------------------------------


@pytest.fixture
def worse_pair(ragexp: Any, tmp_path: Path) -> tuple[str, str]:
    """A candidate clearly worse than its baseline: 7 of 30 cases lose their answer and rank."""
    base = run_replay(ragexp, write_jsonl(tmp_path / "base.jsonl", replay_rows([{"rank": 1}] * 30)))
    worse = [{"rank": 3, "correct": False}] * 7 + [{"rank": 1}] * 23
    cand = run_replay(ragexp, write_jsonl(tmp_path / "cand.jsonl", replay_rows(worse)))
    return base["run_id"], cand["run_id"]


@pytest.mark.system
@pytest.mark.parametrize(
    ("gate", "why"),
    [
        ("name: release\nrules: {}\nmax_error_rate: null\n", "has no rules"),
        ("name: release\nrules: {}\n", "has no rules"),  # max_error_rate alone says nothing of the scores
        ("name: release\nrules: {mrr: {statistical: true}}\n", "has rules that set no bound"),
    ],
)
def test_a_repository_gate_without_bounds_fails_in_one_line_and_its_replacement_is_said(
    ragexp: Any,
    worse_pair: tuple[str, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    gate: str,
    why: str,
) -> None:
    base, cand = worse_pair
    repository = tmp_path / "repo"
    (repository / "conf/gates").mkdir(parents=True)
    mine = repository / "conf/gates/release.yaml"
    mine.write_text(gate, encoding="utf-8")
    monkeypatch.chdir(repository)
    monkeypatch.delenv("RAGEXP_CONFIG_DIR", raising=False)
    result = ragexp("gate", "--baseline", base, "--candidate", cand)
    assert result.code == 1 and result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert lines[0] == f"note: {mine} replaces the packaged gates=release (used instead of it, not merged over it)"
    assert lines[1] == (
        f"ragexp: error: gates release: {why}, so it would pass any candidate; "
        "give at least one metric a bound (gates.rules.METRIC.max_drop=..., see docs/gates.md)"
    )
    assert len(lines) == 2
    # Refused before any work: nothing was recorded on the candidate.
    from mlflow.tracking import MlflowClient

    assert "ragexp.gate.verdict" not in MlflowClient().get_run(cand).data.tags
    # The same gate given a bound on the command line checks it, and fails the worse candidate.
    bounded = ragexp("gate", "--baseline", base, "--candidate", cand, "+gates.rules.mrr.max_drop=0.01")
    assert bounded.code == 2, bounded.stderr
    assert "replaces the packaged" not in bounded.stderr  # said once in a process


# --- ragexp init targets ---------------------------------------------------------------------------


def test_init_refuses_targets_it_cannot_write_in_one_line(ragexp: Any, tmp_path: Path) -> None:
    a_file = tmp_path / "notes.txt"
    a_file.write_text("x", encoding="utf-8")
    for target, message in [
        (a_file, f"ragexp init {a_file}: is a file, not a folder"),
        (a_file / "proj", f"ragexp init {a_file / 'proj'}: {a_file} is a file, not a folder"),
    ]:
        result = ragexp("init", str(target))
        assert result.code == 1 and one_line(result.stderr) == f"ragexp: error: {message}"
    # A starter file's path taken by a folder: one line, naming it.
    (tmp_path / "p/data/my_set.jsonl").mkdir(parents=True)
    taken = ragexp("init", str(tmp_path / "p"), "--force")
    assert taken.code == 1 and f"cannot write {tmp_path / 'p/data/my_set.jsonl'}" in one_line(taken.stderr)


@contextmanager
def read_only(folder: Path) -> Iterator[Path]:
    view = folder.parent / f"{folder.name}-ro"
    view.mkdir()
    mounted = subprocess.run(["mount", "--bind", "-o", "ro", str(folder), str(view)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot bind-mount read-only here ({mounted.stderr.decode().strip() or 'not root'})")
    try:
        yield view
    finally:
        subprocess.run(["umount", "-l", str(view)], check=False)


def test_init_on_a_read_only_folder_is_one_line_and_writes_nothing(ragexp: Any, tmp_path: Path) -> None:
    source = tmp_path / "shared"
    source.mkdir()
    with read_only(source) as view:
        for target in (view, view / "proj"):
            result = ragexp("init", str(target))
            assert result.code == 1
            assert one_line(result.stderr) == (
                f"ragexp: error: ragexp init {target}: cannot write into {view} (Read-only file system)"
            )
    assert list(source.iterdir()) == []


def test_init_quotes_the_cd_it_advises(ragexp: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = ragexp("init", "my project")
    assert result.code == 0, result.stderr
    assert result.stdout.splitlines()[1].strip() == "cd 'my project'"


# --- Ctrl-C at any moment ---------------------------------------------------------------------------


@pytest.mark.system
@pytest.mark.parametrize("delay", [0.0, 0.01, 0.05, 0.1, 0.2, 0.4, 0.8, 1.5])
def test_sigint_at_any_moment_of_start_up_is_one_line_and_exit_130(tmp_path: Path, delay: float) -> None:
    # Moments are counted from when Python has imported ragexp's entry point (Python's own
    # start-up before it is not ragexp's to handle): PYTHONPROFILEIMPORTTIME reports each import
    # on stderr as it completes. From there on: typer, Hydra, MLflow, composing, planning.
    env = {
        **os.environ,
        "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/mlruns/mlflow.db",
        "PYTHONPROFILEIMPORTTIME": "1",
    }
    env.pop("RAGEXP_CONFIG_DIR", None)
    proc = subprocess.Popen(
        [str(RAGEXP), "run", "provider=fake", "dataset=scifacts_zh"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    for line in proc.stderr:
        if line.startswith("import time:") and line.rsplit("|", 1)[-1].strip() == "ragexp.cli":
            break
    else:
        pytest.fail("the entry point was never imported")
    time.sleep(delay)
    proc.send_signal(signal.SIGINT)
    _, rest = proc.communicate(timeout=120)
    err = "".join(line for line in rest.splitlines(keepends=True) if not line.startswith("import time:"))
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert proc.returncode == 130, (proc.returncode, err)
    assert one_line(err).startswith("ragexp: interrupted"), err


# --- credentials in printed URIs ---------------------------------------------------------------------


@pytest.mark.system  # a whole run: `make test`, not the edit loop
def test_run_prints_the_tracking_uri_without_its_password(ragexp: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    server = os.environ.get("RAGEXP_TEST_MLFLOW_SERVER")
    if not server:
        pytest.skip("RAGEXP_TEST_MLFLOW_SERVER is not set")
    host = server.split("://", 1)[1]
    secret = "pw-Hunter2/+x"
    from urllib.parse import quote

    uri = f"http://alice:{quote(secret, safe='')}@{host}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    result = ragexp("run", "provider=fake", "dataset=scifacts_zh", "experiment=ragexp-i27-uri")
    assert result.code == 0, result.stderr
    text = result.stdout + result.stderr
    assert f"(http://***@{host})" in result.stdout
    assert "Hunter2" not in text and "alice" not in text


def test_every_spelling_of_a_secret_is_masked_in_values_and_mapping_keys() -> None:
    from urllib.parse import quote, quote_plus

    from ragexp import secrets

    token = "tok/en+Zq9=x y"
    secrets.register(token)
    lower_hex = re.sub(r"%[0-9A-F]{2}", lambda m: m.group(0).lower(), quote(token))  # %2b, as some encoders
    spellings = [token, quote(token), quote(token, safe=""), quote_plus(token), lower_hex]
    assert len(set(spellings)) == 5  # each encoding spells it differently
    for spelling in spellings:
        assert secrets.scrub(f"<{spelling}>") == "<***>", spelling
    echoed = {f"Bearer {quote(token)}": [{quote_plus(token): f"?t={quote(token, safe='')}"}], "n": 1}
    assert secrets.scrub_value(echoed) == {"Bearer ***": [{"***": "?t=***"}], "n": 1}


@pytest.mark.parametrize(
    ("uri", "shown"),
    [
        ("sqlite:///mlruns/mlflow.db", "sqlite:///mlruns/mlflow.db"),
        ("sqlite:////tmp/store/mlflow.db", "sqlite:////tmp/store/mlflow.db"),
        ("http://alice:pw@mlflow.example:5000", "http://***@mlflow.example:5000"),
        ("https://mlflow.example/?token=abc&x=1", "https://mlflow.example/?token=***&x=1"),
    ],
)
def test_a_printed_store_uri_is_masked_and_otherwise_intact(uri: str, shown: str) -> None:
    # A URI with nothing to mask is printed as given: rebuilding it dropped sqlite's empty authority.
    assert mask_url(uri) == shown
