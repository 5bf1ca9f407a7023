"""A newcomer's first hour (issue 51): gold that cannot match is refused before scoring, the hints a
run prints run as printed, and the README's commands start what they need."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ragexp.metrics.evidence import unmatchable_gold
from ragexp.records import Case, CaseResult, SystemOutput
from tests.conftest import write_jsonl

ROOT = Path(__file__).resolve().parent.parent
RAGEXP = Path(sys.executable).parent / "ragexp"


def _case(n: int) -> Case:
    return Case(f"c{n}", f"q{n}?", [f"doc{n}"], [], None, False, n + 1)


def _reply(*ranked: str) -> CaseResult:
    return CaseResult("c", SystemOutput(list(ranked), ["t"] * len(ranked), "a", [], 0.1))


# --- (a) gold that cannot match -----------------------------------------------------------------


def test_window_chunks_on_chunk_id_gold_are_refused_before_anything_runs(ragexp: Any) -> None:
    for command in ("run", "validate"):
        refused = ragexp(command, "provider.system.sample.chunking=window")
        assert refused.code == 1, refused.stderr
        line = refused.stderr.strip()
        assert len(line.splitlines()) == 1
        assert "can never equal a relevant id" in line and "dataset=kb_zh_spans" in line
        assert "ragexp validate --corpus CHUNKS --anchor" in line
    assert "run " not in ragexp("runs").stdout.split("\n", 1)[-1]  # nothing was logged
    # Windows on evidence gold are what the refusal points at, and they run.
    assert ragexp("validate", "dataset=kb_zh_spans", "provider.system.sample.chunking=window").code == 0


def test_rankings_that_name_the_gold_documents_under_other_ids_are_unmatchable() -> None:
    cases = [_case(n) for n in range(20)]
    windows = [_reply(f"doc{n}#1", f"doc{n + 1}#2") for n in range(20)]
    found = unmatchable_gold(cases, windows, k=5)
    assert found is not None and (found.cases, found.hits, found.named) == (20, 0, 20)
    assert found.example == "doc0#1" and "validate --corpus CHUNKS --anchor" in found.message("x.jsonl")
    # One hit in twenty is "almost never": still refused; two is a system that can match.
    assert unmatchable_gold(cases, [_reply("doc0"), *windows[1:]], k=5) is not None
    assert unmatchable_gold(cases, [_reply("doc0"), _reply("doc1"), *windows[2:]], k=5) is None
    # Rankings of other documents are a system that missed, not ids that cannot match.
    assert unmatchable_gold(cases, [_reply("other#1")] * 20, k=5) is None
    # Beyond K nothing counts; unanswerable and errored cases are left out.
    assert unmatchable_gold(cases, [_reply("x", "y", f"doc{n}") for n in range(20)], k=2) is None
    assert unmatchable_gold(cases, [CaseResult("c", None, "boom")] * 20, k=5) is None


def test_a_system_that_returns_chunks_of_the_gold_documents_under_other_ids_is_refused(
    ragexp: Any, tmp_path: Path
) -> None:
    rows = [
        {
            "id": f"c{n}",
            "question": f"q{n}?",
            "relevant_ids": [f"doc{n}"],
            "expected_facts": [f"fact {n}"],
            "response": f"fact {n}",
            "retrieved_ids": [f"doc{n}#1", f"doc{n}#2"],
            "retrieved_contexts": ["a", "b"],
            "citations": [1],
            "latency_seconds": 0.1,
        }
        for n in range(4)
    ]
    path = write_jsonl(tmp_path / "cases.jsonl", rows)
    refused = ragexp("run", "provider=replay", f"dataset.path={path}", "k=3")
    assert refused.code == 1
    assert "hold a gold id in 0 of 4 cases, and in 4 they return chunks of the gold documents" in refused.stderr
    assert "'doc0#1'" in refused.stderr and "--anchor" in refused.stderr


def test_the_sweeps_doc_example_sweeps_chunkings_on_evidence_gold() -> None:
    text = (ROOT / "docs/sweeps.md").read_text(encoding="utf-8")
    line = next(line for line in text.splitlines() if "chunking=doc,sentence,window" in line)
    assert "dataset=kb_zh_spans" in line


# --- (b) hints that run as printed ----------------------------------------------------------------


def _next_commands(stdout: str) -> list[str]:
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("next "))
    return [line.strip() for line in lines[start + 1 :] if line.strip() and not line.strip().startswith("#")]


def test_the_hints_carry_the_runs_overrides_and_store_and_name_this_environments_programs(
    ragexp: Any, tmp_path: Path, store_uri: str
) -> None:
    from ragexp.cli.views import program

    rows = [
        {
            "id": f"c{n}",
            "question": f"q{n}?",
            "relevant_ids": [f"doc{n}"],
            "expected_facts": [f"fact {n}"],
            "response": f"fact {n}",
            "retrieved_ids": [f"doc{n}"],
            "retrieved_contexts": ["a"],
            "citations": [1],
            "latency_seconds": 0.1,
        }
        for n in range(3)
    ]
    path = write_jsonl(tmp_path / "cases.jsonl", rows)
    first = ragexp("run", "provider=replay", f"dataset.path={path}", "k=3", "experiment=my exp")
    assert first.code == 0, first.stderr
    exe = program("ragexp")
    assert Path(exe.split()[0]).is_absolute() or "/" in exe  # runnable without activating anything
    assert Path(exe).resolve() == RAGEXP.resolve()
    # Not the sample system: the change is the user's own, said once; the gate after it runs as printed.
    assert "# a candidate: change your system" in first.stdout
    run_id = first.stdout.split("\nrun ", 1)[1].split()[0]
    commands = _next_commands(first.stdout)
    assert commands[0] == f"{exe} gate --baseline {run_id}"
    assert commands[1].endswith(f"ui --backend-store-uri {store_uri}")
    # A second run of another config: the hints compare the two, each with the store given.
    second = ragexp(
        "run",
        "provider=replay",
        f"dataset.path={path}",
        "k=3",
        "experiment=my exp",
        "gates.confidence=0.9",
        "--tracking-uri",
        store_uri,
    )
    assert second.code == 0, second.stderr
    second_id = second.stdout.split("\nrun ", 1)[1].split()[0]
    commands = _next_commands(second.stdout)
    store = f"--tracking-uri {shlex.quote(store_uri)}"
    assert commands[:3] == [
        f"{exe} diff {run_id} {second_id} {store}",
        f"{exe} gate --baseline {run_id} --candidate {second_id} {store}",
        f"{exe} report {second_id} --baseline {run_id} --out report --language en {store}",
    ]
    for command in commands[:2]:
        words = shlex.split(command)[1:]
        assert ragexp(*words).code in (0, 2), command


def test_the_sample_systems_candidate_keeps_the_overrides_and_changes_the_knob() -> None:
    from ragexp.cli.views import candidate_overrides
    from ragexp.config.compose import compose

    config = compose(["dataset=kb_zh_chat", "k=10", "experiment=my-exp"])
    given = ["dataset=kb_zh_chat", "k=10", "experiment=my-exp", "tracking.uri=sqlite:///x.db"]
    assert candidate_overrides(config, given) == [
        "dataset=kb_zh_chat",
        "k=10",
        "experiment=my-exp",
        "provider.system.sample.chunking=sentence",
    ]
    knob = "provider.system.sample.chunking=sentence"
    sentence = compose([knob])
    assert candidate_overrides(sentence, [knob]) == ["provider.system.sample.chunking=doc"]


def test_a_program_outside_the_working_folder_is_named_by_its_path(tmp_path: Path) -> None:
    from ragexp.cli.views import program

    here = os.getcwd()
    try:
        os.chdir(tmp_path)
        shown = program("ragexp")
    finally:
        os.chdir(here)
    assert shown == str(RAGEXP.absolute()) or shown == "ragexp"
    assert program("no-such-program-here") == "no-such-program-here"


def _run(command: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.system  # whole runs in processes of their own, as a newcomer types them
def test_a_newcomers_walk_through_pasted_from_the_hints_runs(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "MLFLOW_TRACKING_URI"}
    env["PATH"] = "/usr/bin:/bin"  # nothing activated: the hints must name the programs themselves
    exe = shlex.quote(str(RAGEXP))
    seen: list[tuple[str, int]] = []

    def paste(command: str) -> subprocess.CompletedProcess[str]:
        done = _run(command, tmp_path, env)
        seen.append((command, done.returncode))
        assert done.returncode != 127, (command, done.stderr)
        return done

    # The README's first commands: `make demo` and `make run` set up, then run these.
    make = ["make", "--no-print-directory", "-n", "demo", "run"]
    made = subprocess.run(make, cwd=ROOT, capture_output=True, text=True, check=True)
    assert [line for line in made.stdout.splitlines() if "bin/ragexp" in line][-2:] == [
        ".venv/bin/ragexp demo",
        ".venv/bin/ragexp run",
    ]
    assert paste(f"{exe} demo").returncode == 0  # its store is its own (./ragexp-demo)
    baseline = paste(f"{exe} run")  # in a fresh folder
    assert baseline.returncode == 0, baseline.stderr
    first = _next_commands(baseline.stdout)
    candidate = paste(first[0])
    assert "provider.system.sample.chunking=sentence" in first[0] and candidate.returncode == 0, candidate.stderr
    for command in _next_commands(candidate.stdout):
        if " ui --backend-store-uri " in command:
            assert paste(command.split(" ui ")[0] + " ui --help").returncode == 0
            continue
        done = paste(command)
        assert done.returncode in (0, 2), (command, done.stderr)  # 2: the release gate failed, as it says
    assert (tmp_path / "report").is_dir()
    assert paste(first[1]).returncode in (0, 2)  # the baseline's gate, once a candidate exists
    # A conversation run in an experiment of its own: its candidate and the comparison run as printed.
    chat = paste(f"{exe} run dataset=kb_zh_chat k=10 experiment=my-exp")
    assert chat.returncode == 0, chat.stderr
    follow = paste(_next_commands(chat.stdout)[0])
    assert follow.returncode == 0, follow.stderr
    for command in _next_commands(follow.stdout)[:2]:
        assert paste(command).returncode in (0, 2), command
    # Windows on chunk-id gold: refused with the fix, not a silent 0.
    window = paste(f"{exe} run provider.system.sample.chunking=window")
    assert window.returncode == 1 and "--anchor" in window.stderr
    assert all(code in (0, 1, 2) for _, code in seen), seen


# --- (c) the README's test command starts what the tests need ------------------------------------


def _suite(tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """scripts/test-suite.sh with a stand-in server script and Python that record what they were asked."""
    log = tmp_path / "log"
    server = tmp_path / "server.sh"
    server.write_text(f'#!/bin/sh\necho "server $1" >> {log}\n[ "$1" = start ] && echo http://127.0.0.1:5999\n')
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\necho "python $* server=$RAGEXP_TEST_MLFLOW_SERVER" >> {log}\n')
    server.chmod(0o755)
    python.chmod(0o755)
    base = {k: v for k, v in os.environ.items() if k != "RAGEXP_TEST_MLFLOW_SERVER"}
    base |= {"RAGEXP_TEAM_SERVER": str(server), "RAGEXP_TEST_PYTHON": str(python), "RAGEXP_MLFLOW_PORT": "1"}
    done = subprocess.run(
        [str(ROOT / "scripts/test-suite.sh"), "-k", "x"], env=base | env, capture_output=True, text=True, timeout=60
    )
    return done, log.read_text().splitlines() if log.exists() else []


def test_make_test_starts_the_tracking_server_and_stops_it(tmp_path: Path) -> None:
    done, log = _suite(tmp_path)
    assert done.returncode == 0, done.stderr
    assert log == ["server start", "python -m pytest -k x server=http://127.0.0.1:5999", "server stop"]
    assert "starting the shared tracking server (PostgreSQL backend)" in done.stderr


def test_a_server_ci_started_is_not_started_twice(tmp_path: Path) -> None:
    done, log = _suite(tmp_path, RAGEXP_TEST_MLFLOW_SERVER="http://127.0.0.1:5055")
    assert done.returncode == 0, done.stderr
    assert log == ["python -m pytest -k x server=http://127.0.0.1:5055"]
    ci = (ROOT / ".ci/run").read_text(encoding="utf-8")
    assert ci.index("export RAGEXP_TEST_MLFLOW_SERVER") < ci.index("make test")


def test_make_test_runs_the_suite_script_and_test_fast_needs_no_server() -> None:
    def recipe(target: str) -> str:
        # --no-print-directory: under a make of its own (CI's `make test`), make names the folder it enters.
        done = subprocess.run(["make", "--no-print-directory", "-n", target], cwd=ROOT, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert recipe("test").strip().splitlines()[-1] == "scripts/test-suite.sh"
    fast = recipe("test-fast")
    assert "team-server" not in fast and "test-suite" not in fast and '-m "not system"' in fast


# --- (d) the first command says what it does ----------------------------------------------------


def test_the_first_set_up_says_each_step(tmp_path: Path) -> None:
    done = subprocess.run(
        ["make", "--no-print-directory", "-n", "setup", f"VENV={tmp_path}/venv"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    steps = [line for line in done.stdout.splitlines() if line.startswith('echo "set-up')]
    assert [line.split(":")[0] for line in steps] == [
        'echo "set-up 1/4',
        'echo "set-up 2/4',
        'echo "set-up 3/4',
        'echo "set-up 4/4',
        'echo "set-up done',
    ]
    sync = next(line for line in done.stdout.splitlines() if "uv pip sync" in line)
    assert "--quiet" not in sync  # uv's own progress shows


def test_the_readme_leads_with_the_demo_and_gives_two_commands() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    body = text.split("\n## ", 1)[0]
    assert "make demo" in body  # the first thing a newcomer reads
    block = text.split("## Set up, run, test", 1)[1].split("```bash", 1)[1].split("```", 1)[0]
    commands = [line.split("#")[0].strip() for line in block.strip().splitlines()]
    assert commands == ["make run", "make test"]


# --- (e) the report's verdict first ---------------------------------------------------------------


def test_the_report_opens_with_the_gates_verdict_and_its_failing_rules(ragexp: Any, tmp_path: Path) -> None:
    base = ragexp("run", "dataset=scifacts_zh", "provider=fake", "--json").json()["run_id"]
    cand = ragexp("run", "dataset=scifacts_zh", "provider=replay", "--json").json()["run_id"]
    gate = ragexp("gate", "--baseline", base, "--candidate", cand, "--json")
    assert gate.code == 2
    failed = gate.json()["failures"]
    done = ragexp("report", cand, "--baseline", base, "--language", "en", "--out", str(tmp_path / "r"))
    assert done.code == 0, done.stderr
    md = (tmp_path / "r/report.md").read_text(encoding="utf-8")
    headings = [line for line in md.splitlines() if line.startswith("## ")]
    assert headings[:2] == ["## Verdict", "## What changed"]
    verdict = md.split("## Verdict", 1)[1].split("\n## ", 1)[0]
    checked = len(gate.json()["rules"])
    assert f"release: FAILED ({len(failed)} of {checked} rules did not pass)" in verdict
    rows = [line for line in verdict.splitlines() if line.startswith("| `")]
    assert [row.split("|")[1].strip().strip("`") for row in rows] == [rule["metric"] for rule in failed]
    assert "No gate ran on this pair" not in verdict  # the gate above is the one that ran


# --- (f) the cases it missed: worst first, and where the rest are ---------------------------------


def test_the_cases_it_missed_are_listed_worst_first_and_the_rest_has_a_path(ragexp: Any, store_uri: str) -> None:
    import json

    done = ragexp("run", "dataset=scifacts_zh", "provider=replay", "k=3")
    assert done.code == 0, done.stderr
    lines = done.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("cases it missed: "))
    assert lines[start].endswith(", worst first")
    listed = [line.split(":")[0].strip() for line in lines[start + 1 :] if line.startswith("  sf-")]
    more = next(line for line in lines[start:] if line.startswith("  ... and "))
    path = Path(more.split("every case's scores: ", 1)[1])
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    quality = ["recall_at_k", "mrr", "ndcg_at_k", "citation_precision", "answer_accuracy"]

    answerable_only = {"recall_at_k", "mrr", "ndcg_at_k"}  # averaged over the answerable cases

    def missed(row: dict[str, Any]) -> float:
        names = [n for n in quality if not (row["unanswerable"] and n in answerable_only)]
        return sum(1.0 - row["metrics"][name] for name in names if row["metrics"].get(name) is not None)

    shortfall = {row["id"]: missed(row) for row in rows}
    worst = sorted((case for case, gap in shortfall.items() if gap > 1e-9), key=lambda c: -shortfall[c])
    assert len(listed) == 5 and int(more.split()[2]) == len(worst) - 5
    assert [shortfall[case] for case in listed] == [shortfall[case] for case in worst[:5]]
    assert shortfall[listed[0]] == max(shortfall.values())


# --- (h) latency below the noise floor --------------------------------------------------------------


def test_a_latency_below_the_noise_floor_is_said_so_and_fails_no_gate(ragexp: Any) -> None:
    base = ragexp("run", "dataset=scifacts_zh", "provider=fake", "--json").json()
    cand = ragexp("run", "dataset=scifacts_zh", "provider=fake", "gates.confidence=0.9", "--json").json()
    assert max(base["summary"]["p95_seconds"], cand["summary"]["p95_seconds"]) < 0.001  # in-process: microseconds
    pair = ("--baseline", base["run_id"], "--candidate", cand["run_id"])
    gate = ragexp("gate", *pair, "--json")
    assert gate.code == 0, gate.stdout
    rule = next(r for r in gate.json()["rules"] if r["metric"] == "p95_seconds")
    assert rule["outcome"] == "passed"
    assert "both below the latency noise floor 0.001 s (gates.latency_floor_seconds): timer noise" in rule["message"]
    diff = ragexp("diff", base["run_id"], cand["run_id"], "--json").json()
    p95 = next(m for m in diff["metrics"] if m["name"] == "p95_seconds")
    assert p95["verdict"] == "noise" and p95["noise_floor"] == 0.001
    shown = ragexp("diff", base["run_id"], cand["run_id"])
    assert next(line for line in shown.stdout.splitlines() if line.startswith("p95_seconds")).count("below noise floor")
    # A floor of 0 judges the figure as measured again: the relative rule reads the numbers.
    measured = ragexp("gate", *pair, "gates.latency_floor_seconds=0", "--json")
    rule = next(r for r in measured.json()["rules"] if r["metric"] == "p95_seconds")
    assert "noise floor" not in rule["message"]


def test_a_sweep_leaves_latency_below_the_noise_floor_out_of_its_front(ragexp: Any) -> None:
    swept = ragexp("run", "-m", "dataset=scifacts_zh", "provider=fake", "k=3,5", "--json")
    assert swept.code == 0, swept.stderr
    analysis = ragexp("sweep", swept.json()["sweep"], "--json")
    assert analysis.code == 0, analysis.stderr
    found = analysis.json()
    assert "p95_seconds" not in found["objectives"]
    assert "below the latency noise floor 0.001 s" in found["left_out"]["p95_seconds"]
    assert "faster" not in found["recommendation"]["text"]


# --- (j) the language, a user setting read at every command ---------------------------------------


def test_the_language_is_a_user_setting_every_command_reads(
    ragexp: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    zh_base = ragexp("run", "dataset=scifacts_zh", "provider=fake", "--json").json()["run_id"]
    zh_cand = ragexp("run", "dataset=scifacts_zh", "provider=replay", "--json").json()["run_id"]
    # diff's output is English: the reasons of runs made in Chinese are shown in English.
    shown = ragexp("diff", zh_base, zh_cand).stdout
    reasons = [line for line in shown.splitlines() if line.startswith("      recall_at_k: ")]
    assert any("relevant ids in the top" in line for line in reasons)
    assert not re.search(r"[\u4e00-\u9fff]", "".join(reasons))
    monkeypatch.setenv("RAGEXP_LANGUAGE", "en")
    base = ragexp("run", "dataset=scifacts_zh", "provider=fake", "--json").json()["run_id"]
    cand = ragexp("run", "dataset=scifacts_zh", "provider=replay", "--json").json()["run_id"]
    diff = ragexp("diff", base, cand).stdout
    assert "recall_at_k: 0 of 1 relevant ids in the top 5" in diff  # English reasons, shown
    assert ragexp("report", cand, "--baseline", base, "--out", str(tmp_path / "r")).code == 0
    md = (tmp_path / "r/report.md").read_text(encoding="utf-8")
    assert md.startswith("# RAG evaluation report") and "relevant ids in the top" in md
    # --language still wins over the setting; a setting no phrase is written in is refused, named.
    assert ragexp("report", cand, "--out", str(tmp_path / "z"), "--language", "zh").code == 0
    assert (tmp_path / "z/report.md").read_text(encoding="utf-8").startswith("# RAG 评测报告")
    monkeypatch.setenv("RAGEXP_LANGUAGE", "fr")
    refused = ragexp("report", cand, "--out", str(tmp_path / "f"))
    assert refused.code == 1 and "$RAGEXP_LANGUAGE: expected zh or en, got 'fr'" in refused.stderr


# --- (g) conversations by turn position and by conversation ---------------------------------------


def test_conversations_are_shown_by_turn_position_and_by_conversation(ragexp: Any, tmp_path: Path) -> None:
    import json

    done = ragexp("run", "dataset=kb_zh_chat", "k=10")
    assert done.code == 0, done.stderr
    lines = done.stdout.splitlines()
    start = lines.index("by turn position:")
    assert lines[start + 1].split()[:4] == ["turn", "turns", "correct", "errored"]
    run_id = done.stdout.split("\nrun ", 1)[1].split()[0]
    payload = ragexp("run", "dataset=kb_zh_chat", "k=10", "--json").json()["conversations"]
    by_turn = payload["by_turn"]
    assert [p["turn"] for p in by_turn] == list(range(1, len(by_turn) + 1))
    assert sum(p["cases"] for p in by_turn) == payload["turns"] == 43
    assert len(payload["by_conversation"]) == payload["count"] == 16
    wrong = [row for row in payload["by_conversation"] if row["all_correct"] is False]
    said = next(line for line in lines if line.startswith("by conversation, not every turn correct: "))
    assert all(f"{row['conversation']} (first wrong turn {row['first_failed_turn']}" in said for row in wrong)
    for p in by_turn:
        row = lines[start + 3 + p["turn"] - 1].split()
        assert row[:4] == [str(p["turn"]), str(p["cases"]), str(p["correct"]), str(p["errored"])]
    # diff and the report: each metric's means by turn over the turns both runs scored.
    cand = ragexp("run", "dataset=kb_zh_chat", "k=10", "provider.system.sample.chunking=sentence", "--json")
    base_id, cand_id = run_id, cand.json()["run_id"]
    diff = ragexp("diff", base_id, cand_id, "--json").json()
    turns = diff["by_turn"]
    assert [row["turn"] for row in turns] == [p["turn"] for p in by_turn]
    assert "p95_seconds" not in turns[0]["metrics"]
    first = turns[0]["metrics"]["answer_accuracy"]
    assert first["pairs"] == by_turn[0]["cases"] and first["baseline"] == by_turn[0]["means"]["answer_accuracy"]
    assert "by turn position (means over the turns both runs scored" in ragexp("diff", base_id, cand_id).stdout
    out = tmp_path / "r"
    assert ragexp("report", cand_id, "--baseline", base_id, "--language", "en", "--out", str(out)).code == 0
    assert "### By turn position (turns both runs scored)" in (out / "report.md").read_text(encoding="utf-8")
    assert json.dumps(first)  # plain numbers


# --- (k) the smaller ones ---------------------------------------------------------------------------


def test_h_is_help_for_every_command(ragexp: Any) -> None:
    for args in (["-h"], ["diff", "-h"], ["run", "-h"]):
        shown = ragexp(*args)
        assert shown.code == 0 and "Usage: " in shown.stdout and "Options" in shown.stdout, args


def test_help_shows_no_value_for_flags_and_cuts_nothing(ragexp: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from ragexp.cli.commands import COMMANDS

    monkeypatch.setenv("COLUMNS", "72")  # a narrow terminal: where rich's panels cut words
    top = ragexp("-h")
    flat = " ".join(top.stdout.split())
    for name in COMMANDS:
        listed = ragexp(name, "-h")
        assert listed.code == 0, name
        shown = listed.stdout
        assert "<bool>" not in shown and "…" not in shown and "╭" not in shown, name
        # The first paragraph of the command's help, whole in the list (not cut to one line with "...").
        first = " ".join(shown.split("\n\n")[1].split())
        assert first in flat, name
    run = " ".join(ragexp("run", "-h").stdout.split())
    assert "--json Print exactly one JSON object" in run  # a flag: no value type after it
    assert "else sqlite:///mlruns/mlflow.db)." in run  # the default, whole
    assert "--top <int range> How many of the most regressed cases to show. [default: 10; x>=0]" in " ".join(
        ragexp("diff", "-h").stdout.split()
    )


def test_an_override_into_a_list_is_told_to_set_the_whole_list(ragexp: Any) -> None:
    for override in ("metrics.custom[0].target=my_rules:fn", "metrics.custom.0.target=my_rules:fn"):
        refused = ragexp("validate", override)
        assert refused.code == 1, override
        assert f"config: {override}: an override cannot reach into a list" in refused.stderr
        assert "'metrics.custom=[...]' in quotes" in refused.stderr and "quote a value" not in refused.stderr
    # What it points to runs: the whole list, in quotes.
    whole = ragexp("run", "provider=fake", "metrics.custom=[{name: t, kind: python, target: 'os.path:isabs'}]")
    assert "metrics.custom[0].target: cannot call 'os.path:isabs(s)' as (case, output)" in whole.stderr
    spaced = ragexp("validate", "experiment=a)b")  # a value's special characters keep their own hint
    assert spaced.code == 1 and "quote a value with spaces or other special characters" in spaced.stderr


def test_a_run_without_a_judge_is_not_said_to_have_one(ragexp: Any) -> None:
    from ragexp.cli.render import trust_lines
    from ragexp.metrics.calibration import Calibration, PpiEstimate, Trust

    run = ragexp("run")  # the sample system: answer_accuracy is a fact match, no judge anywhere
    assert run.code == 0, run.stderr
    assert "prediction-powered means (automatic scores corrected by human scores):" in run.stdout
    assert "automatic mean" in run.stdout.split("prediction-powered means")[1]
    assert "judge" not in run.stdout.split("automatic score vs human scores")[1].split("label audit")[0]
    # A judge's metrics are called the judge's; a mix is not.
    same = Calibration(12, 0.1, 0.0, None, 1.0, None, None, None)
    estimate = PpiEstimate(0.8, 0.7, 0.9, 12, 35, 0.75)
    judged = "\n".join(trust_lines(Trust({"faithfulness": same}, {"faithfulness": estimate}), 0.5, None))
    assert "(judge scores corrected by human scores)" in judged and "judge mean" in judged
    assert "the judge scores or the people's are all the same" in judged
    mixed = Trust({}, {"faithfulness": estimate, "answer_accuracy": estimate})
    assert "(automatic scores corrected by human scores)" in "\n".join(trust_lines(mixed, 0.5, None))


def test_the_attribution_refusal_gives_its_reason_once(ragexp: Any) -> None:
    ids = [ragexp("run", "provider=fake", "--json").json()["run_id"] for _ in range(2)]
    refused = ragexp("diff", *ids, "--attribute")
    assert refused.code == 1
    line = refused.stderr.strip()
    assert line.startswith(f"ragexp: error: --attribute: the baseline's system (run {ids[0]}, provider fake)")
    assert line.count("answer from given contexts") == 1 and line.count("fake") == 2
    assert "no answer stage of its own to call" in line and "provider.system.generate" in line


def test_a_sweeps_tables_show_what_varies_as_typed_without_hydras_escapes(ragexp: Any) -> None:
    from ragexp.compare.sweeps import override_words, shown_override

    swept = ragexp("run", "-m", "provider=fake", "k=3", r"run_name=x\,y,z")
    assert swept.code == 0, swept.stderr
    lines = swept.stdout.splitlines()
    assert "every point: provider=fake k=3" in lines
    rows = [line.split()[:2] for line in lines if line[:2] in ("0 ", "1 ")]
    assert rows == [["0", "run_name=x,y"], ["1", "run_name=z"]]
    parent = swept.stdout.split("\nsweep ", 1)[1].split(":")[0]
    analysed = ragexp("sweep", parent)
    assert analysed.code == 0, analysed.stderr
    assert "front over recall_at_k: point 0 [run_name=x,y], point 1 [run_name=z]" in analysed.stdout
    assert "provider=fake" not in analysed.stdout and "\\," not in analysed.stdout
    # The JSON keeps the override as a command takes it.
    assert ragexp("sweep", parent, "--json").json()["points"][0]["overrides"] == r"run_name=x\,y"
    # A quoted or escaped space stays inside its override; a quoted value is shown as quoted.
    words = override_words(r"a='p q' b=r\ s c=t")
    assert words == ["a='p q'", r"b=r\ s", "c=t"]
    assert [shown_override(word) for word in words] == ["a='p q'", "b=r s", "c=t"]


def test_one_dataset_has_one_dataset_hash_wherever_it_is_shown(ragexp: Any, store_uri: str) -> None:
    from mlflow import MlflowClient

    checked = ragexp("validate", "--json").json()  # kb_zh: its human scores enter the hash
    full = checked["dataset_hash"]
    assert f"dataset hash {full[:12]}" in ragexp("validate").stdout
    run = ragexp("run", "provider=fake")
    run_id = run.stdout.split("\nrun ", 1)[1].split()[0]
    assert f"dataset kb_zh (35 cases, {full[:12]})" in run.stdout
    recorded = MlflowClient(store_uri).get_run(run_id)
    assert recorded.data.tags["ragexp.dataset_hash"] == full
    assert recorded.inputs.dataset_inputs[0].dataset.digest == full[:12]  # the UI's Datasets column
    other = ragexp("run", "dataset=scifacts_zh", "provider=fake", "--json").json()
    refused = ragexp("diff", run_id, other["run_id"])
    assert refused.code == 3
    # Compared without human scores, but named by the hashes the runs printed.
    said = f"dataset content hash differs ({full[:12]} vs {other['dataset_hash'][:12]}, human scores aside)"
    assert said in refused.stderr
    assert recorded.data.tags["ragexp.cases_hash"][:12] not in refused.stderr


def test_small_wording_fixes(capsys: pytest.CaptureFixture[str]) -> None:
    from types import SimpleNamespace

    from ragexp.cli.views_sweep import _with_run
    from ragexp.cli.views_validate import show_anchored

    show_anchored(SimpleNamespace(out="x.jsonl", anchored=3, cases=3, spans_from_facts=2, spans_whole_chunk=1))
    assert capsys.readouterr().out.rstrip().endswith("2 spans are the sentences holding their facts, 1 whole chunk")
    # A baseline outside the sweep is labelled by its run: named once.
    assert _with_run("run abc", "abc") == "run abc"
    assert _with_run("point 0 [k=3]", "abc") == "point 0 [k=3] (run abc)"


def test_report_out_folder_is_ignored_and_the_run_name_comment_is_true() -> None:
    from ragexp.config.compose import compose
    from ragexp.workflows.run_plan import plan_run

    ignored = (ROOT / ".gitignore").read_text(encoding="utf-8").splitlines()
    assert "/report/" in ignored  # README's `report --out report`
    comment = next(line for line in (ROOT / "conf/config.yaml").read_text().splitlines() if line.startswith("run_name"))
    plan = plan_run(compose(["provider=fake"]))
    assert plan.run_name().startswith(plan.config_hash[:12] + "-fake-kb_zh-k5")
    assert "<config hash[:12]>-<provider.name>-<dataset.name>-k<k>" in comment


def test_diff_of_two_unknown_runs_names_both(ragexp: Any) -> None:
    ragexp("run", "dataset=scifacts_zh", "provider=fake", "--json")  # a store with a run in it
    refused = ragexp("diff", "nosuchbase", "nosuchcand")
    assert refused.code == 1
    assert "unknown runs 'nosuchbase' (baseline) and 'nosuchcand' (candidate)" in refused.stderr


def test_validate_lists_the_label_fields_the_file_has(ragexp: Any) -> None:
    ids = ragexp("validate", "--json").json()["label_fields"]
    assert "user_input" not in ids and {"question", "relevant_ids", "unanswerable"} <= set(ids)
    spans = ragexp("validate", "dataset=kb_zh_spans", "--json").json()["label_fields"]
    assert "relevant" in spans and "relevant_ids" not in spans and "user_input" not in spans
