"""Compose the config tree with Hydra and validate the result, once, into :class:`RagexpConfig`.

The tree is the packaged one (``conf/`` and the bundled experiments' ``setup/`` files:
``ragexp.paths.packaged_trees``) with the user's own config folder (``ragexp init``)
composed over it: a file in the user's folder wins over a packaged file of the same name, and
new files add options to the groups (``dataset=my_set``, ``system=my_service``).
"""

from __future__ import annotations

import re
import sys
import types
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from ragexp.config.models import CUSTOM_METRIC_KINDS, SYSTEM_KINDS, RagexpConfig
from ragexp.errors import ConfigError
from ragexp.paths import is_ragexp_checkout, packaged_trees, user_conf_dir

GROUPS = ("dataset", "metrics", "system", "judge", "provider", "gates", "setup")
"""Config groups of the tree; ``system`` and ``judge`` fill ``provider.system`` / ``provider.judge``;
``provider`` presets and ``setup`` named setups are ``@package _global_`` selections of the others."""


PACKAGED_PRIMARY = "ragexp_packaged_config"
"""Name of the packaged ``config.yaml`` in Hydra's ConfigStore, when a user folder has none."""


def search_path() -> tuple[Path, str, list[str]]:
    """(primary config folder, primary config name, extra Hydra overrides) for the user's folder
    over the packaged ones.

    Hydra searches the primary folder first and ``hydra.searchpath`` entries after it, so the
    user's folder is primary and the packaged tree backs it; without a user folder the packaged
    tree is primary. In a checkout the bundled experiments' folders (their ``setup/`` files) come
    after it; an installed package has those files inside its packaged tree.
    """
    packaged, *experiments = packaged_trees()
    user = user_conf_dir()
    if user is None or user == packaged:
        return packaged, "config", _search_after(experiments)
    if not user.is_dir():
        raise ConfigError(f"{user}: no such config folder (--config-dir / RAGEXP_CONFIG_DIR)")
    if is_ragexp_checkout(user.parent):
        raise ConfigError(
            f"{user}: the conf/ of a checkout of ragexp (ragexp's packaged config tree), not a config folder "
            "of your own (--config-dir / RAGEXP_CONFIG_DIR)"
        )
    name = "config"
    if not (user / "config.yaml").is_file():
        _store_packaged_primary(packaged)
        name = PACKAGED_PRIMARY
    return user, name, _search_after([packaged, *experiments])


def _search_after(folders: Sequence[Path]) -> list[str]:
    """The override that makes Hydra search ``folders`` after the primary one."""
    return [f"hydra.searchpath=[{','.join(_file_url(folder) for folder in folders)}]"] if folders else []


def _store_packaged_primary(packaged: Path) -> None:
    """Hydra looks the primary config up before it applies ``hydra.searchpath``, so a user folder
    without its own ``config.yaml`` gets the packaged one from Hydra's ConfigStore (searched
    last), defaults list included. Not under the name ``config``: Hydra would take a stored node
    of the same name as a schema for every ``config.yaml``."""
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    ConfigStore.instance().store(
        name=PACKAGED_PRIMARY, node=OmegaConf.load(packaged / "config.yaml"), provider="ragexp"
    )


def _file_url(path: Path) -> str:
    text = f"file://{path.as_posix()}"
    # Hydra's override grammar reads these characters as syntax, unless quoted.
    return f"'{text}'" if any(ch in path.as_posix() for ch in ' ,[]{}()=:"$') else text


def metric_sets() -> dict[str, list[str]]:
    """The named metric sets of the config tree (``metrics=NAME``) and their metric names: the
    user's folder first, then the packaged ones (a file of the user's replaces a packaged one)."""
    import yaml

    folders = [*([user] if (user := user_conf_dir()) is not None else []), *packaged_trees()]
    sets: dict[str, list[str]] = {}
    for folder in folders:
        for path in sorted((folder / "metrics").glob("*.yaml")):
            if path.stem in sets:
                continue
            try:
                data = yaml.safe_load(path.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, yaml.YAMLError):
                continue
            names = data.get("names") if isinstance(data, dict) else None
            if isinstance(names, list) and all(isinstance(name, str) for name in names):
                sets[path.stem] = names
    return sets


def compose(overrides: Sequence[str] = ()) -> RagexpConfig:
    """Compose the config tree with command-line overrides and validate it."""
    return validate(name_dataset_from_path(compose_raw(overrides), overrides))


def from_composed(raw: dict[str, Any], choices: dict[Any, Any], overrides: Sequence[str]) -> RagexpConfig:
    """A config Hydra composed elsewhere (a sweep point: its resolved tree, its group choices and
    its task overrides) finished and validated as :func:`compose` finishes its own."""
    plain = empty_mappings({str(key): value for key, value in raw.items()}, overrides)
    name_provider(plain, choices, overrides)
    return validate(name_dataset_from_path(plain, overrides))


_EMPTY_MAPPING = re.compile(r"^\+{0,2}(?P<key>[\w.-]+)=\s*\{\s*\}\s*$")


def empty_mappings(raw: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """``key={}`` empties the mapping at ``key``: Hydra merges a mapping given on the command
    line into the one a preset sets, so ``provider.system.headers_env={}`` would keep the
    preset's Authorization header (and demand its variable) instead of sending none. Keys that a
    later override sets inside it (``+provider.system.headers_env.X-Api-Key=VAR``) are kept."""
    for index, item in enumerate(overrides):
        match = _EMPTY_MAPPING.match(item)
        if match is None:
            continue
        path = match.group("key")
        *parents, last = path.split(".")
        node: Any = raw
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if not isinstance(node, dict) or not isinstance(node.get(last), dict):
            continue
        inside = [key for key in overridden_keys(overrides[index + 1 :]) if key.startswith(path + ".")]
        later = {key[len(path) + 1 :].split(".")[0] for key in inside}
        node[last] = {key: value for key, value in node[last].items() if key in later}
    return raw


def overridden_keys(overrides: Sequence[str]) -> set[str]:
    """The key paths the command line sets (``+``/``++``/``~`` prefixes dropped)."""
    return {item.split("=", 1)[0].lstrip("+~") for item in overrides if "=" in item}


GENERIC_STEMS = frozenset({"cases", "data", "dataset", "eval", "test", "testset", "questions"})


def name_dataset_from_path(raw: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """``dataset.path=FILE`` without ``dataset.name=``: the run is about FILE, not the bundled
    set the group selected, so its name comes from the file (``my_set.jsonl`` -> ``my_set``;
    ``foo/cases.jsonl`` -> ``foo-cases``) and the bundled set's author and description go."""
    keys = overridden_keys(overrides)
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
    import yaml
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf import OmegaConf, open_dict
    from omegaconf.errors import OmegaConfBaseException

    overrides = prepare_overrides(overrides)
    directory, name, extra = search_path()
    try:
        with initialize_config_dir(config_dir=str(directory), version_base="1.3", job_name="ragexp"):
            cfg = hydra_compose(config_name=name, overrides=[*overrides, *extra], return_hydra_config=True)
        choices = OmegaConf.to_container(cfg.hydra.runtime.choices)
        with open_dict(cfg):
            del cfg["hydra"]
        raw = OmegaConf.to_container(cfg, resolve=True)
    except (HydraException, OmegaConfBaseException) as exc:
        message = _first_line(str(exc))
        unknown = re.fullmatch(r"Could not override '([^']+)'\.", message)
        if unknown:
            # Hydra's struct mode refuses a key no config file sets; its wording names no cause.
            key = unknown.group(1)
            message = unset_key(key) or f"{key}: no such key{closest_key_hint(key)}"
        missing = re.search(r"Could not find '(\w+)/([^']+)'", message)
        if missing:
            message += option_hint(directory, missing.group(1), missing.group(2))
        indexed = _indexed_key(overrides) if unknown or "LexerNoViableAlt" in message else None
        if indexed:
            message = (
                f"{indexed[0]}: an override cannot reach into a list ({indexed[1]}): set the whole list, "
                f"'{indexed[2]}=[...]' in quotes, or write it in a config file of yours (docs/config.md)"
            )
        elif "LexerNoViableAlt" in message or "mismatched input" in message:
            message += " (quote a value with spaces or other special characters: key='value')"
        raise ConfigError(f"config: {message}") from None
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ConfigError(unreadable_yaml(exc, directory)) from None
    if not isinstance(raw, dict):  # pragma: no cover - config.yaml is a mapping by construction
        raise ConfigError(f"{directory / 'config.yaml'}: the config must be a mapping")
    plain = empty_mappings({str(key): value for key, value in raw.items()}, overrides)
    name_provider(plain, choices if isinstance(choices, dict) else {}, overrides)
    for note in replaced_packaged(directory, name, choices if isinstance(choices, dict) else {}):
        sys.stderr.write(note + "\n")
    return plain


_INDEX = re.compile(r"(?:\[\d+\]|\.\d+)(?=[.\[]|$)")


def _indexed_key(overrides: Sequence[str]) -> tuple[str, str, str] | None:
    """The first override whose key indexes a list (``metrics.custom[0].path``, ``metrics.custom.0.path``):
    the override, its key and the list's key. Hydra's grammar has no index, and a list's items are no keys."""
    for override in overrides:
        key = override.split("=", 1)[0].lstrip("+~")
        found = _INDEX.search(key)
        if found:
            return override, key, key[: found.start()]
    return None


_SAID: set[Path] = set()
"""Replacements already said in this process (a sweep composes once per point)."""


def replaced_packaged(directory: Path, name: str, choices: dict[Any, Any]) -> list[str]:
    """One note per file of the user's folder that replaces a packaged one in this composition.

    A user file of a packaged option's name is composed instead of it, not over it: a repository's
    ``conf/gates/release.yaml`` is the whole ``release`` gate. That is worth one line, once."""
    packaged = packaged_trees()
    if directory == packaged[0]:
        return []
    selected = [("config.yaml", "config", "config")] if name == "config" else []
    selected += [
        (f"{group}/{option}.yaml", str(group), str(option))
        for group, option in choices.items()
        if isinstance(option, str) and not str(group).startswith("hydra")
    ]
    notes = []
    for relative, group, option in selected:
        mine = directory / relative
        if mine.is_file() and any((tree / relative).is_file() for tree in packaged) and mine not in _SAID:
            _SAID.add(mine)
            what = "config.yaml" if group == "config" else f"{group}={option}"
            notes.append(f"note: {mine} replaces the packaged {what} (used instead of it, not merged over it)")
    return notes


def unreadable_yaml(exc: Exception, directory: Path) -> str:
    """One line for a config file that is not YAML, or not UTF-8 text: file, line, column."""
    import yaml

    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        what = exc.problem or "invalid YAML"
        if exc.context:
            what = f"{exc.context}: {what}"
        return f"{mark.name}: line {mark.line + 1}, column {mark.column + 1}: invalid YAML ({what})"
    if isinstance(exc, UnicodeDecodeError):
        # The decoder does not know which file it read: the first of the user's files that is
        # not UTF-8 (packaged files are).
        for path in sorted(directory.rglob("*.yaml")):
            data = path.read_bytes()
            try:
                data.decode("utf-8")
            except UnicodeDecodeError as bad:
                line = data.count(b"\n", 0, bad.start) + 1
                column = bad.start - (data.rfind(b"\n", 0, bad.start) + 1) + 1
                return (
                    f"{path}: line {line}, column {column}: not UTF-8 text "
                    f"(byte 0x{data[bad.start]:02x}); config files are YAML in UTF-8"
                )
        return f"config: a file under {directory} is not UTF-8 text ({exc.reason})"
    return f"config: invalid YAML ({_first_line(str(exc))})"


def name_provider(raw: dict[str, Any], choices: dict[Any, Any], overrides: Sequence[str]) -> None:
    """``provider.name`` says what answered and judged. A preset is a selection only (its file
    sets no name): its name is the ``provider`` option chosen, or ``system+judge`` when
    ``system=`` / ``judge=`` on the command line changed the preset's selection, or when no preset
    is chosen. A ``provider.name`` set on the command line wins, one set by a file of the user's
    wins over the derived preset name. It is a tag and part of the config hash, like any other key."""
    provider = raw.get("provider")
    keys = overridden_keys(overrides)
    if not isinstance(provider, dict) or "provider.name" in keys:
        return
    preset = choices.get("provider")
    if {"system", "judge"} & keys or not isinstance(preset, str):
        provider["name"] = f"{choices.get('system')}+{choices.get('judge')}"
    elif not provider.get("name"):
        provider["name"] = preset


def validate(raw: dict[str, Any]) -> RagexpConfig:
    """Validate a plain composed config (``hydra`` node ignored) into typed models."""
    data = {key: value for key, value in raw.items() if key != "hydra"}
    try:
        return RagexpConfig.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors()
        first = errors[0]
        location, kind = _location(first["loc"])
        message = first["msg"]
        if first["type"] == "extra_forbidden":
            message = f"unknown key for kind '{kind}'" if kind else "unknown key"
            message += closest_key_hint(location, kind)
        elif first["type"] in ("union_tag_invalid", "union_tag_not_found"):
            context = first.get("ctx", {})
            location += "." + str(context.get("discriminator", "kind")).strip("'")
            metric = location.startswith("metrics.custom")
            known = ", ".join(sorted(CUSTOM_METRIC_KINDS if metric else SYSTEM_KINDS))
            what = "metric kind" if metric else "provider"
            message = (
                f"unknown {what} '{context.get('tag')}' (known: {known})"
                if first["type"] == "union_tag_invalid"
                else f"required (one of {known})"
            )
        elif "input" in first and not isinstance(first["input"], dict | list):
            message += f" (got {first['input']!r})"
        more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
        raise ConfigError(f"config: {location}: {message}{more}") from None


def _location(loc: Sequence[int | str]) -> tuple[str, str | None]:
    """The dotted key path of a validation error, and the system or metric kind it was checked
    against: pydantic puts the discriminator's tag into the path of a union member
    (``provider.system.fake.url``, ``metrics.custom.0.python.target``), which is no key of the
    config. A list entry is said as ``metrics.custom[0]``."""
    parts = [str(part) for part in loc]
    kind = None
    if len(parts) > 2 and parts[:2] == ["provider", "system"] and parts[2] in SYSTEM_KINDS:
        kind = parts.pop(2)
    if len(parts) > 2 and parts[:2] == ["metrics", "custom"] and parts[2].isdigit():
        parts[1:3] = [f"custom[{parts[2]}]"]
        if len(parts) > 2 and parts[2] in CUSTOM_METRIC_KINDS:
            kind = parts.pop(2)
    return ".".join(parts) or "config", kind


def prepare_overrides(overrides: Sequence[str]) -> list[str]:
    """The overrides as Hydra should read them: non-ASCII values quoted, typed keys forced."""
    return [force_typed_key(quote_plain_value(item)) for item in overrides]


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


def force_typed_key(override: str) -> str:
    """``provider.system.timeout_s=5`` as ``++provider.system.timeout_s=5`` when the key is a
    field of the typed models: config files set only what differs from the typed defaults, so a
    key they do not list is absent from the composed tree and Hydra's struct mode would refuse it.
    The typed models, not the YAML files, say which keys exist; any other key is left to Hydra
    (and a misspelt one is refused as before). Group selections (``system=http``) are untouched."""
    match = re.match(r"^(?P<key>[\w.-]+)=", override)
    if match is None:
        return override
    key = match.group("key")
    if key in GROUPS or key.startswith("hydra"):
        return override
    return "++" + override if is_typed_leaf(key.split(".")) else override


def known_keys(model: type[BaseModel] = RagexpConfig, prefix: str = "") -> dict[str, set[str]]:
    """Every key of the typed models, dotted (``provider.system.target``), with the system kinds
    it belongs to (empty: any). A mapping of models (``gates.rules``) is walked under ``*``."""
    found: dict[str, set[str]] = {}
    for name, field in model.model_fields.items():
        key = prefix + name
        annotation = _unwrap(field.annotation)
        members = _model_union(annotation)
        if members:
            found.setdefault(key, set())
            for member in members:
                kind = member.model_fields.get("kind")
                kinds = set(typing.get_args(kind.annotation)) if kind is not None else set()
                for sub, within in known_keys(member, key + ".").items():
                    found.setdefault(sub, set()).update(within or kinds)
            continue
        if typing.get_origin(annotation) is dict:
            value = _unwrap(typing.get_args(annotation)[1])
            if isinstance(value, type) and issubclass(value, BaseModel):
                found.update(known_keys(value, key + ".*."))
                continue
        found[key] = set()
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            found.update(known_keys(annotation, key + "."))
    return found


def unset_key(key: str) -> str | None:
    """The message for a key of the typed models that this composition does not set (a block such
    as ``provider.system.response`` that the system's file leaves out): it is added with ``+``, not
    overridden; a block's keys are named. None for a key the models do not have."""
    given = key.split(".")
    concrete = {
        ".".join(given[i] if part == "*" and i < len(given) else part for i, part in enumerate(known.split(".")))
        for known in known_keys()
    }
    inside = sorted({k[len(key) + 1 :].split(".")[0] for k in concrete if k.startswith(key + ".")})
    if key not in concrete:
        return None
    message = f"{key}: this config does not set it, so there is nothing to override: add it with '+{key}=...'"
    if inside:
        message += f", or set some of its keys ({', '.join(inside)}) with '{key}.KEY=...'"
    return message


def closest_key_hint(key: str, kind: str | None = None) -> str:
    """`` (did you mean provider.system.target?)`` for a key the config does not have: the keys
    ending in the same name (``target=`` -> ``provider.system.target``), else the nearest
    spellings; under provider.system, only keys of the system kind in use. Empty when nothing is near."""
    import difflib

    keys = known_keys()
    parts = key.split(".")
    # Keys under a mapping are matched with their entry's name put in (gates.rules.mrr.max_drop).
    concrete = {}
    for known, kinds in keys.items():
        pattern = known.split(".")
        if "*" in pattern and len(pattern) == len(parts):
            pattern = [part if part != "*" else given for part, given in zip(pattern, parts, strict=True)]
        concrete[".".join(pattern)] = kinds

    def fits(known: str) -> bool:
        return kind is None or not concrete[known] or kind in concrete[known]

    ranked = [known for known in concrete if fits(known) and known != key]
    parent = parts[:-1]
    siblings = {known.split(".")[-1]: known for known in ranked if known.split(".")[:-1] == parent}
    anywhere = {known.split(".")[-1]: known for known in reversed(ranked)}
    tail = [known for known in ranked if known.split(".")[-len(parts) :] == parts]
    if not tail:
        tail = [siblings[name] for name in difflib.get_close_matches(parts[-1], list(siblings), n=1, cutoff=0.6)]
    if not tail:  # a misspelt folder of the right name: provider.sytem.url
        same_name = {".".join(known.split(".")[:-1]): known for known in ranked if known.split(".")[-1] == parts[-1]}
        tail = [
            same_name[path] for path in difflib.get_close_matches(".".join(parent), list(same_name), n=1, cutoff=0.8)
        ]
    if not tail and not parent:  # a misspelt group (systm=) or bare key (experimnt=)
        tail = difflib.get_close_matches(parts[-1], GROUPS, n=1, cutoff=0.75)
        tail = tail or [
            anywhere[name] for name in difflib.get_close_matches(parts[-1], list(anywhere), n=1, cutoff=0.8)
        ]
    if not tail:
        return ""
    shown = " or ".join(tail[:3])
    return f" (did you mean {shown}?)"


def option_hint(directory: Path, group: str, option: str) -> str:
    """`` (did you mean http? options: ...)`` for an option a group does not have."""
    import difflib

    folders = [directory, *packaged_trees()]
    options = sorted({path.stem for folder in folders for path in (folder / group).glob("*.yaml")})
    if not options:
        return ""
    near = difflib.get_close_matches(option, options, n=1, cutoff=0.6)
    guess = f"did you mean {group}={near[0]}? " if near else ""
    return f" ({guess}{group} options: {', '.join(options)})"


def is_typed_leaf(path: Sequence[str], model: type[BaseModel] = RagexpConfig) -> bool:
    """Whether ``path`` names a value (not a whole block) in the typed config models."""
    annotation: Any = model
    for index, part in enumerate(path):
        annotation = _unwrap(annotation)
        members = _model_union(annotation)
        if members:  # a discriminated union (the system kinds): a key of any member
            return any(is_typed_leaf(path[index:], member) for member in members)
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            field = annotation.model_fields.get(part)
            if field is None:
                return False
            annotation = field.annotation
        elif typing.get_origin(annotation) is dict:
            annotation = typing.get_args(annotation)[1]
        else:
            return False
        if index == len(path) - 1:
            inner = _unwrap(annotation)
            return not (isinstance(inner, type) and issubclass(inner, BaseModel))
    return False


def _model_union(annotation: Any) -> list[type[BaseModel]]:
    """The members of a union of several models (``Annotated`` metadata dropped), else []."""
    if typing.get_origin(annotation) is typing.Annotated:
        annotation = typing.get_args(annotation)[0]
    if typing.get_origin(annotation) not in (typing.Union, types.UnionType):
        return []
    members = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
    if len(members) < 2 or not all(isinstance(arg, type) and issubclass(arg, BaseModel) for arg in members):
        return []
    return members


def _unwrap(annotation: Any) -> Any:
    """``X | None`` -> ``X``."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation


def _first_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[0] if lines else "invalid config"
