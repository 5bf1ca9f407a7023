"""Every identifier that reaches a store is refused before any work or written safely: long and
unusual case ids, stage names MLflow refuses as metric keys, hostile experiment, run, tag and
dataset names, on a SQLite store and on the PostgreSQL-backed team server."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mlflow.tracking import MlflowClient

from ragexp import limits
from tests.conftest import ROOT, invoke, write_jsonl
from tests.servers.procs import free_port, serve
from tests.test_http import labelled
from tests.test_reliability import FAST, SECRET, everything_recorded, spellings
from tests.test_traces import traces_of

SERVER = os.environ.get("RAGEXP_TEST_MLFLOW_SERVER")
needs_server = pytest.mark.skipif(not SERVER, reason="RAGEXP_TEST_MLFLOW_SERVER not set")
STAGES_SERVER = ROOT / "tests/servers/stages.py"
STORES = ["sqlite", pytest.param("server", marks=needs_server), "postgresql"]
AUTH = "+provider.system.headers_env.Authorization=RAGEXP_SYSTEM_AUTH"

ODD_IDS = [
    "case-" + "x" * 56,  # 61 characters: over the trace's 50-character client request id
    "长" * 120,
    "a b/c 'd' \"e\" \\f " + "y" * 180,  # 198 characters, spaces, slashes, quotes, a backslash
    "检索-问题-一",
    "with  two spaces",
    "s/l/a/s/h/",
    "q'uote\"d",
    "z" * 200,
]


@pytest.fixture(scope="module")
def postgres_uri() -> Iterator[str]:
    """A PostgreSQL database of its own (a private cluster on a free port), for the direct
    ``postgresql://`` path: the team server's database is behind its tracking server."""
    tools = {name: shutil.which(name) for name in ("initdb", "pg_ctl", "createdb")}
    if not all(tools.values()):
        pytest.skip("PostgreSQL (initdb, pg_ctl, createdb) is not installed")
    folder = Path(tempfile.mkdtemp(prefix="ragexp-pg-"))
    as_user: list[str] = []
    if os.geteuid() == 0:  # PostgreSQL refuses to run as root
        as_user = ["runuser", "-u", "postgres", "--"]
        os.chown(folder, pwd.getpwnam("postgres").pw_uid, -1)
    port, data = free_port(), str(folder / "data")

    def pg(*args: str) -> None:
        subprocess.run([*as_user, *args], check=True, capture_output=True, timeout=120)

    pg(str(tools["initdb"]), "-D", data, "-A", "trust", "-U", "ragexp")
    options = f"-p {port} -k {folder} -c listen_addresses=127.0.0.1"
    pg(str(tools["pg_ctl"]), "-D", data, "-o", options, "-l", str(folder / "log"), "-w", "start")
    try:
        pg(str(tools["createdb"]), "-h", "127.0.0.1", "-p", str(port), "-U", "ragexp", "mlflow")
        yield f"postgresql+psycopg2://ragexp@127.0.0.1:{port}/mlflow"
    finally:
        pg(str(tools["pg_ctl"]), "-D", data, "-m", "immediate", "stop")
        shutil.rmtree(folder, ignore_errors=True)


def store_for(where: str, store_uri: str, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> str:
    uri = {"server": SERVER or store_uri, "sqlite": store_uri}.get(where) or request.getfixturevalue("postgres_uri")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    # A database store puts artifacts under ./mlruns: the test's own folder, not the repository.
    monkeypatch.chdir(Path(store_uri.removeprefix("sqlite:///")).parent.parent)
    return uri


def experiment_name(tmp_path: Path, what: str) -> str:
    return f"ragexp-test-ids-{what}-{os.getpid()}-{tmp_path.name}"


def metadata_case_id(trace: Any) -> str:
    return str(trace.info.trace_metadata["ragexp.case_id"])


@pytest.mark.system
@pytest.mark.parametrize("where", STORES)
def test_long_and_unusual_case_ids_are_one_trace_each(
    ragexp: Any,
    store_uri: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
    where: str,
) -> None:
    uri = store_for(where, store_uri, monkeypatch, request)
    rows = [
        {"id": case_id, "question": f"q {n}?", "relevant_ids": [f"d{n}"], "expected_facts": [f"f{n}"]}
        for n, case_id in enumerate(ODD_IDS)
    ]
    data = write_jsonl(tmp_path / "odd.jsonl", rows)
    experiment = experiment_name(tmp_path, "odd")
    result = ragexp("run", "provider=fake", f"dataset.path={data}", f"experiment={experiment}", "--json")
    assert result.code == 0, result.stderr
    traces = traces_of(uri, result.json()["run_id"])
    assert sorted(map(metadata_case_id, traces)) == sorted(ODD_IDS)  # one per case, each id whole
    assert sorted(json.loads(t.info.request_preview)["case_id"] for t in traces) == sorted(ODD_IDS)
    by_id = {metadata_case_id(t): t for t in traces}
    for case_id, trace in by_id.items():
        assert trace.info.client_request_id == limits.client_request_id(case_id)
        assert len(trace.info.client_request_id) <= 50
    assert by_id["检索-问题-一"].info.client_request_id == "检索-问题-一"  # short ids are kept as they are
    assert len({t.info.client_request_id for t in traces}) == len(ODD_IDS)


@pytest.mark.system  # a whole run: `make test`, not the edit loop
def test_a_case_id_with_a_control_character_is_refused_naming_file_line_and_field(
    no_store_uri: str, tmp_path: Path
) -> None:
    ragexp = invoke
    for bad in ["a\x00b", "tab\there", "esc\x1b[2J"]:
        rows = [
            {"id": "fine", "question": "q?", "relevant_ids": ["d"]},
            {"id": bad, "question": "q?", "relevant_ids": ["d"]},
        ]
        data = write_jsonl(tmp_path / "ctl.jsonl", rows)
        for command in (["validate"], ["run", "provider=fake"]):
            result = ragexp(*command, f"dataset.path={data}")
            assert result.code == 1, (bad, result.stdout, result.stderr)
            (line,) = result.stderr.strip().splitlines()
            assert f"{data.name}:2: field 'id':" in line and "control character U+00" in line, line
    assert not (Path(no_store_uri.removeprefix("sqlite:///"))).exists()  # no store, no run


def test_request_preview_is_valid_json_whatever_the_escapes() -> None:
    from ragexp.case_traces import PREVIEW_CHARS, fit_json, request_preview

    for case_id, question in [
        ('"' * 200, 'q"' * 3000),
        ("\\" * 200, "\\" * 5000),
        ("长" * 200, "\x01" * 2000),
        ("c", "\x7f\u2028" + "é" * 2000),
    ]:
        text = request_preview(case_id, question)
        assert len(text) <= PREVIEW_CHARS
        assert json.loads(text)["case_id"] == case_id  # kept whole: the UI pairs runs by it
    # A fixed part too long on its own is cut too, still valid JSON.
    text = fit_json({"case_id": "\x01" * 400}, "question", "x")
    assert len(text) <= PREVIEW_CHARS and json.loads(text)["case_id"].startswith("\x01")


def stage_run(ragexp: Any, data: Path, url: str, experiment: str, *extra: str) -> Any:
    return ragexp(
        "run",
        "provider=http",
        f"provider.system.url={url}",
        f"dataset.path={data}",
        AUTH,
        f"experiment={experiment}",
        *FAST,
        *extra,
        "--json",
    )


@pytest.mark.system
@pytest.mark.parametrize("where", STORES)
def test_stage_names_mlflow_refuses_finish_the_run_under_safe_metric_keys(
    ragexp: Any,
    store_uri: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
    where: str,
) -> None:
    from tests.servers.stages import STAGES

    uri = store_for(where, store_uri, monkeypatch, request)
    monkeypatch.setenv("RAGEXP_SYSTEM_AUTH", f"Bearer {SECRET}")
    data = write_jsonl(tmp_path / "cases.jsonl", labelled(["ok-1", "ok-2", "ok-3"]))
    with serve(STAGES_SERVER) as url:
        result = stage_run(ragexp, data, url, experiment_name(tmp_path, "stages"))
    assert result.code == 0, result.stderr
    run_id = result.json()["run_id"]
    client = MlflowClient(uri)
    run = client.get_run(run_id)
    assert run.info.status == "FINISHED"
    metrics = run.data.metrics
    timing = [key for key in metrics if key.startswith("timing.")]
    assert all(limits.problem(limits.METRIC_KEY, key) is None for key in timing)
    assert metrics["timing.model.p50_seconds"] == pytest.approx(0.02)  # a fine name is kept as it is
    assert metrics["timing.检索 阶段.p95_seconds"] == pytest.approx(0.005)
    # Every original name is recoverable from timings.json, with the metric keys it was filed under.
    path = client.download_artifacts(run_id, "timings.json", str(tmp_path / "timings"))
    stages = {entry["stage"]: entry for entry in json.loads(Path(path).read_text(encoding="utf-8"))["stages"]}
    expected = {**STAGES, "auth ***": 0.001}  # the echoed token is masked before it becomes a name
    assert set(stages) == set(expected)
    assert len({entry["metric_prefix"] for entry in stages.values()}) == len(expected)
    assert len(timing) == 3 * len(expected)
    for name, seconds in expected.items():
        prefix = stages[name]["metric_prefix"]
        assert metrics[f"{prefix}.p50_seconds"] == pytest.approx(seconds) == stages[name]["p50_seconds"]
        assert metrics[f"{prefix}.cases"] == 3
    assert stages["model=gpt-4 (v2)"]["metric_prefix"].startswith("timing.model_gpt-4 _v2_")
    assert len(traces_of(uri, run_id)) == 3
    texts = [result.stdout, result.stderr, *everything_recorded(uri, run_id, tmp_path)]
    for spelling in spellings(SECRET):
        assert not any(spelling in text for text in texts), spelling


def test_a_token_echoed_as_a_stage_name_is_masked_in_the_checkpoint(
    ragexp: Any, store_uri: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAGEXP_SYSTEM_AUTH", f"Bearer {SECRET}")
    ids = ["ok-1", "ok-2", *[f"dropall-{n}" for n in range(4)]]
    data = write_jsonl(tmp_path / "cases.jsonl", labelled(ids))
    with serve(STAGES_SERVER) as url:
        result = stage_run(ragexp, data, url, "ragexp", "concurrency=1", "provider.system.abort_after=2")
    assert result.code == 1 and "in a row" in result.stderr, result.stderr
    run_id = (
        MlflowClient(store_uri)
        .search_runs([MlflowClient(store_uri).get_experiment_by_name("ragexp").experiment_id])[0]
        .info.run_id
    )
    checkpoint = Path(store_uri.removeprefix("sqlite:///")).parent / "checkpoints" / f"{run_id}.jsonl"
    kept = {json.loads(line)["id"]: json.loads(line) for line in checkpoint.read_bytes().splitlines()}
    assert "auth ***" in kept["ok-1"]["output"]["timings"]
    texts = [result.stdout, result.stderr, *everything_recorded(store_uri, run_id, tmp_path)]
    assert any("checkpoint" in text or "auth ***" in text for text in texts[2:])
    for spelling in spellings(SECRET):
        assert not any(spelling in text for text in texts), spelling


# --- the sweep: hostile values through every field, on the team server ------------------------

REFUSED = [
    ("experiment", ["experiment=" + "e" * 300], "experiment: 'eee"),
    (
        "experiment-nul",
        ["experiment='bad\x00name'"],
        "experiment: 'bad\\x00name' contains the control character U+0000",
    ),
    ("run-name-ctl", ["run_name='ab\x07cd'"], "run_name: 'ab\\x07cd' contains the control character U+0007"),
    ("tag-key", ["+tags.price$=1"], "tags.price$ (the tag's name): 'price$' contains '$'"),
    ("tag-nul", ["+tags.note='a\x00b'"], "tags.note: 'a\\x00b' contains the control character U+0000"),
    ("tag-long", ["+tags.note=" + "v" * 9000], "tags.note: 'vvv"),
    ("dataset-name", ["dataset.name=" + "d" * 600], "dataset.name: 'ddd"),
    ("dataset-nul", ["dataset.name='kb\x00zh'"], "dataset.name: 'kb\\x00zh' contains the control character U+0000"),
]


@needs_server
@pytest.mark.parametrize(("what", "overrides", "said"), REFUSED, ids=[r[0] for r in REFUSED])
def test_hostile_config_values_are_refused_before_any_work(
    ragexp: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, what: str, overrides: list[str], said: str
) -> None:
    assert SERVER is not None
    monkeypatch.setenv("MLFLOW_TRACKING_URI", SERVER)
    experiment = experiment_name(tmp_path, what)
    given = [o for o in overrides if o.startswith("experiment=")] or [f"experiment={experiment}"]
    rest = [o for o in overrides if not o.startswith("experiment=")]
    for command in ("validate", "run"):
        result = ragexp(command, "provider=fake", *given, *rest)
        assert result.code == 1, result.stdout
        (line,) = result.stderr.strip().splitlines()
        assert said in line, line
    client = MlflowClient(SERVER)
    name = given[0].removeprefix("experiment=").strip("'")
    found = client.get_experiment_by_name(name) if "\x00" not in name else None
    assert found is None or not client.search_runs([found.experiment_id])  # no run was created


@needs_server
def test_values_at_every_limit_are_written_whole_on_the_team_server(
    ragexp: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert SERVER is not None
    monkeypatch.setenv("MLFLOW_TRACKING_URI", SERVER)
    prefix = experiment_name(tmp_path, "limits") + "-实验"
    experiment = prefix + "x" * (limits.EXPERIMENT_NAME.chars - len(prefix))
    dataset = "数据" * (limits.DATASET_NAME.chars // 2)
    tag_key = "x-y_" + "k" * (limits.TAG_KEY.chars - 4)
    tag_value = "值" * limits.TAG_VALUE.chars
    client = MlflowClient(SERVER)
    result = ragexp(
        "run",
        "provider=fake",
        f"experiment={experiment}",
        f"dataset.name={dataset}",
        f"+tags.{tag_key}='{tag_value}'",
        "--json",
    )
    assert result.code == 0, result.stderr
    run = client.get_run(result.json()["run_id"])
    assert run.info.status == "FINISHED"
    assert client.get_experiment(run.info.experiment_id).name == experiment
    assert run.data.tags[tag_key] == tag_value and run.data.tags["ragexp.dataset"] == dataset
    assert run.inputs.dataset_inputs[0].dataset.name == dataset
    # The default run name starts with its hash (what tells runs apart), the names cut to fit the column.
    assert len(run.info.run_name) == limits.RUN_NAME.chars
    assert run.info.run_name.startswith(result.json()["config_hash"][:12] + "-fake-")
    named = ragexp("run", "provider=fake", f"experiment={experiment}", "run_name=" + "名" * 250, "--json")
    assert named.code == 0, named.stderr
    assert client.get_run(named.json()["run_id"]).info.run_name == "名" * 250


@needs_server
def test_a_sweep_with_long_points_lands_on_the_team_server(
    ragexp: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert SERVER is not None
    monkeypatch.setenv("MLFLOW_TRACKING_URI", SERVER)
    experiment = experiment_name(tmp_path, "sweep")
    long_note = "n" * 300  # the parent's name lists the points: over the run name's 250 characters
    result = ragexp(
        "run", "-m", "provider=fake", "k=3,5", f"+tags.note={long_note}", f"experiment={experiment}", "--json"
    )
    assert result.code == 0, result.stderr
    client = MlflowClient(SERVER)
    parent = client.get_run(result.json()["sweep"])
    assert parent.info.status == "FINISHED" and len(parent.info.run_name) <= limits.RUN_NAME.chars
    assert parent.data.tags["ragexp.sweep.overrides"].endswith(f"experiment={experiment}")
    points = client.search_runs([parent.info.experiment_id], f"tags.`ragexp.sweep` = '{parent.info.run_id}'")
    assert len(points) == 2 and all(p.data.tags["note"] == long_note for p in points)


@pytest.mark.parametrize(
    ("options", "said"),
    [
        (["--promote", "--promote-tag", "role$=production"], "--promote-tag (the tag's name): 'role$' contains '$'"),
        (["--promote", "--promote-tag", "role=" + "p" * 9000], "--promote-tag (the tag's value): 'ppp"),
        (["--baseline", "tag:ro/../le=x", "--promote"], "tag:KEY=VALUE (the tag's name): 'ro/../le' reads as"),
    ],
)
def test_a_promotion_tag_mlflow_refuses_is_refused_before_the_gate(
    ragexp: Any, store_uri: str, options: list[str], said: str
) -> None:
    first = ragexp("run", "provider=fake", "--json")
    assert first.code == 0, first.stderr
    run_id = first.json()["run_id"]
    base = [] if "--baseline" in options else ["--baseline", run_id]
    result = ragexp("gate", *base, "--candidate", run_id, *options)
    assert result.code == 1, result.stdout
    (line,) = result.stderr.strip().splitlines()
    assert said in line, line
    assert "ragexp.gate.verdict" not in MlflowClient(store_uri).get_run(run_id).data.tags  # the gate never ran


@pytest.mark.system  # a whole run: `make test`, not the edit loop
@pytest.mark.parametrize("where", ["postgresql", pytest.param("server", marks=needs_server)])
def test_a_long_judge_identity_fits_the_assessment_source_column(
    ragexp: Any,
    store_uri: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
    where: str,
) -> None:
    from tests.test_judge import CASES, JUDGE, judge_args

    uri = store_for(where, store_uri, monkeypatch, request)
    monkeypatch.setenv("RAGEXP_TEST_JUDGE_KEY", "judge-key")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # a judge cache of its own
    data = write_jsonl(tmp_path / "cases.jsonl", CASES)
    model = "org/" + "m" * 300  # the judge identity names the model: over the 250-character source id
    with serve(JUDGE, "--api-key", "judge-key") as url:
        result = ragexp(
            "run",
            f"dataset.path={data}",
            "metrics.names=[faithfulness,recall_at_k]",
            *judge_args(url),
            f"provider.judge.model={model}",
            f"experiment={experiment_name(tmp_path, 'judge')}",
            "--json",
        )
    assert result.code == 0, result.stderr
    run_id = result.json()["run_id"]
    identity = MlflowClient(uri).get_run(run_id).data.tags["ragexp.judge"]
    assert model in identity  # the tag keeps it whole
    sources = {
        a.source.source_id
        for t in traces_of(uri, run_id)
        for a in t.info.assessments
        if a.name == "faithfulness" and a.feedback is not None
    }
    assert sources == {limits.shortened(limits.ASSESSMENT_SOURCE_ID, identity)}
    assert len(next(iter(sources))) == limits.ASSESSMENT_SOURCE_ID.chars
