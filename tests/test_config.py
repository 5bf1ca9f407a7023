"""Composition, validation and the config hash."""

from __future__ import annotations

from pathlib import Path

import pytest

from ragexp.config.compose import compose
from ragexp.config.identity import config_hash, flatten, identity_view, resolved_config
from ragexp.errors import ConfigError
from ragexp.workflows.run_plan import plan_run
from tests.conftest import ROOT, write_jsonl


def test_defaults_compose_into_typed_models() -> None:
    cfg = compose([])
    assert cfg.k == 5 and cfg.dataset.name == "kb_zh" and cfg.provider.system.kind == "sample"
    assert cfg.metrics.names[0] == "recall_at_k" and cfg.gates.rules["mrr"].max_drop == 0.01
    assert cfg.provider.judge is None


def test_overrides_reach_every_group() -> None:
    cfg = compose(
        [
            "k=10",
            "dataset=scifacts_zh",
            "provider=replay",
            "metrics=retrieval",
            "experiment=exp-x",
            "gates.rules.mrr.max_drop=0.02",
            "tracking.uri=sqlite:///x.db",
        ]
    )
    assert (cfg.k, cfg.dataset.name, cfg.provider.name, cfg.metrics.set) == (10, "scifacts_zh", "replay", "retrieval")
    assert cfg.experiment == "exp-x" and cfg.gates.rules["mrr"].max_drop == 0.02
    assert cfg.tracking.uri == "sqlite:///x.db"


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["k=0"], "config: k: Input should be greater than or equal to 1 (got 0)"),
        (["k=ten"], "config: k: Input should be a valid integer"),
        (["nope=1"], "config: nope: no such key"),
        (["dataset=missing"], "config: In 'config': Could not find 'dataset/missing'"),
        (["provider.system.kind=ftp"], None),
        (["+provider.system.colour=red"], "config: provider.system.colour: unknown key"),
    ],
)
def test_bad_config_is_one_line(overrides: list[str], message: str | None) -> None:
    with pytest.raises(ConfigError) as info:
        cfg = compose(overrides)
        plan_run(cfg)  # an unknown provider kind is found when the provider is looked up
    text = str(info.value)
    assert "\n" not in text
    if message:
        assert text.startswith(message)
    else:
        assert "unknown provider 'ftp'" in text


def hash_of(overrides: list[str]) -> str:
    return plan_run(compose(overrides)).config_hash


def test_config_hash_is_stable_under_override_order() -> None:
    a = hash_of(["k=7", "dataset=scifacts_zh", "provider=replay"])
    b = hash_of(["provider=replay", "k=7", "dataset=scifacts_zh"])
    assert a == b and len(a) == 64


def test_config_hash_ignores_runtime_only_keys() -> None:
    base = hash_of([])
    assert hash_of(["concurrency=64", "tracking.uri=sqlite:///elsewhere.db", "progress=true"]) == base
    http = config_hash(compose(["system=http"]), "dataset")
    tuned = compose(["system=http", "provider.system.timeout_s=5", "provider.system.max_retries=0"])
    assert config_hash(tuned, "dataset") == http


def test_config_hash_changes_with_what_is_measured(tmp_path: Path) -> None:
    base = hash_of([])
    changed = {
        hash_of(["k=3"]),
        hash_of(["metrics=retrieval"]),
        hash_of(["dataset=scifacts_zh", "provider=replay"]),
        hash_of(["dataset=scifacts_zh", "provider=fake"]),
        hash_of(["gates.rules.mrr.max_drop=0.05"]),
    }
    assert base not in changed and len(changed) == 5
    # Same path, different content: the hash follows the content.
    source = (ROOT / "ragexp/data/kb_zh/cases.jsonl").read_text(encoding="utf-8")
    copy = tmp_path / "kb.jsonl"
    copy.write_text(source, encoding="utf-8")
    same_content = hash_of([f"dataset.path={copy}"])
    assert same_content == base  # where the file lives is not identity
    copy.write_text(source.replace("七天", "7 天"), encoding="utf-8")
    assert hash_of([f"dataset.path={copy}"]) != base


def test_identity_view_and_params_hold_no_runtime_keys_or_url_credentials() -> None:
    cfg = compose(["system=http", "provider.system.url=https://user:s3cret@example.test/query"])
    view = identity_view(cfg)
    assert "concurrency" not in view and "path" not in view["dataset"]
    params = flatten(resolved_config(cfg))
    assert params["provider.system.url"] == "https://***@example.test/query"
    assert "s3cret" not in str(params)
    assert config_hash(cfg, "x") != config_hash(compose(["system=http"]), "x")


def test_relative_dataset_path_falls_back_to_project_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert plan_run(compose([])).dataset.path == ROOT / "ragexp/data/kb_zh/cases.jsonl"
    write_jsonl(tmp_path / "own.jsonl", [{"id": "a", "question": "q", "relevant_ids": ["d"], "expected_facts": ["f"]}])
    assert plan_run(compose(["dataset.path=own.jsonl", "provider=fake"])).dataset.path.name == "own.jsonl"
