"""Config identity: the canonical, secret-free view of a config, its hash and its params."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import BaseModel

from ragexp.config.models import RagexpConfig
from ragexp.secrets import mask_urls, scrub


def canonical_json(value: Any) -> str:
    """Deterministic JSON: sorted keys, no white space, UTF-8 kept."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def identity_view(model: BaseModel) -> dict[str, Any]:
    """The model as plain data without runtime-only fields, recursively."""
    out: dict[str, Any] = {}
    for name, info in type(model).model_fields.items():
        extra = info.json_schema_extra
        value = getattr(model, name)
        if isinstance(extra, dict) and (
            extra.get("runtime_only")
            or (extra.get("identity_omit_null") and value is None)
            or (extra.get("identity_omit_default") and value == info.default)
        ):
            continue  # an unset optional key leaves the hashes of configs without it unchanged
        out[name] = _plain(value)
    return out


def _plain(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return identity_view(value)
    if isinstance(value, dict):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    if isinstance(value, str):
        return redact(value)
    return value


def config_hash(
    config: RagexpConfig,
    dataset_file_sha256: str,
    judge: str = "none",
    system: str | None = None,
    metrics: dict[str, str] | None = None,
) -> str:
    """sha256 over the canonical identity view, the dataset file's content hash, the judge
    identity (which adds the prompts in use and the ragas version to the judge's config), the
    system's own identity when it has one (the sample system: its knowledge base's content) and
    the identities of the user's own metrics (a function's version or file hash; a rubric's text
    and scale, which the config view holds too)."""
    payload: dict[str, Any] = {"config": identity_view(config), "dataset_file_sha256": dataset_file_sha256}
    payload["judge"] = judge
    if system is not None:
        payload["system"] = system
    if metrics:
        payload["metrics"] = metrics
    return sha256_text(canonical_json(payload))


def redact(text: str) -> str:
    """Mask credentials written into URLs (``https://user:pass@host``, ``?api_key=...``) and every
    registered secret (a value reached through ``${oc.env:...}`` that the config also reads as a
    credential): what params, ``config.yaml`` and the hash see."""
    return scrub(mask_urls(text))


def resolved_config(config: RagexpConfig) -> dict[str, Any]:
    """The full resolved config as plain data, with URL credentials masked."""
    data = config.model_dump(mode="json")
    redacted: dict[str, Any] = json.loads(redact(json.dumps(data, ensure_ascii=False)))
    return redacted


def run_params(config: RagexpConfig) -> dict[str, str]:
    """MLflow params: what the run measured with, without noise. Runtime-only keys (URIs,
    concurrency, paths, names) and nulls are left out, and the gate rules are one JSON param
    (the whole resolved config is the run's ``config.yaml`` artifact)."""
    view = identity_view(config)
    rules = view.get("gates", {}).pop("rules", None)
    view.setdefault("dataset", {})["name"] = config.dataset.name
    params = flatten(_without_nulls(view))
    if rules:
        params["gates.rules"] = canonical_json(_without_nulls(rules))
    return params


def _without_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _without_nulls(item) for key, item in value.items() if item is not None}
    return value


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """``{"a": {"b": 1}}`` -> ``{"a.b": "1"}``; lists and nulls become JSON text."""
    flat: dict[str, str] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(flatten(value, f"{name}."))
        elif isinstance(value, str):
            flat[name] = value
        else:
            flat[name] = json.dumps(value, ensure_ascii=False)
    return flat
