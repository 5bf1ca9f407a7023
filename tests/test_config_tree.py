"""The config tree: every file of every group and every preset composes and plans (as
lightning-hydra-template tests its configs), the system/judge split keeps the old commands and
hashes, typed keys absent from the YAML files can be overridden, and a user's conf/ composes over
the packaged one."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ragexp.config.compose import GROUPS, compose
from ragexp.errors import ConfigError
from ragexp.paths import package_conf, package_data, packaged_trees
from ragexp.workflows.run_plan import plan_run
from tests.conftest import ROOT, invoke
from tests.servers.procs import SAMPLE, serve

PACKAGED = package_conf()
JUDGE = Path(__file__).resolve().parent / "servers/judge.py"
PRESET_KINDS = {
    "langchain": "python",
    "langchain_agent": "python",
    "llamaindex": "python",
    "dify": "http",
    "ragflow": "http",
    "openai_chat": "http",
}
"""System presets named after a product rather than their kind."""
TREES = packaged_trees()
OPTIONS = sorted({(group, path.stem) for tree in TREES for group in GROUPS for path in (tree / group).glob("*.yaml")})


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """The sample RAG service and the deterministic judge, as real processes on 127.0.0.1."""
    with serve(SAMPLE) as system, serve(JUDGE) as judge:
        yield {"system": system, "judge": judge, "traffic": _traffic(tmp_path_factory.mktemp("traffic"))}


def _traffic(folder: Path) -> str:
    """A store whose experiment ``prod`` holds two autologged production traces (dataset=traces)."""
    from tests.pipelines.traffic import write_production

    (folder / "mlruns").mkdir()
    uri = f"sqlite:///{folder}/mlruns/mlflow.db"
    write_production(uri, "prod", 1, ["topic1", "topic2"])
    return uri


def local(services: dict[str, str]) -> dict[str, list[str]]:
    system = [f"provider.system.url={services['system']}"]
    judge = [f"provider.judge.base_url={services['judge']}", f"provider.judge.embeddings.url={services['judge']}"]
    return {"system": system, "judge": judge}


def context(group: str, option: str, services: dict[str, str]) -> list[str]:
    """Overrides that let one option plan: a dataset and metrics it can measure, local servers."""
    urls = local(services)
    recorded = ["dataset=scifacts_zh", *urls["judge"]]
    judged = [*recorded, "metrics=core"]
    table: dict[tuple[str, str], list[str]] = {
        ("dataset", "kb_zh"): [],
        ("dataset", "kb_zh_spans"): [],
        ("dataset", "kb_zh_hops"): [
            "provider.system.sample.docs=kb_zh_hops/docs.jsonl",
            "provider.system.sample.hops=2",
        ],
        ("dataset", "kb_zh_chat"): [],
        ("dataset", "scifacts_zh"): ["provider=replay"],
        ("dataset", "traces"): [
            f"tracking.uri={services['traffic']}",
            "dataset.experiment=prod",
            "system=python",
            "provider.system.target=tests.pipelines.traffic:candidate",
            "metrics.names=[p95_seconds]",
        ],
        ("dataset", "scifacts_columns"): ["provider=replay_judge", "metrics=core", *urls["judge"]],
        ("metrics", "offline"): [],
        ("metrics", "retrieval"): [],
        ("metrics", "core"): ["provider=replay_judge", *recorded],
        ("metrics", "judge"): ["provider=replay_judge", *recorded],
        ("metrics", "full"): ["provider=replay_judge", *recorded],
        ("system", "sample"): [],
        ("system", "fake"): [],
        ("system", "replay"): ["dataset=scifacts_zh"],
        ("system", "http"): urls["system"],
        ("system", "dify"): [*urls["system"], "metrics=retrieval"],
        ("system", "ragflow"): urls["system"],
        ("system", "openai_chat"): [*urls["system"], "metrics.names=[answer_accuracy,p95_seconds,error_rate]"],
        ("system", "python"): ["provider.system.target=tests.pipelines.plain:contract"],
        ("system", "langchain"): ["provider.system.target=tests.pipelines.chains:chain", "metrics=retrieval"],
        ("system", "langchain_agent"): [
            "dataset=kb_zh_hops",
            "provider.system.target=tests.pipelines.agent:agent",
            "metrics=retrieval",
        ],
        ("system", "llamaindex"): ["provider.system.target=tests.pipelines.llama:engine.query", "metrics=retrieval"],
        ("judge", "none"): [],
        ("judge", "openai"): ["system=replay", *judged],
        ("judge", "mindie"): ["system=replay", *judged],
        ("provider", "sample"): [],
        ("provider", "fake"): [],
        ("provider", "replay"): ["dataset=scifacts_zh"],
        ("provider", "http"): urls["system"],
        ("provider", "http_judge"): ["metrics=core", *urls["system"], *urls["judge"]],
        ("provider", "replay_judge"): judged,
        ("provider", "npu"): ["metrics=core", *urls["judge"]],  # the default dataset, as typed
        ("gates", "release"): [],
        ("gates", "release_stat"): [],
        ("setup", "scifacts_replay"): [],
        ("setup", "release_check"): urls["system"],
        ("setup", "mindsdk_zh"): urls["judge"],
    }
    if (group, option) not in table:
        pytest.fail(f"{group}/{option}.yaml has no planning context in this test: add one")
    return [f"{group}={option}", *table[(group, option)]]


@pytest.mark.parametrize(("group", "option"), OPTIONS, ids=[f"{g}/{o}" for g, o in OPTIONS])
def test_every_config_file_composes_and_plans(
    group: str, option: str, services: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RAGEXP_JUDGE_API_KEY", "test-key")
    for variable in ("RAGEXP_DIFY_AUTH", "RAGEXP_RAGFLOW_AUTH", "RAGEXP_OPENAI_AUTH"):
        monkeypatch.setenv(variable, "Bearer test-key")  # the presets' headers_env
    monkeypatch.chdir(tmp_path)  # nothing found through the working directory
    config = compose(context(group, option, services))
    plan = plan_run(config, tmp_path / "state")
    assert len(plan.config_hash) == 64 and plan.dataset.cases
    if group in ("dataset", "metrics", "gates"):
        chosen = {"dataset": config.dataset.name, "metrics": config.metrics.set, "gates": config.gates.name}
        assert chosen[group] == option
    if group == "system":
        assert config.provider.system.kind == PRESET_KINDS.get(option, option)
    if group == "judge":
        assert (config.provider.judge.kind if config.provider.judge else "none") == option
    if group == "provider":
        assert config.provider.name == option
    if group == "setup":  # a named setup changes something the defaults do not
        assert config.model_dump() != compose().model_dump()


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["setup=scifacts_replay"], ("scifacts_zh", "replay", "replay", None, "offline", 3, "ragexp")),
        (["setup=mindsdk_zh"], ("scifacts_zh", "npu", "replay", "mindie", "core", 5, "mindsdk-zh")),
        (["setup=release_check"], ("kb_zh", "http", "http", None, "offline", 5, "ragexp")),
        # The command line wins over a setup, for groups and keys alike.
        (["setup=scifacts_replay", "k=7"], ("scifacts_zh", "replay", "replay", None, "offline", 7, "ragexp")),
        (["setup=mindsdk_zh", "dataset=kb_zh", "experiment=x"], ("kb_zh", "npu", "replay", "mindie", "core", 5, "x")),
    ],
)
def test_named_setups_select_groups_and_set_keys(overrides: list[str], expected: tuple[Any, ...]) -> None:
    config = compose(overrides)
    judge = config.provider.judge.kind if config.provider.judge else None
    got = (config.dataset.name, config.provider.name, config.provider.system.kind, judge)
    assert (*got, config.metrics.set, config.k, config.experiment) == expected


def test_a_setup_is_the_same_run_as_its_selections_typed_out() -> None:
    by_setup = plan_run(compose(["setup=scifacts_replay"]))
    typed_out = plan_run(compose(["dataset=scifacts_zh", "provider=replay", "k=3"]))
    assert by_setup.config_hash == typed_out.config_hash


def test_the_groups_hold_every_packaged_file() -> None:
    groups = {path.name for tree in TREES for path in tree.iterdir() if path.is_dir() and path.name != "__pycache__"}
    assert groups == {*GROUPS, "hydra"}
    assert {("system", "http"), ("judge", "mindie"), ("provider", "npu")} <= set(OPTIONS)
    files = [path.relative_to(tree) for tree in TREES for path in tree.rglob("*.yaml")]
    assert len(files) == len(set(files))  # one packaged file per option


def test_the_bundled_experiments_hold_their_setups() -> None:
    """In a checkout, experiments/NAME/ holds the sample service and the setups of that
    experiment; they compose as options of the packaged setup group."""
    experiments = ROOT / "experiments"
    trees = packaged_trees()
    assert trees == [ROOT / "conf", experiments / "kb_zh", experiments / "scifacts_zh"]
    assert not (ROOT / "conf/setup").exists() and (experiments / "kb_zh/service.py").is_file()
    setups = {option for group, option in OPTIONS if group == "setup"}
    assert setups == {"release_check", "scifacts_replay", "mindsdk_zh"}


@pytest.mark.parametrize(
    ("preset", "system", "judge"),
    [
        ("sample", "sample", None),
        ("fake", "fake", None),
        ("replay", "replay", None),
        ("http", "http", None),
        ("http_judge", "http", "openai"),
        ("replay_judge", "replay", "openai"),
        ("npu", "sample", "mindie"),
    ],
)
def test_presets_select_a_system_and_a_judge(preset: str, system: str, judge: str | None) -> None:
    config = compose([f"provider={preset}"])
    assert (config.provider.name, config.provider.system.kind) == (preset, system)
    assert (config.provider.judge.kind if config.provider.judge else None) == judge


def test_system_and_judge_combine_freely_and_name_the_provider() -> None:
    free = compose(["system=http", "judge=mindie"])
    assert free.provider.name == "http+mindie"
    assert free.provider.system.url == "http://127.0.0.1:8000/query"
    assert free.provider.judge is not None and free.provider.judge.embeddings.kind == "tei"
    assert compose(["provider=npu", "system=http"]).provider.name == "http+mindie"
    assert compose(["provider=npu", "judge=openai"]).provider.name == "sample+openai"
    assert compose(["system=http", "provider.name=staging"]).provider.name == "staging"
    # The same choice through a preset or through the groups measures the same thing.
    judge_default = compose(["provider=replay_judge"]).provider.judge
    assert compose(["system=replay", "judge=openai"]).provider.judge == judge_default


def test_a_judge_default_lives_in_one_file() -> None:
    """Every preset with an OpenAI-compatible judge reads it from judge/openai.yaml."""
    text = (PACKAGED / "judge/openai.yaml").read_text(encoding="utf-8")
    assert "http://127.0.0.1:8400/v1" in text
    for preset in ("http_judge", "replay_judge"):
        assert "8400" not in (PACKAGED / f"provider/{preset}.yaml").read_text(encoding="utf-8")
        judge = compose([f"provider={preset}"]).provider.judge
        assert judge is not None and judge.base_url == "http://127.0.0.1:8400/v1"


def test_typed_keys_absent_from_the_yaml_files_can_be_overridden() -> None:
    assert "timeout_s:" not in (PACKAGED / "system/http.yaml").read_text(encoding="utf-8")
    config = compose(["provider=http", "provider.system.timeout_s=7", "provider.system.headers_env.X-Key=MY_ENV"])
    system = config.provider.system
    assert system.kind == "http" and system.timeout_s == 7 and system.headers_env == {"X-Key": "MY_ENV"}
    judge = compose(["provider=npu", "provider.judge.max_tokens=100", "provider.judge.abort_after=3"]).provider.judge
    assert judge is not None and (judge.max_tokens, judge.abort_after, judge.language) == (100, 3, "chinese")
    sample = compose(["provider.system.sample.chunking=sentence"]).provider.system.sample
    assert sample is not None and sample.chunking == "sentence"
    assert compose(["gates.rules.mrr.statistical=true"]).gates.rules["mrr"].statistical is True
    with pytest.raises(ConfigError, match=r"^config: provider.system.colour: no such key"):
        compose(["provider.system.colour=red"])  # not a typed key: refused as before
    with pytest.raises(ConfigError, match=r"^config: provider.system.timeout_s: Input should be greater than 0"):
        compose(["system=http", "provider.system.timeout_s=0"])


# Hashes of the presets since each system kind hashes only its own keys (CHANGELOG): a change
# here is a change of every run's identity and needs a CHANGELOG line.
PINNED = {
    ("fake", "kb_zh"): "ab42ef6368cf",
    ("fake", "scifacts_zh"): "ffca9343cdfa",
    ("replay", "scifacts_zh"): "f4ce2e375f77",
    ("sample", "kb_zh"): "459b0f98d017",
}


@pytest.mark.parametrize(("preset", "dataset"), sorted(PINNED))
def test_preset_hashes_did_not_change(preset: str, dataset: str) -> None:
    assert plan_run(compose([f"provider={preset}", f"dataset={dataset}"])).config_hash[:12] == PINNED[(preset, dataset)]


def test_hash_does_not_depend_on_where_config_and_data_files_live(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    packaged = plan_run(compose(["provider=replay", "dataset=scifacts_zh"])).config_hash
    user = tmp_path / "repo"
    (user / "conf/dataset").mkdir(parents=True)
    (user / "conf/system").mkdir(parents=True)
    (user / "sets").mkdir()
    shutil.copy(package_data() / "scifacts_zh/cases.jsonl", user / "sets/mine.jsonl")
    text = (PACKAGED / "dataset/scifacts_zh.yaml").read_text(encoding="utf-8")
    (user / "conf/dataset/mine.yaml").write_text(
        text.replace("path: scifacts_zh/cases.jsonl", "path: sets/mine.jsonl"), encoding="utf-8"
    )
    shutil.copy(PACKAGED / "system/replay.yaml", user / "conf/system/recorded.yaml")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RAGEXP_CONFIG_DIR", str(user / "conf"))
    mine = compose(["dataset=mine", "system=recorded", "provider.name=replay"])
    plan = plan_run(mine)
    assert plan.dataset.path == user / "sets/mine.jsonl"  # found next to conf/, not in the package
    assert plan.config_hash == packaged


def test_user_conf_composes_over_the_packaged_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    conf = tmp_path / "conf"
    (conf / "dataset").mkdir(parents=True)
    (conf / "dataset/kb_zh.yaml").write_text("name: shadowed\npath: kb_zh/cases.jsonl\n", encoding="utf-8")
    (conf / "gates").mkdir()
    (conf / "gates/strict.yaml").write_text("name: strict\nrules: {mrr: {max_drop: 0.0}}\n", encoding="utf-8")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.delenv("RAGEXP_CONFIG_DIR", raising=False)
    monkeypatch.delenv("RAGEXP_CONF_DIR", raising=False)
    assert compose([]).dataset.name == "kb_zh"  # no ./conf here: packaged defaults only
    monkeypatch.chdir(tmp_path)  # ./conf is picked up; its file wins over the packaged one of the same name
    assert compose([]).dataset.name == "shadowed"
    assert compose(["gates=strict", "provider=npu"]).gates.rules["mrr"].max_drop == 0.0
    monkeypatch.chdir(elsewhere)
    for variable in ("RAGEXP_CONFIG_DIR", "RAGEXP_CONF_DIR"):  # the older name keeps working
        monkeypatch.setenv(variable, str(conf))
        assert compose(["gates=strict"]).gates.name == "strict"
        monkeypatch.delenv(variable)
    monkeypatch.setenv("RAGEXP_CONFIG_DIR", str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match="no such config folder"):
        compose([])


def test_config_dir_option_of_the_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    conf = tmp_path / "mine"
    (conf / "gates").mkdir(parents=True)
    (conf / "gates/strict.yaml").write_text("name: strict\nrules: {mrr: {max_drop: 0.0}}\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RAGEXP_CONFIG_DIR", raising=False)
    monkeypatch.setattr("os.environ", dict(__import__("os").environ))  # the option sets the variable
    result = invoke("validate", "--config-dir", str(conf), "gates=strict")
    assert result.code == 0, result.stderr
    result = invoke("validate", "gates=strict")
    assert result.code == 0, result.stderr  # the variable set by --config-dir lasts for the process
    assert invoke("--config-dir", str(tmp_path / "none"), "validate").code == 1


def test_init_writes_a_starter_conf_that_composes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj/.gitignore").write_text("*.pyc", encoding="utf-8")  # kept, mlruns/ appended
    result = invoke("init", "proj")
    assert result.code == 0, result.stderr
    project = tmp_path / "proj"
    assert sorted(str(p.relative_to(project)) for p in project.rglob("*") if p.is_file()) == [
        ".gitignore",
        "conf/dataset/my_set.yaml",
        "conf/gates/my_release.yaml",
        "conf/metrics/my_metrics.yaml",
        "conf/system/my_service.yaml",
        "data/my_set.jsonl",
        "my_rules.py",
    ]
    assert (project / ".gitignore").read_text(encoding="utf-8").splitlines()[::2] == ["*.pyc", "mlruns/"]
    commands = [line.strip() for line in result.stdout.splitlines()[1:]]
    assert commands[0] == "cd proj" and len(commands) == 4
    assert commands[1].startswith("ragexp run dataset=my_set system=my_service")
    assert commands[3].startswith("ragexp gate --baseline")
    again = invoke("init", "proj")
    assert again.code == 1 and "already exists" in again.stderr and again.stderr.count("\n") == 1
    assert invoke("init", "proj", "--force").code == 0
    assert (project / ".gitignore").read_text(encoding="utf-8").count("mlruns/") == 1
    monkeypatch.chdir(project)
    config = compose(["dataset=my_set", "system=my_service", "gates=my_release"])
    release = compose(["gates=release"]).gates
    assert config.gates.rules == release.rules and config.gates.name == "my_release"
    assert (config.dataset.name, config.provider.name) == ("my_set", "my_service+none")
    assert config.provider.system.kind == "http"
    path = plan_run(compose(["dataset=my_set", "provider=fake"])).dataset.path
    assert path.resolve() == project / "data/my_set.jsonl"
    # The metric set is the packaged offline one with no metric of your own until one is uncommented.
    metrics = compose(["metrics=my_metrics"]).metrics
    assert (metrics.names, metrics.custom) == (compose(["metrics=offline"]).metrics.names, [])
    starter = (project / "conf/metrics/my_metrics.yaml").read_text(encoding="utf-8")
    assert starter.count("#   - name: ") == 2 and "kind: python" in starter and "kind: judge" in starter


def test_the_starter_metrics_run_once_uncommented(ragexp: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert invoke("init", ".").code == 0
    metrics = tmp_path / "conf/metrics/my_metrics.yaml"
    lines = metrics.read_text(encoding="utf-8").splitlines()
    # The Python example: its block of the commented list, the comment marks taken off.
    start = lines.index("# custom:")
    end = next(i for i, line in enumerate(lines) if "A rubric the configured judge" in line)
    uncommented = [line[2:] for line in lines[start:end] if not line.startswith("#   #")]
    kept = [line for line in lines[:start] if line != "custom: []"]
    metrics.write_text("\n".join([*kept, *uncommented]) + "\n", encoding="utf-8")
    result = ragexp("run", "dataset=my_set", "provider=fake", "metrics=my_metrics", "--json")
    assert result.code == 0, result.stderr
    assert result.json()["summary"]["hotline_in_refusal"] == 1.0
    # The rubric example needs a judge, and says so before anything runs.
    rubric = ragexp(
        "run",
        "dataset=my_set",
        "provider=fake",
        "metrics=my_metrics",
        "metrics.custom=[{name: p, kind: judge, rubric: polite}]",
    )
    assert rubric.code == 1 and "needs an LLM judge" in rubric.stderr


@pytest.mark.parametrize(("preset", "dataset"), [("sample", "kb_zh"), ("fake", "kb_zh"), ("replay", "scifacts_zh")])
def test_presets_without_outside_services_run(preset: str, dataset: str, ragexp: Any) -> None:
    result = ragexp("run", f"provider={preset}", f"dataset={dataset}", "--json")
    assert result.code == 0, result.stderr
    payload = result.json()
    assert payload["error_count"] == 0 and payload["config_hash"][:12] == PINNED[(preset, dataset)]


def test_a_setup_of_your_own_selects_your_own_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = tmp_path / "repo"
    (repo / "conf/dataset").mkdir(parents=True)
    (repo / "conf/setup").mkdir(parents=True)
    (repo / "data").mkdir()
    shutil.copy(package_data() / "scifacts_zh/cases.jsonl", repo / "data/mine.jsonl")
    (repo / "conf/dataset/mine.yaml").write_text("name: mine\npath: data/mine.jsonl\n", encoding="utf-8")
    (repo / "conf/setup/nightly.yaml").write_text(
        "# @package _global_\ndefaults:\n  - override /dataset: mine\n  - override /provider: replay\n"
        "experiment: nightly\nk: 4\n",
        encoding="utf-8",
    )
    monkeypatch.chdir(repo)
    config = compose(["setup=nightly"])
    assert (config.dataset.name, config.provider.name, config.k, config.experiment) == ("mine", "replay", 4, "nightly")
    plan = plan_run(config, tmp_path / "state")
    assert plan.dataset.path.resolve() == repo / "data/mine.jsonl" and len(plan.dataset.cases) > 0
    with pytest.raises(ConfigError, match="setup"):
        compose(["setup=weekly"])  # no such setup, in either folder


@pytest.mark.system  # a whole run: `make test`, not the edit loop
def test_a_preset_is_a_selection_named_by_its_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Presets set no name: provider.name is the option chosen, unless the command line changed
    its selection; a name a user's preset sets itself stays its own."""
    for path in (PACKAGED / "provider").glob("*.yaml"):
        assert "name:" not in path.read_text(encoding="utf-8"), path
    (tmp_path / "conf/provider").mkdir(parents=True)
    selection = "# @package _global_\ndefaults:\n  - override /system: replay\n  - override /judge: none\n"
    (tmp_path / "conf/provider/recorded.yaml").write_text(selection, encoding="utf-8")
    (tmp_path / "conf/provider/named.yaml").write_text(selection + "provider:\n  name: nightly\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    assert compose(["provider=recorded"]).provider.name == "recorded"
    assert compose(["provider=named"]).provider.name == "nightly"
    assert compose(["provider=recorded", "system=fake"]).provider.name == "fake+none"
    assert compose(["provider=named", "judge=openai"]).provider.name == "replay+openai"
    assert compose(["provider=named", "provider.name=mine"]).provider.name == "mine"
    same = plan_run(compose(["provider=recorded", "dataset=scifacts_zh"]), tmp_path / "state")
    assert same.config_hash[:12] != PINNED[("replay", "scifacts_zh")]  # another name, another config
    renamed = plan_run(compose(["provider=recorded", "dataset=scifacts_zh", "provider.name=replay"]), tmp_path / "s")
    assert renamed.config_hash[:12] == PINNED[("replay", "scifacts_zh")]


@pytest.mark.system  # a whole run: `make test`, not the edit loop
def test_sweep_points_name_the_provider_as_a_single_run_does(ragexp: Any) -> None:
    swept = ragexp("run", "-m", "provider=fake,replay", "system=replay", "dataset=scifacts_zh", "k=3", "--json")
    assert swept.code == 0, swept.stderr
    points = {run["point"]: run["run_id"] for run in swept.json()["runs"]}
    assert len(points) == 2
    for point, run_id in points.items():
        single = ragexp("run", *point.split(), "--json")
        assert single.code == 0, single.stderr
        listed = ragexp("runs", "--json", "--limit", "10").json()["runs"]
        by_id = {run["run_id"]: run for run in listed}
        assert by_id[run_id]["provider"] == "replay+none" == by_id[single.json()["run_id"]]["provider"]
        assert by_id[run_id]["config_hash"] == single.json()["config_hash"]


PRESETS = sorted(path.stem for tree in TREES for path in (tree / "provider").glob("*.yaml"))
RECORDED_ONLY = {"replay", "replay_judge"}
"""Presets that replay a dataset's recorded outputs: the default dataset records none."""


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_validates_on_the_default_dataset_or_names_the_one_that_fits(
    preset: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    result = invoke("validate", f"provider={preset}")
    if preset not in RECORDED_ONLY:
        assert result.code == 0, result.stderr
        return
    lines = result.stderr.strip().splitlines()
    assert result.code == 1 and len(lines) == 1, result.stderr
    assert lines[0].startswith(
        f"ragexp: error: metric 'recall_at_k' needs output field 'retrieved_ids', which provider {preset} "
    )
    assert lines[0].endswith("; datasets that fit: dataset=scifacts_zh")
    fits = invoke("validate", f"provider={preset}", "dataset=scifacts_zh")  # the fix it names works
    assert fits.code == 0, fits.stderr


def test_a_judged_replay_names_every_dataset_that_records_what_it_judges(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    result = invoke("validate", "provider=replay_judge", "metrics=core")
    assert result.code == 1
    assert result.stderr.strip().splitlines() == [
        "ragexp: error: metric 'faithfulness' needs output field 'response', which provider replay_judge does not "
        "give for every case of kb_zh; datasets that fit: dataset=scifacts_columns or dataset=scifacts_zh"
    ]
