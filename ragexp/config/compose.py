"""Compose ``conf/`` with Hydra and validate the result, once, into :class:`RagexpConfig`."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from ragexp.config.models import RagexpConfig
from ragexp.errors import ConfigError

PROJECT_ROOT = Path(__file__).resolve().parents[2]


def conf_dir() -> Path:
    """The config tree: ``RAGEXP_CONF_DIR`` if set, else ``conf/`` at the project root."""
    return Path(os.environ.get("RAGEXP_CONF_DIR") or PROJECT_ROOT / "conf").resolve()


def compose(overrides: Sequence[str] = ()) -> RagexpConfig:
    """Compose the config tree with command-line overrides and validate it."""
    return validate(name_dataset_from_path(compose_raw(overrides), overrides))


GENERIC_STEMS = frozenset({"cases", "data", "dataset", "eval", "test", "testset", "questions"})


def name_dataset_from_path(raw: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """``dataset.path=FILE`` without ``dataset.name=``: the run is about FILE, not the bundled
    set the group selected, so its name comes from the file (``my_set.jsonl`` -> ``my_set``;
    ``foo/cases.jsonl`` -> ``foo-cases``) and the bundled set's author and description go."""
    keys = {item.split("=", 1)[0].lstrip("+~") for item in overrides if "=" in item}
    dataset = raw.get("dataset")
    if "dataset.path" not in keys or not isinstance(dataset, dict) or not dataset.get("path"):
        return raw
    path = Path(str(dataset["path"]))
    stem = path.stem or path.name
    name = f"{path.parent.name}-{stem}" if stem.lower() in GENERIC_STEMS and path.parent.name else stem
    derived = dict(dataset)
    if "dataset.name" not in keys:
        derived["name"] = name
    if "dataset.description" not in keys:
        derived["description"] = ""
    if "dataset.author" not in keys:
        derived["author"] = "unknown"
    return {**raw, "dataset": derived}


def compose_raw(overrides: Sequence[str] = ()) -> dict[str, Any]:
    """Compose with Hydra and resolve interpolations; errors become one-line ConfigErrors."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    overrides = [quote_plain_value(item) for item in overrides]
    directory = conf_dir()
    if not (directory / "config.yaml").is_file():
        raise ConfigError(f"{directory}: no config.yaml (set RAGEXP_CONF_DIR to a config tree)")
    try:
        with initialize_config_dir(config_dir=str(directory), version_base="1.3", job_name="ragexp"):
            cfg = hydra_compose(config_name="config", overrides=list(overrides))
        raw = OmegaConf.to_container(cfg, resolve=True)
    except (HydraException, OmegaConfBaseException) as exc:
        message = _first_line(str(exc))
        if "LexerNoViableAlt" in message or "mismatched input" in message:
            message += " (quote a value with spaces or other special characters: key='value')"
        raise ConfigError(f"config: {message}") from None
    if not isinstance(raw, dict):  # pragma: no cover - config.yaml is a mapping by construction
        raise ConfigError(f"{directory / 'config.yaml'}: the config must be a mapping")
    return {str(key): value for key, value in raw.items()}


def validate(raw: dict[str, Any]) -> RagexpConfig:
    """Validate a plain composed config (``hydra`` node ignored) into typed models."""
    data = {key: value for key, value in raw.items() if key != "hydra"}
    try:
        return RagexpConfig.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors()
        first = errors[0]
        location = ".".join(str(part) for part in first["loc"]) or "config"
        message = first["msg"]
        if first["type"] == "extra_forbidden":
            message = "unknown key"
        elif "input" in first and not isinstance(first["input"], dict | list):
            message += f" (got {first['input']!r})"
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise ConfigError(f"config: {location}: {message}{more}") from None


_OVERRIDE = re.compile(r"^(?P<key>[+~]{0,2}[\w.@/-]+)=(?P<value>.+)$")
_GRAMMAR = set(",[]{}()'\"\\$:=*")


def quote_plain_value(override: str) -> str:
    """``experiment=实验`` as ``experiment='实验'``: Hydra's override grammar reads only ASCII
    outside quotes. Values using the grammar (lists, sweeps, interpolations) are left alone."""
    match = _OVERRIDE.match(override)
    if match is None:
        return override
    value = match.group("value")
    if value.isascii() or any(ch in _GRAMMAR for ch in value):
        return override
    return f"{match.group('key')}='{value}'"


def _first_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[0] if lines else "invalid config"
