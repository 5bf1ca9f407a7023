"""Every ``--json`` is strict JSON (no NaN, no Infinity), on data that holds non-finite numbers;
``power`` checks every input; every ``—`` a command shows is explained."""

from __future__ import annotations

import importlib
import inspect
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from ragexp import strict_json
from ragexp.cli.commands import COMMANDS
from tests.conftest import write_jsonl
from tests.servers.procs import serve
from tests.test_compare import replay_rows, run_replay
from tests.test_draft import DRAFTER, drafter_args


def strict(text: str) -> Any:
    """``text`` parsed as JSON that any parser accepts: NaN, Infinity and -Infinity refused."""

    def refuse(constant: str) -> Any:
        raise AssertionError(f"not JSON: {constant}")

    return json.loads(text, parse_constant=refuse)


def test_the_json_writer_writes_non_finite_numbers_as_null() -> None:
    payload = {
        "nan": math.nan,
        "inf": [math.inf, -math.inf, 1.5],
        "numpy": {
            "f32": np.float32(0.25),
            "i64": np.int64(7),
            "array": np.array([1.0, np.nan]),
            "nan": np.float64("nan"),
        },
        "nested": ({"deep": [math.nan]},),
        "text": "召回 ✓",
    }
    assert strict(strict_json.dumps(payload)) == {
        "nan": None,
        "inf": [None, None, 1.5],
        "numpy": {"f32": 0.25, "i64": 7, "array": [1.0, None], "nan": None},
        "nested": [{"deep": [None]}],
        "text": "召回 ✓",
    }
    assert "召回" in strict_json.dumps({"text": "召回"})  # UTF-8 kept, not \u-escaped
    with pytest.raises(TypeError):
        strict_json.dumps({"path": Path("x")})  # anything else is a bug, not silently a string


SHADOW = [
    "dataset=traces",
    "dataset.experiment=prod",
    "system=python",
    "provider.system.target=tests.pipelines.traffic:candidate",
    "metrics.names=[p95_seconds]",
]
"""``ragexp shadow`` on the production traffic of tests/pipelines/traffic.py."""


def json_commands() -> set[str]:
    """Every command with a --json option."""
    found = set()
    for name in COMMANDS:
        source = inspect.getsource(importlib.import_module(f"ragexp.cli.commands.{name}"))
        if "JsonFlag" in source or '"--json"' in source:
            found.add(name)
    return found


@pytest.mark.system
def test_every_commands_json_is_strict_on_data_with_non_finite_values(
    ragexp: Any, store_uri: str, tmp_path: Path
) -> None:
    # Three cases: too few pairs for the sign-flip test to bound an interval (its ends are
    # infinite); metrics a store holds as NaN and infinities (logged by anything, read back by ragexp).
    base = run_replay(ragexp, write_jsonl(tmp_path / "a.jsonl", replay_rows([{"rank": 1}] * 3)))["run_id"]
    cand = run_replay(ragexp, write_jsonl(tmp_path / "b.jsonl", replay_rows([{"rank": 2}] * 3)))["run_id"]
    client = MlflowClient(store_uri)
    client.log_metric(base, "recall_at_k", math.nan)
    client.log_metric(cand, "mrr", math.inf)
    client.log_metric(cand, "ndcg_at_k", -math.inf)
    cases = write_jsonl(tmp_path / "c.jsonl", replay_rows([{"rank": 1}] * 3))
    replay = [f"dataset.path={cases}", "dataset.name=crafted", "provider=replay", "k=3"]
    calls = {
        "run": [["run", *replay, "--json"], ["run", *replay[:-1], "-m", "k=2,3", "--json"]],
        "validate": [["validate", *replay, "--json"], ["validate", "--path", str(tmp_path / "none.jsonl"), "--json"]],
        "runs": [["runs", "--json"]],
        "diff": [["diff", base, cand, "--json"]],
        "gate": [["gate", "--baseline", base, "--candidate", cand, "--json"]],
        "power": [["power", "--baseline", base, "--effect", "0.1", "--json"]],
        "calibrate": [["calibrate", cand, "--json"]],
        "label": [["label", cand, "--json"], ["label", "export", cand, "--out", str(tmp_path / "l.jsonl"), "--json"]],
        "shadow": [["shadow", *SHADOW, "--json"]],
        "datasets": [["datasets", "diff", base, cand, "--json"]],
    }
    from tests.pipelines.traffic import write_production

    write_production(store_uri, "prod", 1, ["topic1", "topic2"])
    outputs: dict[str, list[Any]] = {}
    for command, invocations in calls.items():
        for args in invocations:
            result = ragexp(*args)
            assert result.stdout.strip(), (args, result.stderr)
            outputs.setdefault(command, []).append(strict(result.stdout))
    with serve(DRAFTER) as url:
        corpus = write_jsonl(tmp_path / "chunks.jsonl", [{"id": "a", "text": "退款在审核通过后三个工作日内到账。"}])
        args = ["draft", "--corpus", str(corpus), "--out", str(tmp_path / "d.jsonl"), "--n", "1", "--multi", "0"]
        drafted = ragexp(*args, "--unanswerable", "0", "--json", *drafter_args(url))
    outputs["draft"] = [strict(drafted.stdout)]
    swept = ragexp("sweep", outputs["run"][1]["sweep"], "--json")
    assert swept.stdout.strip(), swept.stderr
    outputs["sweep"] = [strict(swept.stdout)]
    assert set(outputs) == json_commands()

    # What the non-finite numbers became: null, with the reason where a figure is missing.
    diff = outputs["diff"][0]
    mrr = next(m for m in diff["metrics"] if m["name"] == "mrr")
    # The run's own logged figure; the compared means are over the pairs, from each case's score.
    assert mrr["candidate_own"] == 1.7976931348623157e308  # MLflow's store holds +inf as the largest float
    assert mrr["candidate"] == 0.5 and mrr["pairing"]["pairs"] == 3
    assert (mrr["ci_low"], mrr["ci_high"]) == (None, None)
    assert mrr["why_missing"]["ci"] == "too few pairs for the paired test to bound the interval at this confidence"
    recall = next(m for m in diff["metrics"] if m["name"] == "recall_at_k")
    assert recall["baseline_own"] is None
    listed = {row["run_id"]: row["metrics"] for row in outputs["runs"][0]["runs"]}
    assert listed[base]["recall_at_k"] is None


@pytest.mark.parametrize(
    ("effect", "said"),
    [
        ("nan", "--effect: expected a finite change, got nan"),
        ("inf", "--effect: expected a finite change, got inf"),
        ("-inf", "--effect: expected a finite change, got -inf"),
        ("0", "--effect: expected a positive change, got 0"),
        ("-0.1", "--effect: expected a positive change, got -0.1"),
        (
            "1.5",
            "--effect: 1.5 is more than any metric's mean can change (per-case values lie in [0, 1] at the widest)",
        ),
    ],
)
def test_power_refuses_effects_no_metric_can_show_in_one_line(ragexp: Any, effect: str, said: str) -> None:
    # Refused before any store is read: the baseline need not even exist.
    for extra in ([], ["--json"]):
        result = ragexp("power", "--baseline", "0123456789abcdef0123456789abcdef", f"--effect={effect}", *extra)
        assert result.code == 1 and result.stdout == ""
        assert result.stderr.splitlines() == [f"ragexp: error: {said}"]


def test_power_says_why_a_figure_is_missing(ragexp: Any, tmp_path: Path) -> None:
    # 20 cases: no case errors (no spread), the relevant id at rank 1 or 2 in turn (MRR .75), and
    # 4 wrong answers (a pass/fail metric whose cases differ in a share of about .34).
    specs = [{"rank": 1 + i % 2, "correct": i >= 4} for i in range(20)]
    base = run_replay(ragexp, write_jsonl(tmp_path / "a.jsonl", replay_rows(specs)))["run_id"]

    def plans(effect: str) -> dict[str, Any]:
        found = ragexp("power", "--baseline", base, "--effect", effect, "--json")
        assert found.code == 0, found.stderr
        return {p["name"]: p for p in strict(found.stdout)["metrics"]}

    half = plans("0.5")
    errors = half["error_rate"]
    assert errors["detectable_effect"] is None and errors["cases_needed"] is None
    assert errors["why_missing"]["detectable_effect"].startswith(
        "every one of the 20 scored cases has the value 0.0000: the baseline shows no spread"
    )
    accuracy = half["answer_accuracy"]
    assert accuracy["cases_needed"] is None
    assert accuracy["why_missing"]["cases_needed"].startswith(
        "a change of 0.5 is more than the share of cases expected to differ"
    )
    assert half["mrr"]["cases_needed"] is not None and half["mrr"]["why_missing"] == {}
    most = plans("0.9")
    assert most["mrr"]["cases_needed"] is None
    assert most["mrr"]["why_missing"] == {
        "cases_needed": "a change of 0.9 is more than this metric can move from the baseline's mean 0.7500 "
        "(its values lie in [0, 1])"
    }
    # In the terminal: each — and 'not reachable' is explained under the table.
    lines = ragexp("power", "--baseline", base, "--effect", "0.5").stdout.splitlines()
    legend = lines[lines.index("why a figure is missing (— or not reachable):") + 1 :]
    for name, plan in half.items():
        for reason in plan["why_missing"].values():
            assert f"  {name}: {reason}" in legend


def dashes_explained(text: str) -> None:
    """Every line of ``text`` showing ``—`` as a figure comes before a line that explains it."""
    lines = text.splitlines()
    for number, line in enumerate(lines):
        if "—" in line and "why a figure is missing" not in line and not line.startswith("— "):
            after = "\n".join(lines[number + 1 :])
            assert "why a figure is missing" in after or "— means" in after or "— in " in after, line


def test_every_dash_a_comparison_shows_is_explained(ragexp: Any, tmp_path: Path) -> None:
    # The candidate measures fewer metrics (compared anyway), three pairs detect nothing, P95 is a
    # run-level figure: each — of diff, gate and runs says why, under its table.
    base = run_replay(ragexp, write_jsonl(tmp_path / "a.jsonl", replay_rows([{"rank": 1}] * 3)))["run_id"]
    cand = run_replay(ragexp, write_jsonl(tmp_path / "b.jsonl", replay_rows([{"rank": 2}] * 3)), "metrics=retrieval")[
        "run_id"
    ]
    diff = ragexp("diff", base, cand, "--allow-incomparable")
    assert diff.code == 0, diff.stderr
    dashes_explained(diff.stdout)
    legend = diff.stdout.split("why a figure is missing (—):\n", 1)[1].split("\n\n", 1)[0].splitlines()
    assert "  citation_precision: the candidate run did not measure it" in legend
    assert (
        "  p95_seconds: a run-level figure, not a mean of per-case values: no paired interval, p-value or "
        "detectable change"
    ) in legend
    assert "  recall_at_k: detectable change: none below 6 paired cases" in legend
    gate = ragexp("gate", "--baseline", base, "--candidate", cand, "--allow-incomparable")
    assert gate.code == 2
    dashes_explained(gate.stdout)
    assert "— in the baseline or candidate column: that run has no value for the metric" in gate.stdout
    assert "none below 6 paired cases (3 here)" in gate.stdout
    runs = ragexp("runs")
    dashes_explained(runs.stdout)
    assert "— means no value: the run logged none for the metric" in runs.stdout
    summary = tmp_path / "summary.md"
    ragexp("diff", base, cand, "--allow-incomparable", "--summary", str(summary), "--language", "en")
    assert "why a figure is missing (—):" in summary.read_text(encoding="utf-8")
