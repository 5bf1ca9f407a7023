"""A speed-up of ``ragexp run`` changes no byte it writes: this tree's ``cases.jsonl`` and
``summary.json`` against a git revision's (``RAGEXP_OUTPUT_AGAINST``, by default the commit before the speed-ups
of the run's hashing and fact matching, extracted with ``git archive`` and run with ``python -P``),
on kb_zh and on 2,000 generated cases. Against ``main`` itself the comparison could not fail, so
the default is a fixed revision; a change that means to alter what a run writes moves it.

The generated cases replay recorded outputs (exact latencies, so every byte can be compared) that
hit each rationale's branches: found, partly found, missed, cited past the ranking, refused, more
items than a rationale lists. kb_zh runs on ``provider=fake``, whose latencies are measured: those
two fields are the only ones left out of that comparison.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
AGAINST = os.environ.get("RAGEXP_OUTPUT_AGAINST", "debeb2d")


def _generated(path: Path, count: int = 2000, seed: int = 7) -> None:
    rng = random.Random(seed)
    with path.open("w", encoding="utf-8") as out:
        for i in range(count):
            shape = i % 10
            row: dict[str, Any] = {"id": f"g{i}", "question": f"问题 {i}：关于 {i % 37} 号条款的政策是什么？"}
            if shape == 9:
                row["unanswerable"] = True
                row["response"] = "没有足够证据" if i % 20 == 9 else f"大概是第 {i} 条。"
                row["retrieved_ids"] = [] if i % 20 == 9 else [f"noise-{i % 40}"]
                row["retrieved_contexts"] = [f"片段 {item}" for item in row["retrieved_ids"]]
                row["citations"] = [] if i % 20 == 9 else [1]
                row["latency_seconds"] = round(rng.uniform(0.01, 2.0), 6)
                out.write(json.dumps(row, ensure_ascii=False) + "\n")
                continue
            relevant = [f"doc-{rng.randrange(50)}" for _ in range(rng.randint(1, 12 if shape == 8 else 3))]
            relevant = list(dict.fromkeys(relevant))
            facts = [f"事实{rng.randrange(30)}", f"条款{rng.randrange(10)}"][: rng.randint(1, 2)]
            others = [f"noise-{rng.randrange(40)}" for _ in range(rng.randint(0, 12))]
            ranked = list(dict.fromkeys(relevant[: rng.randint(0, len(relevant))] + others))
            rng.shuffle(ranked)
            said = facts[: rng.randint(0, len(facts))]
            cited = sorted({rng.randint(1, max(1, len(ranked) + 2)) for _ in range(rng.randint(0, 3))})
            row.update(
                relevant_ids=relevant,
                expected_facts=facts,
                reference=f"参考答案 {i}。",
                response="，".join(said) + "。" + "".join(f"[{n}]" for n in cited),
                retrieved_ids=ranked,
                retrieved_contexts=[f"片段 {item}" for item in ranked],
                citations=cited,
                latency_seconds=round(rng.uniform(0.01, 2.0), 6),
            )
            out.write(json.dumps(row, ensure_ascii=False) + "\n")


def _run(python_path: Path | None, store: Path, args: list[str]) -> dict[str, Any]:
    store.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{store}/mlflow.db"}
    command = [sys.executable, "-m", "ragexp.cli.app", "run", *args, "--json"]
    if python_path is not None:
        env["PYTHONPATH"] = str(python_path)
        command.insert(1, "-P")  # the revision first on the path, not this tree
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=store, check=False)
    assert done.returncode == 0, done.stderr
    run_id = json.loads(done.stdout)["run_id"]
    (folder,) = store.glob(f"**/{run_id}/artifacts")
    rows = [json.loads(line) for line in (folder / "cases.jsonl").read_text(encoding="utf-8").splitlines()]
    summary = json.loads((folder / "summary.json").read_text(encoding="utf-8"))
    return {"rows": rows, "summary": summary, "cases": (folder / "cases.jsonl").read_bytes()}


def _without_measured(found: dict[str, Any]) -> dict[str, Any]:
    for row in found["rows"]:
        row.pop("latency_seconds")
        if row["output"] is not None:
            row["output"].pop("latency_seconds", None)
    found["summary"]["summary"].pop("p95_seconds")
    return {"rows": found["rows"], "summary": found["summary"]}


@pytest.fixture(scope="module")
def revision(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    folder = tmp_path_factory.mktemp("revision")
    archive = subprocess.run(["git", "archive", AGAINST], cwd=ROOT, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive.stdout, check=True)
    return folder


@pytest.mark.system
def test_generated_cases_are_written_byte_for_byte_as_the_revision_writes_them(revision: Path, tmp_path: Path) -> None:
    data = tmp_path / "generated.jsonl"
    _generated(data)
    args = [f"dataset.path={data}", "provider=replay", "k=5"]
    ours = _run(None, tmp_path / "ours", args)
    theirs = _run(revision, tmp_path / "theirs", args)
    assert len(ours["rows"]) == 2000
    kinds = {json.dumps(code[0][0]) for row in ours["rows"] for code in row.get("rationale_codes", {}).values()}
    assert len(kinds) >= 8, kinds  # the rationales' branches are all reached
    assert ours["cases"] == theirs["cases"]
    assert ours["summary"] == theirs["summary"]


@pytest.mark.system
def test_kb_zh_is_written_as_the_revision_writes_it(revision: Path, tmp_path: Path) -> None:
    args = ["dataset=kb_zh", "provider=fake"]
    ours = _without_measured(_run(None, tmp_path / "ours", args))
    theirs = _without_measured(_run(revision, tmp_path / "theirs", args))
    assert len(ours["rows"]) == 35
    assert ours == theirs
