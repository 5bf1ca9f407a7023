"""One place per concept: metric knowledge in the registry, the artifact format in one module."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import orjson
import pytest

from ragexp import artifacts
from ragexp.compare.diff import MetricDiff, diagnose
from ragexp.errors import TrackingError
from ragexp.metrics.registry import _ALIASES, METRICS, case_values_metric, headline_metrics
from ragexp.tracking.store import Store
from tests.conftest import write_jsonl
from tests.test_compare import replay_rows, run_replay

PACKAGE = Path(__file__).resolve().parents[1] / "ragexp"
STAGE_TIMING = "p95_seconds"
"""Also the name of a per-stage timing figure (``timing.<stage>.p95_seconds``), not the metric."""
STAGE_TIMING_MODULES = {"workflows/run_log.py", "cli/views.py"}
"""The modules that name the per-stage timing figure."""


def test_no_metric_name_outside_the_registry() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name == "registry.py" and path.parent.name == "metrics":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in _ALIASES:
                if node.value == STAGE_TIMING and path.relative_to(PACKAGE).as_posix() in STAGE_TIMING_MODULES:
                    continue
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}: {node.value}")
    assert found == []


def test_registry_holds_headline_definitions_and_case_values() -> None:
    assert headline_metrics() == [
        "recall_at_k",
        "mrr",
        "answer_accuracy",
        "p95_seconds",
        "error_rate",
        "answer_correctness",
        "context_recall",
        "faithfulness",
    ]
    for spec in METRICS.values():
        assert spec.definition_zh and spec.describe("zh") == spec.definition_zh
        assert spec.describe("en") == spec.definition
        assert "seed" not in spec.source
    assert case_values_metric("errored").name == "error_rate"
    assert case_values_metric("latency").name == "p95_seconds"
    assert METRICS["error_rate"].mean_of_cases and not METRICS["p95_seconds"].mean_of_cases


def _moved(name: str, delta: float, baseline: float = 1.0) -> MetricDiff:
    # A run-level move without interval: moved() goes by the sign of the delta and the direction.
    direction = METRICS[name].direction
    return MetricDiff(name, direction, baseline, baseline + delta, delta, None, None, None, 0, 0, 0, 0)


def test_diagnosis_reads_stages_not_names() -> None:
    def rows(*moves: MetricDiff) -> list[str]:
        return [hint.row for hint in diagnose(list(moves))]

    # nDCG is a ranking metric like MRR: recall flat and nDCG down points at fusion or rerank.
    assert rows(_moved("recall_at_k", 0.0), _moved("ndcg_at_k", -0.1)) == ["stage_rerank"]
    assert rows(_moved("recall_at_k", -0.1), _moved("mrr", -0.1)) == ["stage_retrieval"]
    assert rows(_moved("mrr", 0.0), _moved("answer_accuracy", -0.1)) == ["stage_answer"]
    assert rows(_moved("faithfulness", 0.1), _moved("p95_seconds", 1.0, baseline=1.0)) == ["stage_tradeoff"]
    # A better error rate is no quality gain.
    assert rows(_moved("error_rate", -0.1, baseline=0.2), _moved("p95_seconds", 1.0)) == []
    (hint,) = diagnose([_moved("recall_at_k", 0.0), _moved("ndcg_at_k", -0.1)])
    assert hint.text() == (
        "recall flat but MRR down: fusion or rerank regressed "
        "(recall_at_k unchanged; ndcg_at_k 1.0000 -> 0.9000 (-0.1000))"
    )
    assert hint.text("zh").startswith("召回不变而 MRR 下降：融合或重排退化 (recall_at_k 不变; ")


def test_format_version_checked_with_one_line() -> None:
    today = {"case_ids": ["a"], "unanswerable": [False], "errored": [False], "latency_seconds": [0.5]}
    columns = artifacts.read_scores(orjson.dumps({**today, "metrics": {"mrr": [None]}}), "r1")
    assert columns.format_version == 1 and columns.metrics["mrr"].tolist() != columns.metrics["mrr"].tolist()
    with pytest.raises(TrackingError, match=r"^run r1: scores.json has artifact format 2, .*upgrade ragexp"):
        artifacts.read_scores(orjson.dumps({**today, "metrics": {}, "format_version": 2}), "r1")
    with pytest.raises(TrackingError, match=r"format 0, .*rerun it"):
        artifacts.read_summary(b'{"format_version": 0}', "r1")
    with pytest.raises(TrackingError, match=r"scores.json has no field 'metrics'"):
        artifacts.read_scores(orjson.dumps(today), "r1")


@pytest.mark.system  # a whole run: `make test`, not the edit loop
def test_runs_carry_the_version_and_a_newer_format_is_refused(ragexp: Any, store_uri: str, tmp_path: Path) -> None:
    base = run_replay(ragexp, write_jsonl(tmp_path / "a.jsonl", replay_rows([{"rank": 1}] * 4)))
    cand = run_replay(ragexp, write_jsonl(tmp_path / "b.jsonl", replay_rows([{"rank": 2}] * 4)))
    store = Store(store_uri)
    scores = orjson.loads(store.read_artifact(cand["run_id"], artifacts.SCORES))
    summary = artifacts.read_summary(store.read_artifact(cand["run_id"], artifacts.SUMMARY), cand["run_id"])
    assert scores["format_version"] == summary["format_version"] == artifacts.FORMAT_VERSION
    assert summary["summary"]["mrr"] == pytest.approx(0.5)

    # A run logged before the version field existed still compares.
    del scores["format_version"]
    store.log_files(cand["run_id"], {artifacts.SCORES: orjson.dumps(scores)})
    assert ragexp("diff", base["run_id"], cand["run_id"], "--json").code == 0

    store.log_files(cand["run_id"], {artifacts.SCORES: orjson.dumps({**scores, "format_version": 7})})
    refused = ragexp("diff", base["run_id"], cand["run_id"])
    assert refused.code == 1
    assert refused.stderr.strip().splitlines() == [
        f"ragexp: error: run {cand['run_id']}: scores.json has artifact format 7, "
        "this ragexp reads format 1; upgrade ragexp to read it"
    ]


def test_case_lines_found_with_numpy_are_the_lines_of_the_file() -> None:
    import random

    rng = random.Random(14)
    samples = [b"", b"\n", b" \t\n", b'{"id": "a"}\n{"id": "b"}\n', b'{"id": "a"}\r\n\r\n  {"id": "b"}  \n\x0c\n']
    samples += [bytes(rng.choice(b'ab {}" \t\r\n\x0b\x0c') for _ in range(rng.randint(0, 40))) for _ in range(2000)]
    for data in samples:
        found = artifacts.CaseLines(data)
        assert list(found) == artifacts.case_lines(data) and len(found) == len(artifacts.case_lines(data)), data


def test_one_info_line_writer_and_it_masks_urls(capsys: pytest.CaptureFixture[str]) -> None:
    from ragexp import outputs
    from ragexp.workflows import run, sequential

    writers = sorted(
        _module_name(path)
        for path in PACKAGE.rglob("*.py")
        for node in ast.parse(path.read_text(encoding="utf-8")).body
        if isinstance(node, ast.FunctionDef) and node.name == "info"
    )
    assert writers == ["ragexp.outputs"]
    assert run.info is sequential.info is outputs.info
    run.info("resuming from http://alice:s3cret@db.example:5000/store?token=t0k \x1b[2Jcase-1")
    line = capsys.readouterr().err
    assert "s3cret" not in line and "alice" not in line and "\x1b" not in line
    assert line.startswith("resuming from http://") and "db.example:5000/store" in line and line.endswith("case-1\n")


def test_the_runs_user_errors_are_in_the_one_hierarchy() -> None:
    from ragexp import errors

    stopped = errors.Interrupted("r1", 3, 10)
    assert isinstance(stopped, errors.Stopped) and isinstance(stopped, errors.RagexpError)
    assert (stopped.exit_code, stopped.run_id, str(stopped)) == (130, "r1", "run r1 interrupted after 3 of 10 cases")
    defined = {
        _module_name(path): node.name
        for path in PACKAGE.rglob("*.py")
        for node in ast.parse(path.read_text(encoding="utf-8")).body
        if isinstance(node, ast.ClassDef) and node.name in {"Stopped", "AllCasesErrored", "StoreLost", "NotFinished"}
    }
    assert set(defined) == {"ragexp.errors"}


# --- layering: no import cycles, a thin CLI, a light --help ---------------------------------------

COMMANDS_DIR = PACKAGE / "cli" / "commands"
COMMAND_TOP_IMPORTS = {
    "__future__",
    "typing",
    "typer",
    "ragexp.cli.options",
    "ragexp.cli.console",
    "ragexp.outputs",
    "ragexp.errors",
}
"""What a command module may import at its top: nothing that does a command's work, so that
``ragexp --help``, which reads every command's options, imports none of it."""
COMMAND_MAX_LINES = 100
ENTRY_POINTS = {
    "init": {"ragexp.workflows.init.init_project", "ragexp.workflows.init.next_commands"},
    "run": {
        "ragexp.workflows.run.run_config",
        "ragexp.workflows.multirun.run_sweep",
        "ragexp.workflows.sequential.run_until_decided",
    },
    "validate": {"ragexp.workflows.validate.check_dataset", "ragexp.workflows.validate.anchor_dataset"},
    "runs": {"ragexp.workflows.runs.list_runs"},
    "gate": {"ragexp.workflows.gate.run_gate"},
    "diff": {"ragexp.workflows.diff.compare_runs"},
    "sweep": {"ragexp.workflows.sweep.sweep_analysis"},
    "report": {"ragexp.workflows.report.publish_report", "ragexp.workflows.report.publish_sweep_report"},
    "demo": {"ragexp.workflows.demo.run_demo"},
    "power": {"ragexp.workflows.power.baseline_power"},
    "label": {"ragexp.workflows.label.label_run", "ragexp.workflows.label.export_labels"},
    "calibrate": {"ragexp.workflows.calibrate.calibrate_labels"},
    "datasets": {"ragexp.workflows.datasets.datasets_diff"},
    "draft": {
        "ragexp.workflows.draft.draft_set",
        "ragexp.workflows.draft.review_draft",
        "ragexp.workflows.draft.accept_draft",
    },
    "shadow": {"ragexp.workflows.shadow.run_shadow"},
}
"""The library functions each command calls: one per mode of the command (``run`` and ``run -m``,
``label`` and ``label export``...). Everything else a command module calls is parsing or
rendering (``ragexp.cli.views``)."""


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST, modules: set[str]) -> set[str]:
    """ragexp modules imported anywhere in ``tree`` (module level or inside functions), except
    under ``if TYPE_CHECKING:``; ``from package import module`` counts as the module."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _type_checking(child):
                for other in child.orelse:
                    visit_one(other)
                continue
            visit_one(child)

    def visit_one(node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name in modules)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                if sub in modules:
                    found.add(sub)
                elif node.module in modules:
                    found.add(node.module)
        visit(node)

    visit(tree)
    return found


def import_graph() -> dict[str, set[str]]:
    paths = {_module_name(path): path for path in PACKAGE.rglob("*.py")}
    modules = set(paths)
    return {
        name: _imports(ast.parse(path.read_text(encoding="utf-8")), modules) - {name} for name, path in paths.items()
    }


def cycles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[frozenset[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(graph[node]):
            if target not in index:
                connect(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = set()
            while True:
                member = stack.pop()
                component.add(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(frozenset(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return found


def test_the_cycle_finder_finds_cycles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert cycles(graph) == [frozenset({"a", "b", "c"})]
    assert cycles({"a": {"b"}, "b": set()}) == []
    tree = ast.parse(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import x.typed\n"
        "def f():\n    from x import late\n    import x.other\n"
    )
    assert _imports(tree, {"x", "x.late", "x.other", "x.typed"}) == {"x.late", "x.other"}


@pytest.mark.system  # a whole run: `make test`, not the edit loop
def test_no_import_cycles_among_ragexp_modules() -> None:
    graph = import_graph()
    assert "ragexp.cli.app" in graph and graph["ragexp.metrics.judge.client"]  # the graph is the package's
    assert set(cycles(graph)) == set()


def test_the_library_does_not_import_the_cli() -> None:
    graph = import_graph()
    leaks = sorted(
        f"{name} -> {target}"
        for name, targets in graph.items()
        if not name.startswith("ragexp.cli")
        for target in targets
        if target.startswith("ragexp.cli")
    )
    assert leaks == []


def imported_modules(node: ast.AST) -> list[str]:
    """The modules an ``import`` or absolute ``from ... import`` statement names (none for other nodes)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom) and node.level == 0:
        return [node.module or ""]
    return []


def test_only_the_tracking_package_imports_mlflow() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = _module_name(path)
        if name.startswith("ragexp.tracking"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets = imported_modules(node)
            found += [f"{name} imports {target}" for target in targets if target.split(".")[0] == "mlflow"]
    assert found == []
    tracking = [_module_name(p) for p in (PACKAGE / "tracking").rglob("*.py")]
    assert "ragexp.tracking.review_queues" in tracking  # the scan sees the package it exempts


def test_every_command_module_is_thin() -> None:
    from ragexp.cli.commands import COMMANDS

    modules = sorted(path for path in COMMANDS_DIR.glob("*.py") if path.name != "__init__.py")
    assert [path.stem for path in modules] == sorted(COMMANDS)
    for path in modules:
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text)
        assert len(text.splitlines()) <= COMMAND_MAX_LINES, path.name
        top = set()
        for node in tree.body:
            if isinstance(node, ast.Import):
                top.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module:
                top.add(node.module)
        assert top - COMMAND_TOP_IMPORTS - {"json", "os", "sys", "pathlib"} == set(), path.name
        public = [n.name for n in tree.body if isinstance(n, ast.FunctionDef) and not n.name.startswith("_")]
        assert public == [path.stem], path.name  # other modes: private functions in MODES
        assert _library_calls(tree) == ENTRY_POINTS[path.stem], path.name
        # No command module reaches into another (shared rendering is in cli/views.py).
        assert not any(target.startswith("ragexp.cli.commands.") for target in _imports(tree, _command_modules()))


def _library_calls(tree: ast.AST) -> set[str]:
    """``module.name`` of every function the module calls that it imports from outside the CLI's
    own plumbing (options, console, views, render, the demo's screen) and the error classes."""
    plumbing = (
        "ragexp.cli.options",
        "ragexp.cli.console",
        "ragexp.cli.views",
        "ragexp.cli.render",
        "ragexp.cli.demo",
        "ragexp.outputs",
        "ragexp.errors",
    )
    imported = {
        alias.asname or alias.name: node.module
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("ragexp.")
        if not node.module.startswith(plumbing)
        for alias in node.names
    }
    called = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    return {f"{imported[name]}.{name}" for name in called & set(imported)}


def _command_modules() -> set[str]:
    return {f"ragexp.cli.commands.{path.stem}" for path in COMMANDS_DIR.glob("*.py")}


def _imported_by(*args: str) -> tuple[list[str], list[str], str]:
    """``ragexp ARGS`` in a fresh process: the heavy modules and the command modules it imported."""
    import subprocess
    import sys

    probe = (
        f"import sys\nsys.argv = ['ragexp', *{list(args)!r}]\nfrom ragexp.cli.app import main\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        "heavy = {'mlflow', 'hydra', 'numpy', 'ragas', 'pandas', 'omegaconf'}\n"
        "work = {'ragexp.workflows.run', 'ragexp.workflows.diff', 'ragexp.tracking.store', 'ragexp.cli.views'}\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy or m in work), file=sys.stderr)\n"
        "print(sorted(m for m in sys.modules if m.startswith('ragexp.cli.commands.')), file=sys.stderr)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    heavy, commands = done.stderr.strip().splitlines()[-2:]
    return ast.literal_eval(heavy), ast.literal_eval(commands), done.stdout


def test_help_imports_no_command_work() -> None:
    from ragexp.cli.commands import COMMANDS

    heavy, commands, shown = _imported_by("--help")
    assert heavy == []
    assert "Commands" in shown and all(name in shown for name in COMMANDS)
    # Every command is listed with its options read from its own module, and nothing more.
    assert commands == sorted(f"ragexp.cli.commands.{name}" for name in COMMANDS)
    # One command's help imports that command's module alone.
    heavy, commands, shown = _imported_by("gate", "--help")
    assert heavy == [] and commands == ["ragexp.cli.commands.gate"] and "--promote-tag" in shown


def _reachable(graph: dict[str, set[str]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = [start]
    while todo:
        for target in graph[todo.pop()] - seen:
            seen.add(target)
            todo.append(target)
    return seen


def test_loading_a_dataset_imports_nothing_of_the_store() -> None:
    graph = import_graph()
    reached = _reachable(graph, "ragexp.datasets.loader")
    assert "ragexp.limits" in reached  # the loader checks MLflow's limits, from outside the store
    assert sorted(m for m in reached if m.startswith("ragexp.tracking")) == []
    assert sorted(m for m in _reachable(graph, "ragexp.datasets.screening") if m.startswith("ragexp.draft")) == []


# --- the test loop: one marker scheme, every marker selected, no whole run in a fast test -------

BUILTIN_MARKS = {"parametrize", "skipif", "skip", "xfail", "usefixtures", "filterwarnings", "timeout"}


def test_every_marker_is_declared_and_selected_by_a_target() -> None:
    from tests.conftest import MARKERS

    root = PACKAGE.parent
    used = {
        node.attr
        for path in (root / "tests").rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == "mark"
        and isinstance(node.value.value, ast.Name)
        and node.value.value.id == "pytest"
    }
    assert used - BUILTIN_MARKS == set(MARKERS)
    targets = (root / "Makefile").read_text(encoding="utf-8") + (root / "scripts/mlflow-next.sh").read_text(
        encoding="utf-8"
    )
    selected = set(re.findall(r"pytest[^\n]* -m \"?(?:not )?(\w+)", targets))
    assert selected == set(MARKERS)
    assert "\nmarkers =" not in (root / "pyproject.toml").read_text(encoding="utf-8")  # declared in one place


def test_a_fast_test_cannot_start_a_whole_run_in_a_process() -> None:
    import subprocess
    import sys

    from tests.conftest import _starts_a_whole_run

    assert _starts_a_whole_run(["/x/.venv/bin/ragexp", "run", "provider=fake"])
    assert _starts_a_whole_run([sys.executable, "-c", "from ragexp.cli.app import main\nmain()", "demo"])
    assert _starts_a_whole_run([sys.executable, "-m", "ragexp", "run"])
    assert not _starts_a_whole_run(["/x/.venv/bin/ragexp", "--help"])
    assert not _starts_a_whole_run([sys.executable, "-c", "from ragexp.cli.app import main", "validate"])
    assert not _starts_a_whole_run(["git", "run"])
    # This test is not marked system: the guard stops the process before it starts.
    with pytest.raises(RuntimeError, match="starts a whole `ragexp run` in a process of its own"):
        subprocess.run([sys.executable, "-c", "import ragexp.cli.app", "run"], check=False)


# --- the CLI: short functions, modes as commands, typer's private API pinned ---------------------

CLI_FUNCTION_MAX_LINES = 60
TYPER_CHECKED = "0.29.2"
"""The typer whose vendored click (``typer._click``, private) ``LazyCommands`` in
``ragexp/cli/app.py`` was checked against: its methods are declared with those types, and typer
offers no public ones."""


def test_no_cli_function_is_over_60_lines() -> None:
    long = [
        f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name}: {node.end_lineno - node.lineno + 1} lines"
        for path in sorted((PACKAGE / "cli").rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno is not None
        if node.end_lineno - node.lineno + 1 > CLI_FUNCTION_MAX_LINES
    ]
    assert long == []


def test_typers_private_api_is_pinned_and_unused() -> None:
    from importlib.metadata import version

    lock = (PACKAGE.parent / "requirements.lock").read_text(encoding="utf-8")
    locked = re.search(r"^typer==(\S+)", lock, re.MULTILINE)
    assert locked is not None and locked.group(1) == version("typer")
    assert version("typer") == TYPER_CHECKED, (
        f"typer {version('typer')} is not the {TYPER_CHECKED} that ragexp/cli/app.py's LazyCommands was checked "
        "against (it subclasses TyperGroup with typer._click types): check it, then update TYPER_CHECKED"
    )
    users = sorted(
        _module_name(path)
        for path in PACKAGE.rglob("*.py")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "typer"
        if any(part.startswith("_") for part in [*(node.module or "").split("."), *(a.name for a in node.names)])
    )
    assert users == []


def test_a_commands_modes_are_commands_of_their_own(ragexp: Any) -> None:
    from ragexp.cli.commands import draft

    assert set(draft.MODES) == {"review", "accept"}
    shown = ragexp("draft", "review", "--help")
    assert shown.code == 0 and "draft review [OPTIONS] {file}" in shown.stdout
    assert "--queue" in shown.stdout and "--n " not in shown.stdout
    drafting = ragexp("draft", "--help")
    assert "ragexp draft review FILE" in drafting.stdout and "--queue" not in drafting.stdout
    # The loader still suggests a command when one is misspelt.
    wrong = ragexp("gaet")
    assert wrong.code == 1 and "Did you mean 'gate'?" in wrong.stderr


# --- layering: the import graph reads top-down, as docs/development.md says ----------------------


def documented_layers() -> dict[str, int]:
    """docs/development.md's layering table: each package or module under ``ragexp/`` -> its layer
    (1 is the top)."""
    text = (PACKAGE.parent / "docs" / "development.md").read_text(encoding="utf-8")
    section = text[text.index("## Layering") :]
    section = section[: section.index("\n## ", 4)] if "\n## " in section[4:] else section
    layers: dict[str, int] = {}
    for row in re.findall(r"^\| (\d+)\. [^|]+\| (.+) \|$", section, re.MULTILINE):
        for name in re.findall(r"`([^`]+)`", row[1]):
            assert name not in layers, f"{name} is in two layers"
            layers[name] = int(row[0])
    return layers


def _unit(module: str) -> str:
    """``ragexp.compare.diff`` -> ``compare``; the package's own ``__init__`` -> ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def upward_imports(graph: dict[str, set[str]], layers: dict[str, int]) -> list[str]:
    return sorted(
        f"{name} (layer {layers[_unit(name)]}) imports {target} (layer {layers[_unit(target)]})"
        for name, targets in graph.items()
        for target in targets
        if layers[_unit(target)] < layers[_unit(name)]
    )


def test_the_import_graph_reads_top_down_as_the_layering_says() -> None:
    graph, layers = import_graph(), documented_layers()
    units = {_unit(name) for name in graph}
    assert set(layers) == units, "every package and module of ragexp/ is in one layer, and nothing else"
    assert upward_imports(graph, layers) == []
    # The check sees an upward import: a dataset rule importing the store would be one.
    wrong = {**graph, "ragexp.datasets.loader": graph["ragexp.datasets.loader"] | {"ragexp.tracking.store"}}
    assert upward_imports(wrong, layers) == ["ragexp.datasets.loader (layer 5) imports ragexp.tracking.store (layer 4)"]


# --- the tree: as docs/development.md lists it, no cycle between packages, no oversized module ----

MODULE_MAX_LINES = 800
CLI_MODULE_MAX_LINES = 300


def documented_tree() -> set[str]:
    """docs/development.md's table of the tree: every module it lists, as a path under ``ragexp/``."""
    text = (PACKAGE.parent / "docs" / "development.md").read_text(encoding="utf-8")
    section = text[text.index("**The tree.**") : text.index("## Layering")]
    listed = set()
    for folder, modules in re.findall(r"^\| `(ragexp/[^`]*)` \| [^|]+ \| (.+) \|$", section, re.MULTILINE):
        listed |= {f"{folder}{name}.py" for name in re.findall(r"`([^`]+)`", modules)}
    return listed


def modules_on_disk() -> set[str]:
    return {
        path.relative_to(PACKAGE.parent).as_posix()
        for path in PACKAGE.rglob("*.py")
        if "data" not in path.relative_to(PACKAGE).parts
    }


def test_the_tree_in_the_docs_is_the_tree_on_disk() -> None:
    listed, on_disk = documented_tree(), modules_on_disk()
    assert "ragexp/workflows/run.py" in listed and "ragexp/cli/commands/run.py" in listed
    assert sorted(on_disk - listed) == [], "modules on disk that docs/development.md's tree does not list"
    assert sorted(listed - on_disk) == [], "modules docs/development.md's tree lists that are not on disk"


def test_each_command_has_a_library_module_of_its_name() -> None:
    from ragexp.cli.commands import COMMANDS

    assert {path.stem for path in (PACKAGE / "workflows").glob("*.py")} >= set(COMMANDS)
    for name, calls in ENTRY_POINTS.items():
        # The command's own mode calls its own module; other modes may call the modes' modules.
        assert any(call.startswith(f"ragexp.workflows.{name}.") for call in calls), name
        assert all(call.startswith("ragexp.workflows.") for call in calls), name


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The import graph between the package's top-level packages and loose modules (``_unit``)."""
    units: dict[str, set[str]] = {}
    for name, targets in graph.items():
        units.setdefault(_unit(name), set()).update(_unit(target) for target in targets)
    return {unit: targets - {unit} for unit, targets in units.items()}


def test_no_import_cycles_among_ragexp_packages() -> None:
    packages = package_graph(import_graph())
    assert {"workflows", "compare", "providers", "metrics", "errors"} <= set(packages)
    assert cycles(packages) == []
    # A cycle through modules that is no cycle through modules alone is one between packages.
    wrong = {**packages, "compare": packages["compare"] | {"labels"}}
    assert [sorted(found) for found in cycles(wrong)] == [["compare", "labels"]]


def test_no_module_is_oversized() -> None:
    sizes = {
        path.relative_to(PACKAGE.parent).as_posix(): len(path.read_text(encoding="utf-8").splitlines())
        for path in PACKAGE.rglob("*.py")
    }
    over = {
        path
        for path, lines in sizes.items()
        if lines > (CLI_MODULE_MAX_LINES if path.startswith("ragexp/cli/") else MODULE_MAX_LINES)
    }
    assert sorted(over) == []
    assert sizes["ragexp/workflows/run.py"] > 100 and sizes["ragexp/cli/commands/run.py"] > 50  # sizes are read


def test_the_statistics_are_pure() -> None:
    graph = import_graph()
    stats = sorted(name for name in graph if name.startswith("ragexp.stats"))
    assert "ragexp.stats.paired" in stats and "ragexp.stats.sequential" in stats
    assert sorted(f"{name} -> {target}" for name in stats for target in graph[name] if _unit(target) != "stats") == []
