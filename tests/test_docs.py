"""The documentation holds together: every relative link and anchor resolves, the README's
commands run as shown, and every tag, metric and config key (param) the reference pages list is
one the code writes, and the reverse."""

from __future__ import annotations

import ast
import functools
import json
import re
import shlex
import types
import typing
from collections.abc import Iterator
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


@pytest.mark.system
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


def _doc_commands() -> list[tuple[str, str]]:
    """(page, command line) for every ``ragexp`` command in a code block of ``docs/``."""
    found = []
    for page in sorted((ROOT / "docs").glob("*.md")):
        fenced = False
        for line in page.read_text(encoding="utf-8").splitlines():
            if FENCE.match(line.strip()):
                fenced = not fenced
                continue
            command = re.sub(r"^\s*(\$ )?(\.venv/bin/)?", "", line)
            if fenced and command.startswith("ragexp "):
                found.append((page.name, command.split("  #")[0].rstrip(" \\")))
    return found


def test_every_option_and_override_in_the_docs_is_exercised_by_a_test() -> None:
    # Commands that need a live service, an NPU or CI variables are run by the tests of their
    # subject (test_http, test_judge, test_release, test_scale); here each of their options and
    # override keys must appear in some test, so a documented spelling no test uses fails.
    sources = [p for p in (ROOT / "tests").glob("test_*.py") if p.name != "test_docs.py"]
    tests = "\n".join(p.read_text(encoding="utf-8") for p in sources)
    missing = []
    for page, command in _doc_commands():
        for token in (t.strip("[]") for t in command.split()[1:]):
            word = token.split("=", 1)[0] + "=" if "=" in token and not token.startswith("-") else token
            if re.fullmatch(r"--[a-z-]+|[a-z_+~/.]*[a-z_]=", word) and word.lstrip("+~") not in tests:
                missing.append(f"{page}: {word}")
    assert missing == []


@pytest.mark.system
def test_gate_and_sample_pages_commands_run_as_shown(
    ragexp: Any, tmp_path: Path, store_uri: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ragexp.tracking.store import Store

    monkeypatch.chdir(tmp_path)
    base = ragexp("run", "--json").json()["run_id"]
    cand = ragexp("run", "provider.system.sample.chunking=sentence", "--json").json()["run_id"]
    Store(store_uri).set_tags(base, {"role": "production"})
    ids = {"BASELINE_ID": base, "B": base, "CANDIDATE_ID": cand, "C": cand}
    commands = [c for page, c in _doc_commands() if page in {"gates.md", "sample.md"}]
    assert len(commands) == 10
    for command in commands:
        args = [ids.get(arg, arg) for arg in shlex.split(command)[1:]]
        result = ragexp(*args)
        assert result.code in ({0, 2} if args[0] in {"gate", "demo"} else {0}), f"{command}: {result.stderr[-2000:]}"
    assert (tmp_path / "gate.xml").is_file() and (tmp_path / "gate.md").is_file()
    assert (tmp_path / "ragexp-demo").is_dir()


# --- Names: every tag, metric and config key (param) the docs list is one the code writes, and
# every one the code writes is in the docs. ---------------------------------------------------------

REFERENCE = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
"""The pages that state the contract (the CHANGELOG is history: it may name what is gone)."""
PACKAGE = ROOT / "ragexp"
DOC_TAG = re.compile(r"`(ragexp\.[a-z0-9_.<>*-]+?)(?:=[^`]*)?`")
CODE_TAG = re.compile(r"ragexp\.[a-z0-9_.-]*[a-z0-9_.]")
UNKNOWN = "\0"  # a part of a string the scan cannot know (a variable in an f-string)


def _reference_prose() -> dict[str, str]:
    return {str(page.relative_to(ROOT)): _prose(page.read_text(encoding="utf-8")) for page in REFERENCE}


@functools.cache
def _package_trees() -> list[tuple[Path, ast.Module]]:
    return [(path, ast.parse(path.read_text(encoding="utf-8"))) for path in sorted(PACKAGE.rglob("*.py"))]


def _module_constants(trees: list[ast.Module] | None = None) -> dict[str, ast.expr]:
    """Upper-case module-level names of the package (or of ``trees``) and what they are assigned."""
    found: dict[str, ast.expr] = {}
    for tree in trees if trees is not None else [tree for _, tree in _package_trees()]:
        for node in tree.body:
            target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None
            if isinstance(target, ast.Name) and target.id.isupper():
                found[target.id] = node.value
    return found


def _static_text(node: ast.AST, constants: dict[str, ast.expr], depth: int = 0) -> str:
    """The string an expression builds from literals and module constants (``TAG_PREFIX + "k"``,
    ``f"{TAG_PREFIX}sweep"``); what it cannot know is ``UNKNOWN``."""
    if depth > 8:
        return UNKNOWN
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name | ast.Attribute):
        name = node.id if isinstance(node, ast.Name) else node.attr
        return _static_text(constants[name], constants, depth + 1) if name in constants else UNKNOWN
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _static_text(node.left, constants, depth + 1) + _static_text(node.right, constants, depth + 1)
    if isinstance(node, ast.JoinedStr):
        return "".join(
            _static_text(part.value, constants, depth + 1) if isinstance(part, ast.FormattedValue) else str(part.value)
            for part in node.values
        )
    return UNKNOWN


@functools.cache
def code_tag_names() -> frozenset[str]:
    """Every ``ragexp.*`` name the package spells outside docstrings and import paths: run tags,
    trace metadata, JUnit properties, lock names. A name completed at run time (``ragexp.sweep.failed.``
    + n) ends in ``*``."""
    return frozenset(name for names in code_tag_names_by_module().values() for name in names)


@functools.cache
def code_tag_names_by_module() -> dict[str, frozenset[str]]:
    """:func:`code_tag_names` by the module (path under the package) that spells each."""
    by_module: dict[str, frozenset[str]] = {}
    for path, tree in _package_trees():
        names: set[str] = set()
        # A module's own constant wins over one of the same name elsewhere (PREFIX is in several).
        constants = {**_module_constants(), **_module_constants([tree])}
        skip = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr)}  # docstrings
        # A prefix constant (PREFIX = TAG_PREFIX + "sequential.") names no tag: its uses do.
        skip |= {
            id(n.value)
            for n in tree.body
            if isinstance(n, ast.Assign) and _static_text(n.value, constants).endswith(".")
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.BinOp | ast.JoinedStr):
                skip |= {id(inner) for inner in ast.walk(node) if inner is not node}
        for node in ast.walk(tree):
            if id(node) in skip or not isinstance(node, ast.Constant | ast.BinOp | ast.JoinedStr):
                continue
            text = _static_text(node, constants)
            for match in CODE_TAG.finditer(text):
                after = text[match.end() : match.end() + 1]
                if after == ":":  # "ragexp.providers.http:HttpProvider": an import path
                    continue
                name = match.group(0)
                if name.endswith(".") and _is_module(name[:-1]):  # import_module(f"ragexp.cli.commands.{name}")
                    continue
                names.add(name + "*" if after == UNKNOWN or name.endswith(".") else name)
        by_module[str(path.relative_to(PACKAGE))] = frozenset(names)
    return by_module


def _is_module(dotted: str) -> bool:
    path = ROOT.joinpath(*dotted.split("."))
    return path.is_dir() or path.with_suffix(".py").is_file()


def doc_tag_names() -> dict[str, set[str]]:
    """``ragexp.*`` names written alone in backticks in the reference pages -> the pages."""
    found: dict[str, set[str]] = {}
    for page, text in _reference_prose().items():
        for name in DOC_TAG.findall(text):
            family = re.sub(r"\.(<[^>]*>|N|\*)$", ".*", name)  # ragexp.sweep.failed.<n>, ragexp.gate.*
            if family.rstrip("*") != "ragexp.":  # "every ragexp.* name" names no tag
                found.setdefault(family, set()).add(page)
    return found


def _covers(pattern: str, name: str) -> bool:
    """``ragexp.gate.*`` covers ``ragexp.gate.verdict``; ``ragexp.promoted*`` covers ``ragexp.promoted.at``."""
    if pattern.endswith("*"):
        return name.rstrip("*").startswith(pattern[:-1])
    return pattern == name


@pytest.mark.system  # a whole run: `make test`, not the edit loop
def test_every_tag_the_docs_name_is_written_by_the_code_and_every_one_written_is_documented() -> None:
    code, docs = code_tag_names(), doc_tag_names()
    assert {"ragexp.config_hash", "ragexp.gate.verdict", "ragexp.sweep.failed.*"} <= code  # the scan sees them
    unknown = {
        f"{name} ({', '.join(sorted(pages))})"
        for name, pages in docs.items()
        if not any(_covers(name, written) or _covers(written, name) for written in code)
    }
    undocumented = {name for name in code if not any(_covers(pattern, name) for pattern in docs)}
    assert sorted(unknown) == [], "named in the docs, written nowhere"
    assert sorted(undocumented) == [], "written by the code, in no reference page"


def _table_rows(text: str) -> list[list[str]]:
    return [
        [cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip().strip("|"))]
        for line in text.splitlines()
        if line.startswith("| `")
    ]


OTHER_FIGURES = "## Other figures a run logs"


def _documented_metrics() -> tuple[dict[str, list[str]], set[str]]:
    """docs/metrics.md: metric name -> the other cells of its row (every backticked name of a
    first cell), and the names listed under OTHER_FIGURES (``<stage>``, ``*``: any part)."""
    text = _prose((ROOT / "docs/metrics.md").read_text(encoding="utf-8"))
    metrics, other = text.split(OTHER_FIGURES)
    rows: dict[str, list[str]] = {}
    for row in _table_rows(metrics):
        rows.update({name: row[1:] for name in re.findall(r"`([^`]+)`", row[0])})
    figures = {name for row in _table_rows(other) for name in re.findall(r"`([^`]+)`", row[0])}
    return rows, figures


def test_every_metric_of_the_registry_is_in_the_metrics_page_with_its_direction_and_the_reverse() -> None:
    from ragexp.metrics.registry import METRICS

    documented, figures = _documented_metrics()
    registry = {spec.name: spec for spec in METRICS.values()}
    assert set(documented) == set(registry)
    for name, spec in registry.items():
        assert documented[name][0] == spec.direction, name
        for alias in spec.aliases:
            assert f"`{alias}`" in documented[name][-1], (name, alias)
    # The other figures a run logs: each one's fixed part is spelled in the package.
    assert {"case_count", "error_count", "timing.<stage>.p95_seconds"} <= figures
    source = "\n".join(p.read_text(encoding="utf-8") for p in PACKAGE.rglob("*.py"))
    unknown = [name for name in figures if re.split(r"<[^>]*>|\*", name)[0] not in source]
    assert unknown == []


def _leaf_fields(model: Any, prefix: str = "", runtime: bool = False) -> Iterator[tuple[str, Any, bool, bool]]:
    """(dotted key, field, runtime-only, holds a nested model) for every field of the typed config,
    every system kind's fields included; a dict of rules is spelled ``KEY.<metric>.FIELD``, a list
    of models (the custom metrics, of either kind) ``KEY[].FIELD``."""
    for name, field in model.model_fields.items():
        path = prefix + name
        extra = field.json_schema_extra
        runtime_only = runtime or (isinstance(extra, dict) and bool(extra.get("runtime_only")))
        inner = _models_in(field.annotation)
        origin = typing.get_origin(field.annotation)
        values = _models_in(typing.get_args(field.annotation)[1]) if origin is dict else []
        items = _models_in(typing.get_args(field.annotation)[0]) if origin is list else []
        yield path, field, runtime_only, bool(inner or values)
        for sub in inner:
            yield from _leaf_fields(sub, path + ".", runtime_only)
        for sub in values:
            yield from _leaf_fields(sub, path + ".<metric>.", runtime_only)
        for sub in items:
            yield from _leaf_fields(sub, path + "[].", runtime_only)


def _models_in(annotation: Any) -> list[Any]:
    from pydantic import BaseModel

    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _models_in(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return [model for arg in typing.get_args(annotation) for model in _models_in(arg)]
    return [annotation] if isinstance(annotation, type) and issubclass(annotation, BaseModel) else []


def _shown_default(field: Any) -> str:
    from pydantic import BaseModel
    from pydantic_core import PydanticUndefined

    value = field.default_factory() if field.default_factory is not None else field.default
    if value is PydanticUndefined:
        return "(required)"
    if isinstance(value, BaseModel):
        return "(block)"
    if isinstance(value, str):
        return value or '""'
    return json.dumps(value, ensure_ascii=False)


def test_every_config_key_the_config_page_lists_is_a_typed_field_with_its_default_and_the_reverse() -> None:
    # Params are the flattened config, so these keys are the params a run logs (runtime-only ones
    # left out, and "hash: no" says which those are).
    from ragexp.config.models import RagexpConfig

    fields: dict[str, set[tuple[str, str]]] = {}
    nested: set[str] = set()
    for path, field, runtime_only, holds_model in _leaf_fields(RagexpConfig):
        fields.setdefault(path, set()).add((_shown_default(field), "no" if runtime_only else "yes"))
        if holds_model:
            nested.add(path)
    rows = _table_rows(_prose((ROOT / "docs/config.md").read_text(encoding="utf-8")))
    documented = {row[0].strip("`"): row for row in rows if len(row) == 4 and row[2] in {"yes", "no"}}
    wrong = []
    for key, (_, default, hashed, _) in documented.items():
        if key not in fields:
            wrong.append(f"{key}: no such key")
        elif (default.strip("`"), hashed) not in fields[key]:
            wrong.append(f"{key}: documented {default} / hash {hashed}, the models say {sorted(fields[key])}")
    assert wrong == []
    assert set(fields) - nested - set(documented) == set(), "typed keys the config page does not list"


def test_a_run_writes_only_names_the_docs_list(ragexp: Any, store_uri: str) -> None:
    """What a real run logs (the sample system, with its stage timings) against the lists above:
    its tags are ones the scan finds, its metrics are registry metrics or documented figures, its
    params are documented keys."""
    from mlflow.tracking import MlflowClient

    done = ragexp("run", "--json")
    assert done.code == 0, done.stderr
    run = MlflowClient(store_uri).get_run(done.json()["run_id"])
    code, (documented, figures) = code_tag_names(), _documented_metrics()
    tags = {key for key in run.data.tags if key.startswith("ragexp.")}
    assert {"ragexp.config_hash", "ragexp.status"} <= tags
    assert {tag for tag in tags if not any(_covers(name, tag) for name in code)} == set()
    patterns = [re.escape(name) for name in documented]
    patterns += [re.sub(r"<[^>]*>", "[^.]+", re.escape(name)).replace(r"\*", ".+") for name in figures]
    logged = set(run.data.metrics)
    assert any(name.startswith("timing.") for name in logged)
    assert {m for m in logged if not any(re.fullmatch(p, m) for p in patterns)} == set()
    keys = {row[0].strip("`") for row in _table_rows((ROOT / "docs/config.md").read_text(encoding="utf-8"))}
    keys |= {key.replace(".<metric>", "") for key in keys}
    # A block whose keys are all runtime-only (tracking, report) is logged as one empty ``{}``.
    from ragexp.config.models import RagexpConfig

    keys |= {path for path, _, _, holds_model in _leaf_fields(RagexpConfig) if holds_model}
    params = {re.sub(r"^gates\.rules\..*", "gates.rules", p) for p in run.data.params}
    assert params - keys == set()


# --- the lists that say they are complete, page by page -------------------------------------------


def _section(page: str, heading: str) -> str:
    """The prose of ``page`` under ``heading``, up to the next heading."""
    text = _prose((ROOT / page).read_text(encoding="utf-8"))
    rest = text[text.index(heading) + len(heading) :]
    end = re.search(r"^#{1,6} ", rest, re.MULTILINE)
    return rest[: end.start()] if end else rest


def _family(name: str) -> str:
    return re.sub(r"(\.(<[^>]*>|N|\*))+$", ".*", name)


JUNIT = "compare/junit.py"


def test_the_tags_table_holds_every_name_the_code_writes_and_the_junit_section_its_properties() -> None:
    by_module = code_tag_names_by_module()
    elsewhere = {name for module, names in by_module.items() if module != JUNIT for name in names}
    junit = set(by_module[JUNIT]) - elsewhere
    assert {"ragexp.verdict", "ragexp.gates"} <= junit  # the scan sees the JUnit properties
    table = _section("docs/traces.md", "## Tags ragexp writes")
    listed = {_family(name) for row in _table_rows(table) for name in DOC_TAG.findall(row[0])}
    written = code_tag_names() - junit
    assert sorted(n for n in listed if not any(_covers(n, w) or _covers(w, n) for w in written)) == []
    assert sorted(w for w in written if not any(_covers(n, w) for n in listed)) == []
    properties = _section("docs/ci.md", "## The JUnit report")
    assert {_family(name) for name in DOC_TAG.findall(properties)} == junit


def _metrics_bullet() -> str:
    """The list of figures of docs/mlflow.md's ``metrics:`` bullet (up to its notes on stage names)."""
    text = _prose((ROOT / "docs/mlflow.md").read_text(encoding="utf-8"))
    bullet = text[text.index("- metrics:") :]
    return bullet[: bullet.index("A stage name")]


def test_the_mlflow_pages_figures_are_the_metrics_pages_both_ways() -> None:
    _, figures = _documented_metrics()
    listed = set(re.findall(r"`([^`]+)`", _metrics_bullet()))
    assert "evaluation_seconds" in figures and "judge.*" in figures
    assert listed == figures


def test_a_metric_sets_limit_is_the_registrys_and_every_packaged_set_keeps_it() -> None:
    import yaml

    from ragexp.metrics.registry import MAX_JUDGE_METRICS, parse_metric_names

    for page, text in _reference_prose().items():
        for limit in re.findall(r"at most (\d+) judge metrics|the (\d+) judge metrics|1 to (\d+) names", text):
            assert int("".join(limit)) == MAX_JUDGE_METRICS, page
    stated = _prose((ROOT / "docs/config.md").read_text(encoding="utf-8"))
    assert f"at most {MAX_JUDGE_METRICS} judge metrics" in stated
    sets = sorted((ROOT / "conf" / "metrics").glob("*.yaml"))
    assert {path.stem for path in sets} >= {"full", "offline"}
    for path in sets:
        names = yaml.safe_load(path.read_text(encoding="utf-8"))["names"]
        judged = [spec for spec in parse_metric_names(names) if spec.judge]
        assert len(names) >= 1 and len(judged) <= MAX_JUDGE_METRICS, path.name
        counted = re.match(r"# (\d+) names", path.read_text(encoding="utf-8"))
        assert counted is None or int(counted.group(1)) == len(names), path.name


def test_a_runs_params_are_the_hashed_keys_the_config_page_lists_both_ways(
    ragexp: Any, store_uri: str, tmp_path: Path
) -> None:
    """docs/mlflow.md: params are the keys config.md marks ``hash: yes`` that the run does not
    leave null, plus ``dataset.name`` and ``gates.rules``; the blocks with runtime-only keys alone
    are one ``{}`` each."""
    import yaml
    from mlflow.tracking import MlflowClient

    done = ragexp("run", "--json")
    assert done.code == 0, done.stderr
    client = MlflowClient(store_uri)
    run_id = done.json()["run_id"]
    params = client.get_run(run_id).data.params
    config = yaml.safe_load(Path(client.download_artifacts(run_id, "config.yaml", str(tmp_path))).read_text())
    rows = _table_rows(_prose((ROOT / "docs/config.md").read_text(encoding="utf-8")))
    hashed = {row[0].strip("`"): row for row in rows if len(row) == 4 and row[2] == "yes"}
    missing = object()
    only_when = re.compile(r"only when it differs from its defaults?|leaves the config hash as it was")

    def at_a_default_left_out(key: str) -> bool:
        parts = key.split(".")
        blocks = [".".join(parts[:n]) for n in range(1, len(parts) + 1)]
        said = any(only_when.search(hashed[block][3]) for block in blocks if block in hashed)
        documented = hashed[key][1].strip("`")  # a string default is written bare, as the models say it
        return said and documented in (json.dumps(value(key), ensure_ascii=False), str(value(key)))

    def value(key: str) -> Any:
        found: Any = config
        for part in key.split("."):
            found = found.get(part, missing) if isinstance(found, dict) else missing
        return found

    expected = {
        key
        for key in hashed
        if "<" not in key and "[" not in key and not key.startswith("gates.rules")
        if value(key) is not missing and value(key) is not None and not isinstance(value(key), dict)
        if not at_a_default_left_out(key)
    }
    assert "metrics.custom" in hashed and "metrics.custom" not in expected  # the rule is read from the page
    blocks = {key for key, text in params.items() if text == "{}" and isinstance(value(key), dict)}
    assert blocks and "gates.rules" in params and "dataset.name" in params
    assert set(params) - blocks - {"gates.rules", "dataset.name"} == expected


def _artifacts_bullet() -> str:
    """docs/mlflow.md's ``artifacts`` bullet, up to the paragraph after it."""
    text = _prose((ROOT / "docs/mlflow.md").read_text(encoding="utf-8"))
    bullet = text[text.index("- artifacts") :]
    return bullet[: bullet.index("\n\n")]


def _artifact_constants() -> set[str]:
    """The file names ``ragexp/artifacts.py`` defines (its constants that name a file)."""
    from ragexp import artifacts

    return {
        value
        for name, value in vars(artifacts).items()
        if name.isupper() and isinstance(value, str) and re.fullmatch(r"[\w/]+\.\w+", value)
    }


def test_the_mlflow_pages_artifacts_are_the_artifact_modules_both_ways(ragexp: Any, store_uri: str) -> None:
    from ragexp import artifacts

    named = set(re.findall(r"`([^`\s]+\.(?:jsonl?|yaml|png))`", _artifacts_bullet()))
    comparison = artifacts.comparison("<baseline>")
    listed = {name.removeprefix(comparison + "/") for name in named if not name.startswith("ragexp/")}
    assert {"cases.jsonl", "traffic.json", "gate.json", "sweep/sweep.json"} <= listed
    assert listed == _artifact_constants()
    # and what a real run writes is among them
    from mlflow.tracking import MlflowClient

    done = ragexp("run", "--json")
    assert done.code == 0, done.stderr
    written = {item.path for item in MlflowClient(store_uri).list_artifacts(done.json()["run_id"])}
    assert {artifacts.CASES, artifacts.SCORES, artifacts.TIMINGS} <= written <= listed


def test_the_configs_comment_on_the_run_name_is_the_name_a_run_gets(ragexp: Any, store_uri: str) -> None:
    from mlflow.tracking import MlflowClient

    line = next(
        line
        for line in (ROOT / "conf/config.yaml").read_text(encoding="utf-8").splitlines()
        if line.startswith("run_name:")
    )
    shown, example = re.findall(r"null: (.+?), e\.g\. (\S+)", line)[0]
    done = ragexp("run", "--json")
    assert done.code == 0, done.stderr
    run = MlflowClient(store_uri).get_run(done.json()["run_id"])
    filled = {
        "<config hash[:12]>": run.data.tags["ragexp.config_hash"][:12],
        "<provider.name>": "sample",
        "<dataset.name>": run.data.params["dataset.name"],
        "<k>": run.data.params["k"],
    }
    for placeholder, value in filled.items():
        shown = shown.replace(placeholder, value)
    assert run.info.run_name == shown
    assert re.fullmatch(r"[0-9a-f]{12}-sample-kb_zh-k5", example) and shown.endswith("-sample-kb_zh-k5")
