"""Settings the way users try them: ``ragexp init`` (inside a checkout of ragexp too), the store
option of every command, unknown keys, plain ``ragexp`` and ``--version``, what a run says after
its tables."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from ragexp.config.models import ResponseMapping
from ragexp.errors import ConfigError
from tests.conftest import ROOT, invoke, write_jsonl
from tests.test_compare import replay_rows


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
    from ragexp.workflows.init import plan_init

    for inside, what in [(ROOT / "conf" / "mine", "is ragexp's packaged config tree"), (ROOT / "ragexp", "package")]:
        with pytest.raises(ConfigError, match=what):
            plan_init(inside)
    # Where the user names a folder of their own, it writes there, and that folder's conf/ is theirs.
    named = ragexp("init", str(tmp_path / "my-project"))
    assert named.code == 0, named.stderr
    assert (tmp_path / "my-project/conf/dataset/my_set.yaml").is_file() and tree(clone) == before
    monkeypatch.chdir(tmp_path / "my-project")
    assert ragexp("validate", "dataset=my_set").code == 0


def test_a_checkouts_conf_is_never_taken_for_a_users(
    ragexp: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
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


# --- the store option -----------------------------------------------------------------------------


def store_commands() -> set[str]:
    """Every command with a --tracking-uri option: the commands that touch a store."""
    import importlib
    import inspect

    from ragexp.cli.commands import COMMANDS

    found = set()
    for name in COMMANDS:
        source = inspect.getsource(importlib.import_module(f"ragexp.cli.commands.{name}"))
        if "TrackingUri" in source:
            found.add(name)
    return found


@pytest.mark.system
def test_every_store_command_takes_both_spellings_with_one_precedence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setattr("os.environ", dict(__import__("os").environ))
    monkeypatch.chdir(tmp_path)  # the default store, ./mlruns, must stay untouched
    uri = f"sqlite:///{tmp_path}/team/mlflow.db"
    cases = write_jsonl(tmp_path / "cases.jsonl", replay_rows([{"rank": 1}] * 4 + [{"rank": 2}] * 4))
    run = ["run", f"dataset.path={cases}", "dataset.name=crafted", "provider=replay", "k=3", "--json"]
    by_flag = invoke(*run, "--tracking-uri", uri)
    by_key = invoke(*run, f"tracking.uri={uri}", "k=5")
    assert by_flag.code == 0 and by_key.code == 0, by_flag.stderr + by_key.stderr
    base, cand = by_flag.json()["run_id"], by_key.json()["run_id"]
    ids = {base, cand}
    checked: dict[str, set[str]] = {}

    def both(command: str, *args: str, check: Any) -> None:
        for spelling in (["--tracking-uri", uri], [f"tracking.uri={uri}"]):
            result = invoke(command, *args, *spelling)
            assert result.code in (0, 2), (command, spelling, result.stderr)
            check(result)
            checked.setdefault(command, set()).add(spelling[0].split("=")[0])

    both("runs", "--json", check=lambda r: {row["run_id"] for row in r.json()["runs"]} == ids or pytest.fail(r.stdout))
    both(
        "validate",
        f"dataset.path={cases}",
        "provider=replay",
        "--json",
        check=lambda r: r.json()["tracking_uri"] == uri or pytest.fail(),
    )
    both("diff", base, cand, "--json", "--allow-incomparable", check=lambda r: r.json()["candidate"] == cand)
    both("gate", "--baseline", base, "--candidate", cand, "--allow-incomparable", "--json", check=lambda r: None)
    both("power", "--baseline", base, "--json", check=lambda r: r.json()["baseline"] == base or pytest.fail())
    both("report", cand, "--out", str(tmp_path / "report"), check=lambda r: None)
    both("calibrate", cand, "--json", check=lambda r: None)
    both("label", "export", cand, "--out", str(tmp_path / "labels.jsonl"), "--json", check=lambda r: None)
    both(
        "datasets",
        "diff",
        base,
        cand,
        "--json",
        check=lambda r: r.json()["unchanged"] == 8 or pytest.fail(r.stdout),
    )
    from tests.pipelines.traffic import write_production
    from tests.test_json_output import SHADOW

    write_production(uri, "prod", 1, ["topic1"])
    both("shadow", *SHADOW, "--json", check=lambda r: r.json()["experiment"] == "prod-shadow" or pytest.fail())
    # The two runs as the points of a sweep (a Hydra multirun does not run under this test's
    # plain-dict environment): the tags `run -m` writes.
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    parent = client.create_run(
        client.get_run(base).info.experiment_id, tags={"ragexp.sweep.role": "parent"}
    ).info.run_id
    client.set_terminated(parent)
    for number, (run_id, point) in enumerate(((base, "k=3"), (cand, "k=5"))):
        for key, value in (("", parent), (".num", str(number)), (".point", point), (".role", "point")):
            client.set_tag(run_id, f"ragexp.sweep{key}", value)
    both("sweep", parent, "--json", check=lambda r: r.json()["parent"] == parent or pytest.fail(r.stderr))
    ids.add(parent)
    checked["run"] = {"--tracking-uri", "tracking.uri"}
    assert not (tmp_path / "mlruns").exists()
    draft_store = invoke("draft", "accept", "no-such-queue", "--out", str(tmp_path / "x.jsonl"), f"tracking.uri={uri}")
    assert draft_store.code == 1 and "no-such-queue" in draft_store.stderr and not (tmp_path / "mlruns").exists()
    checked["draft"] = {"tracking.uri"}
    assert set(checked) == store_commands() and all(len(v) >= 1 for v in checked.values())

    # Two different stores in the two spellings: refused in one line, whichever command.
    other = f"sqlite:///{tmp_path}/other/mlflow.db"
    for args in (["runs"], [*run[:-1]], ["diff", base, cand]):
        refused = invoke(*args, "--tracking-uri", uri, f"tracking.uri={other}")
        assert refused.code == 1 and refused.stderr.splitlines() == [
            f"ragexp: error: --tracking-uri {uri} and tracking.uri={other} name two different stores: give one"
        ], args
    # A command that composes no config takes no other override.
    assert invoke("runs", "k=3").stderr.splitlines() == [
        "ragexp: error: ragexp runs: unexpected argument 'k=3' (of the config, runs takes tracking.uri=URI only)"
    ]

    # The config file's tracking.uri comes next, for every command; then MLFLOW_TRACKING_URI.
    conf = tmp_path / "conf"
    conf.mkdir()
    packaged = (ROOT / "conf/config.yaml").read_text(encoding="utf-8")
    (conf / "config.yaml").write_text(packaged.replace("  uri: null", f"  uri: {uri}"), encoding="utf-8")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", other)
    listed = invoke("runs", "--json")
    assert listed.code == 0, listed.stderr
    assert {row["run_id"] for row in listed.json()["runs"]} == ids
    assert invoke("validate", f"dataset.path={cases}", "provider=replay", "--json").json()["tracking_uri"] == uri
    assert invoke("runs", "--tracking-uri", other).stderr.startswith("ragexp: error: no tracking store at")


# --- unknown keys ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("override", "said"),
    [
        ("target=app:chain", "target: no such key (did you mean provider.system.target?)"),
        ("+target=app:chain", "target: unknown key (did you mean provider.system.target?)"),
        ("uri=sqlite:///x.db", "uri: no such key (did you mean tracking.uri?)"),
        ("provider.system.timeout=3", "provider.system.timeout: no such key (did you mean provider.system.timeout_s?)"),
        ("provider.sytem.url=http://x", "provider.sytem.url: no such key (did you mean provider.system.url?)"),
        (
            "gates.rules.mrr.max_dropp=0.1",
            "gates.rules.mrr.max_dropp: no such key (did you mean gates.rules.mrr.max_drop?)",
        ),
        ("experimnt=x", "experimnt: no such key (did you mean experiment?)"),
        ("systm=http", "systm: no such key (did you mean system?)"),
        # Only keys of the system kind in use are offered under provider.system.
        ("+provider.system.timeout=3", "provider.system.timeout: unknown key for kind 'sample'"),
        ("zzz=1", "zzz: no such key"),
    ],
)
def test_an_unknown_key_names_the_closest_known_key(ragexp: Any, override: str, said: str) -> None:
    result = ragexp("validate", override)
    assert result.code == 1
    assert result.stderr.splitlines() == [f"ragexp: error: config: {said}"]


def test_a_block_the_config_does_not_set_is_added_with_a_plus_and_its_keys_are_named(ragexp: Any) -> None:
    http = ("system=http", "provider.system.url=http://127.0.0.1:9/q")
    block = ragexp("validate", *http, "provider.system.response={answer: data.text}")
    assert block.code == 1
    keys = sorted(ResponseMapping.model_fields)
    assert block.stderr.splitlines() == [
        "ragexp: error: config: provider.system.response: this config does not set it, so there is nothing to "
        "override: add it with '+provider.system.response=...', or set some of its keys "
        f"({', '.join(keys)}) with 'provider.system.response.KEY=...'"
    ]
    one = ragexp("validate", *http, "provider.system.response.answer=data.text")
    assert "config:" not in one.stderr and "retrieved_ids" in one.stderr  # taken: ranked_ids is not mapped now
    # As the hint says: with '+' the block is taken (the run then checks what the mapping gives).
    added = ragexp("validate", *http, "+provider.system.response={answer: data.text}")
    assert added.stderr == one.stderr


def test_an_unknown_option_of_a_group_lists_the_options(ragexp: Any) -> None:
    result = ragexp("validate", "system=htp")
    assert result.code == 1 and len(result.stderr.splitlines()) == 1
    options = ", ".join(sorted(path.stem for path in (ROOT / "conf/system").glob("*.yaml")))
    assert result.stderr.strip().endswith(
        f"Could not find 'system/htp' (did you mean system=http? system options: {options})"
    )


# --- plain ragexp, --version ----------------------------------------------------------------------


def test_plain_ragexp_prints_help_and_exits_0_and_version_exists() -> None:
    import subprocess
    import sys
    from importlib.metadata import version

    from ragexp import __version__
    from ragexp.cli.commands import COMMANDS

    plain = invoke()
    assert plain.code == 0 and plain.stderr == ""
    assert "Usage:" in plain.stdout and all(name in plain.stdout for name in COMMANDS)
    shown = invoke("--version")
    assert shown.code == 0 and shown.stdout == f"ragexp {__version__} (MLflow {version('mlflow')})\n"
    assert __version__ == version("ragexp")
    # The console script itself, in a fresh process: no command's work is imported for either.
    probe = (
        "import sys\nfrom ragexp.cli.app import main\nsys.argv = ['ragexp', *sys.argv[1:]]\n"
        "try:\n    main()\nexcept SystemExit as exc:\n    code = exc.code\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in {'mlflow', 'hydra', 'numpy'})\n"
        "print(code, heavy, file=sys.stderr)\n"
    )
    for args in ([], ["--version"]):
        done = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True, text=True, check=True)
        assert done.stderr.strip().splitlines()[-1] == "0 []", args


# --- what a run says after its tables --------------------------------------------------------------


def test_a_run_says_what_it_evaluated_what_the_numbers_mean_and_what_to_try_next(ragexp: Any, tmp_path: Path) -> None:
    shown = ragexp("run")  # what `make run` runs
    assert shown.code == 0, shown.stderr
    lines = shown.stdout.splitlines()
    run_id = next(line.split()[1] for line in lines if line.startswith("run "))
    start = lines.index(next(line for line in lines if line.startswith("evaluated: ")))
    assert lines[start] == (
        "evaluated: the bundled sample RAG system (BM25, a reranker, an extractive answer), in-process,"
    )
    assert lines[start + 1] == "  on kb_zh (35 cases), the top 5 retrieved ids scored"
    assert lines[start + 2].startswith("the numbers: scores from 0 to 1, each the mean over the cases 'scored'")
    assert "docs/metrics.md" in lines[start + 4]
    start = next(i for i, line in enumerate(lines) if line.startswith("next "))
    steps = [line.split() for line in lines[start + 1 :] if not line.strip().startswith("#")]
    exe = steps[0][0]  # this environment's ragexp, as it can be typed here (tests/test_first_hour.py)
    assert steps == [
        [exe, "run", "provider.system.sample.chunking=sentence"],
        [exe, "gate", "--baseline", run_id],
        [steps[2][0], "ui", "--backend-store-uri", steps[2][3]],
    ]
    # Another system is named for what it is; --json prints the one object only.
    cases = write_jsonl(tmp_path / "cases.jsonl", replay_rows([{"rank": 1}] * 3))
    replayed = ragexp("run", "provider=replay", f"dataset.path={cases}", "k=3")
    assert "evaluated: the outputs recorded in the dataset (no system was called)," in replayed.stdout
    assert "# a candidate: change your system, then run this command again" in replayed.stdout
    assert "evaluated" not in ragexp("run", "provider=replay", f"dataset.path={cases}", "k=3", "--json").stdout
