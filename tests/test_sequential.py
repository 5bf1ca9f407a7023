"""``ragexp run --baseline RUN --until-decided``: the anytime-valid confidence sequence checked
against simulation (fixed seeds, small sizes; the 500-pair version is
``tests/benchmarks/bench_sequential.py``), and whole sequential runs against replay baselines and
a real HTTP service: they stop early on a large drop, fail or pass their gate with the bounds the
run recorded, count errors only among the cases evaluated, and resume where they stopped."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from ragexp.stats.sequential import bets, confidence_sequence, difference_sequence, drop_decision, log_capital
from tests.conftest import write_jsonl
from tests.pipelines import chat
from tests.servers.procs import FAULTY, serve, stats
from tests.test_compare import replay_rows
from tests.test_conversations import CHATS, rows_of
from tests.test_http import labelled
from tests.test_reliability import FAST

ALPHA = 0.05


def first_decision(diffs: np.ndarray, margin: float, batch: int) -> tuple[str, int]:
    """What a sequential max_drop rule decides looking after every ``batch`` pairs, and when."""
    looks = np.arange(batch, diffs.size + 1, batch)
    sequence = difference_sequence(diffs, 1.0, ALPHA, looks)
    for j, look in enumerate(looks):
        decided = drop_decision(float(sequence.low[j]), float(sequence.high[j]), margin, "higher")
        if decided != "open":
            return decided, int(look)
    return "open", int(diffs.size)


def graded(rng: np.random.Generator, n: int, mean: float, sd: float = 0.15) -> np.ndarray:
    """Paired differences of a graded [0, 1] metric (a score on a scale): mean ``mean``."""
    return np.clip(mean + sd * rng.standard_normal(n), -1.0, 1.0)


def pass_fail(rng: np.random.Generator, n: int, mean: float, discordant: float = 0.3) -> np.ndarray:
    """Paired differences of a pass/fail metric: -1, 0 or 1, a share ``discordant`` nonzero."""
    u = rng.random(n)
    return np.where(u < discordant / 2 + mean / 2, 1.0, np.where(u < discordant, -1.0, 0.0))


@pytest.mark.system  # a whole run: `make test`, not the edit loop
@pytest.mark.parametrize("kind", ["graded", "pass_fail"])
def test_no_drop_fails_at_most_alpha_plus_two_points_however_often_it_is_looked_at(kind: str) -> None:
    # A rule that allows no drop (max_drop 0), a candidate with no drop, looked at after every
    # 10 pairs of 300: a fixed-n interval looked at 30 times fails far more often than α.
    rng = np.random.default_rng(37)
    draw = graded if kind == "graded" else pass_fail
    trials = 200
    fails = sum(first_decision(draw(rng, 300, 0.0), 0.0, 10)[0] == "failed" for _ in range(trials))
    assert fails / trials <= ALPHA + 0.02


@pytest.mark.system  # a whole run: `make test`, not the edit loop
def test_the_sequence_holds_the_true_mean_at_every_look_at_once() -> None:
    # The anytime guarantee itself, at its hardest: a drop exactly at the margin, so any excursion
    # of the sequence beyond the true mean on the failing side is a false failure.
    rng = np.random.default_rng(38)
    trials, n, mean = 200, 300, -0.05
    missed = 0
    for _ in range(trials):
        diffs = pass_fail(rng, n, mean)
        sequence = difference_sequence(diffs, 1.0, ALPHA, np.arange(5, n + 1, 5))
        missed += bool(((sequence.low > mean) | (sequence.high < mean)).any())
    assert missed / trials <= ALPHA + 0.02


def test_a_drop_twice_the_margin_is_found_with_at_most_forty_percent_of_the_cases() -> None:
    # The issue's 500 pairs (a differences' sd of 0.15, a margin of 0.05), over fewer trials than
    # the benchmark's.
    rng = np.random.default_rng(39)
    n, margin = 500, 0.05
    outcomes = [first_decision(graded(rng, n, -2 * margin), margin, n // 10) for _ in range(60)]
    assert all(decision == "failed" for decision, _ in outcomes)
    assert float(np.median([at for _, at in outcomes])) <= 0.4 * n


def test_the_sequence_narrows_around_the_mean_and_maps_differences_back() -> None:
    rng = np.random.default_rng(40)
    values = rng.random(400) * 0.5 + 0.25  # mean 0.5
    sequence = confidence_sequence(values, ALPHA, np.array([10, 100, 400]))
    widths = sequence.high - sequence.low
    assert widths[0] > widths[1] > widths[2] > 0
    assert sequence.low[2] < 0.5 < sequence.high[2] and widths[2] < 0.1
    diffs = difference_sequence(np.full(50, -0.4), 1.0, ALPHA)
    assert diffs.low[-1] <= -0.4 <= diffs.high[-1] < -0.2  # all pairs -0.4: well below 0, and holding it


@pytest.mark.parametrize("seed", [41, 42, 43])
def test_the_ends_found_by_bisection_hold_every_mean_a_fine_grid_keeps(seed: int) -> None:
    # The bisection assumes the kept means form one interval around the running mean; a grid of
    # 2,001 means checked one by one finds none kept outside the ends it returns.
    rng = np.random.default_rng(seed)
    values = np.where(rng.random(200) < 0.3, rng.random(200), rng.integers(0, 2, 200).astype(float))
    looks = np.array([5, 20, 60, 200])
    sequence = confidence_sequence(values, ALPHA, looks)
    grid = np.linspace(0.0, 1.0, 2001)
    lam = bets(values, ALPHA)
    low, high = 0.0, 1.0
    for j, look in enumerate(looks):
        kept = grid[log_capital(values[:look], lam[:look], grid) < np.log(1 / ALPHA)]
        low, high = max(low, float(kept.min())), min(high, float(kept.max()))
        assert sequence.low[j] <= low + 1e-9 and sequence.high[j] >= high - 1e-9
        assert sequence.low[j] >= low - 0.0005 and sequence.high[j] <= high + 0.0005  # and no wider


# --- whole runs ------------------------------------------------------------------------------

GATE = ["~gates.rules", "+gates.rules={recall_at_k:{max_drop:0.05},mrr:{max_drop:0.05},citation_precision:{min:0.5}}"]
REPLAY = ["dataset.name=crafted", "provider=replay", "k=3", *GATE]


def replay(ragexp: Any, path: Path, *extra: str) -> Any:
    return ragexp("run", f"dataset.path={path}", *REPLAY, *extra)


def tags_of(store_uri: str, run_id: str) -> dict[str, str]:
    return dict(MlflowClient(store_uri).get_run(run_id).data.tags)


def test_a_large_drop_stops_early_and_fails_its_gate_on_the_same_bounds(
    ragexp: Any, store_uri: str, tmp_path: Path
) -> None:
    n = 200
    base_path = write_jsonl(tmp_path / "base.jsonl", replay_rows([{"rank": 1}] * n))
    # Half the cases lose their relevant chunk: recall 1.0 -> 0.5, far beyond the allowed 0.05.
    dropped = write_jsonl(tmp_path / "drop.jsonl", replay_rows([{"rank": None if i % 2 else 1} for i in range(n)]))
    base = replay(ragexp, base_path, "--json")
    assert base.code == 0, base.stderr
    baseline = base.json()["run_id"]

    run = replay(ragexp, dropped, "--baseline", baseline, "--until-decided", "--json")
    assert run.code == 0, run.stderr
    payload = run.json()
    sequential = payload["sequential"]
    assert sequential["total"] == n and sequential["decision"] == "failed"
    assert sequential["evaluated"] == 20 == payload["case_count"]  # stopped after the first batch of 10%
    recall = next(r for r in sequential["rules"] if r["metric"] == "recall_at_k")
    assert recall["decision"] == "failed" and recall["high"] < -0.05 and recall["pairs"] == 20
    tags = tags_of(store_uri, payload["run_id"])
    assert tags["ragexp.sequential.evaluated"] == "20" and tags["ragexp.sequential.total"] == str(n)
    assert tags["ragexp.sequential.decision"] == "failed" and tags["ragexp.sequential.baseline"] == baseline
    assert tags["ragexp.sequential.rule.recall_at_k.max_drop"].startswith("failed [")

    gate = ragexp("gate", "--baseline", baseline, "--candidate", payload["run_id"], *REPLAY, "--json")
    assert gate.code == 2, gate.stderr
    rules = {(r["metric"], r["rule"]): r for r in gate.json()["rules"]}
    gated = rules[("recall_at_k", "max_drop")]
    assert gated["outcome"] == "failed" and gated["method"] == "anytime-valid"
    # The gate recomputes the anytime-valid bound from the run's order: the run's own, not a fixed-n one.
    assert gated["sequential"]["low"] == recall["low"] and gated["sequential"]["high"] == recall["high"]
    assert rules[("error_rate", "max_error_rate")]["outcome"] == "passed"
    assert "0 of 20 candidate cases errored" in rules[("error_rate", "max_error_rate")]["message"]
    recorded = MlflowClient(store_uri).download_artifacts(payload["run_id"], "sequential.json", str(tmp_path))
    assert json.loads(Path(recorded).read_text()) == sequential


def test_an_unchanged_candidate_passes_before_every_case_is_evaluated(
    ragexp: Any, store_uri: str, tmp_path: Path
) -> None:
    n = 300
    path = write_jsonl(tmp_path / "cases.jsonl", replay_rows([{"rank": 1 + i % 2} for i in range(n)]))
    baseline = replay(ragexp, path, "--json").json()["run_id"]
    run = replay(ragexp, path, "--baseline", baseline, "--until-decided", "sequential.batch=30")
    assert run.code == 0, run.stderr
    assert "until decided: passed after" in run.stdout
    candidate = only_candidate(store_uri, baseline)
    tags = tags_of(store_uri, candidate)
    evaluated = int(tags["ragexp.sequential.evaluated"])
    assert tags["ragexp.sequential.decision"] == "passed" and evaluated < n and evaluated % 30 == 0
    gate = ragexp("gate", "--baseline", baseline, "--candidate", candidate, *REPLAY)
    assert gate.code == 0, gate.stdout + gate.stderr
    assert "PASSED" in gate.stdout


def only_candidate(store_uri: str, baseline: str) -> str:
    client = MlflowClient(store_uri)
    runs = client.search_runs([client.get_experiment_by_name("ragexp").experiment_id])
    (found,) = [r.info.run_id for r in runs if r.info.run_id != baseline]
    return str(found)


def test_cases_running_out_leave_a_rule_inconclusive_which_on_underpowered_fail_makes_a_failure(
    ragexp: Any, store_uri: str, tmp_path: Path
) -> None:
    n = 40
    base_path = write_jsonl(tmp_path / "base.jsonl", replay_rows([{"rank": 1}] * n))
    # A small drop on few cases: the sequence cannot tell it from the margin before the cases run out.
    cand_path = write_jsonl(tmp_path / "cand.jsonl", replay_rows([{"rank": 2 if i < 3 else 1} for i in range(n)]))
    baseline = replay(ragexp, base_path, "--json").json()["run_id"]
    run = replay(ragexp, cand_path, "--baseline", baseline, "--until-decided", "--json")
    assert run.code == 0, run.stderr
    sequential = run.json()["sequential"]
    assert sequential["evaluated"] == n and sequential["decision"] == "inconclusive"
    mrr = next(r for r in sequential["rules"] if r["metric"] == "mrr")
    assert mrr["decision"] == "inconclusive" and mrr["detectable_effect"] == pytest.approx(mrr["high"] - mrr["low"])
    candidate = run.json()["run_id"]

    warned = ragexp("gate", "--baseline", baseline, "--candidate", candidate, *REPLAY)
    assert warned.code == 0, warned.stdout + warned.stderr
    assert "inconclusive after 40 of 40 cases" in warned.stdout
    failed = ragexp("gate", "--baseline", baseline, "--candidate", candidate, *REPLAY, "gates.on_underpowered=fail")
    assert failed.code == 2
    assert "gates.on_underpowered=fail" in failed.stdout


def test_on_underpowered_fail_fails_an_underpowered_rule_of_an_ordinary_run(
    ragexp: Any, store_uri: str, tmp_path: Path
) -> None:
    # Three cases better by 0.5 and three worse by 0.5 of 30: no change on average, and nothing
    # near the allowed 0.01 could be seen.
    base_rows = replay_rows([{"rank": 2 if i < 3 else 1} for i in range(30)])
    base = replay(ragexp, write_jsonl(tmp_path / "a.jsonl", base_rows), "--json").json()
    cand_rows = replay_rows([{"rank": 2 if 3 <= i < 6 else 1} for i in range(30)])
    cand = replay(ragexp, write_jsonl(tmp_path / "b.jsonl", cand_rows), "--json").json()
    rule = ["gates.rules.mrr.statistical=true", "gates.rules.mrr.max_drop=0.01"]
    warned = ragexp("gate", "--baseline", base["run_id"], "--candidate", cand["run_id"], *REPLAY, *rule, "--json")
    assert warned.code == 0, warned.stderr
    mrr = next(r for r in warned.json()["rules"] if r["metric"] == "mrr")
    assert mrr["underpowered"] and mrr["outcome"] == "passed"
    failed = ragexp(
        "gate",
        "--baseline",
        base["run_id"],
        "--candidate",
        cand["run_id"],
        *REPLAY,
        *rule,
        "gates.on_underpowered=fail",
        "--json",
    )
    assert failed.code == 2
    mrr = next(r for r in failed.json()["rules"] if r["metric"] == "mrr")
    assert mrr["outcome"] == "failed" and "cannot tell" in mrr["message"]


def test_bad_sequential_input_is_one_line_and_no_run(ragexp: Any, store_uri: str, tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "cases.jsonl", replay_rows([{"rank": 1}] * 20))
    baseline = replay(ragexp, path, "--json").json()["run_id"]
    alone = replay(ragexp, path, "--baseline", baseline)
    assert alone.code == 1 and alone.stderr.strip().splitlines() == [
        "ragexp: error: --baseline goes with --until-decided (ragexp gate --baseline compares finished runs)"
    ]
    swept = replay(ragexp, path, "k=3,5", "-m", "--baseline", baseline, "--until-decided")
    assert swept.code == 1 and "cannot be combined with -m" in swept.stderr
    missing = replay(ragexp, path, "--until-decided")
    assert missing.code == 1 and "--until-decided needs --baseline RUN" in missing.stderr
    other = write_jsonl(tmp_path / "other.jsonl", replay_rows([{"rank": 1}] * 21))
    incomparable = replay(ragexp, other, "--baseline", baseline, "--until-decided")
    assert incomparable.code == 3 and "is not comparable" in incomparable.stderr
    only_p95 = replay(
        ragexp,
        path,
        "--baseline",
        baseline,
        "--until-decided",
        "gates.rules={}",
        "+gates.rules.p95_seconds.max_increase_ratio=0.2",
    )
    assert only_p95.code == 1, only_p95.stderr
    client = MlflowClient(store_uri)
    assert len(client.search_runs([client.get_experiment_by_name("ragexp").experiment_id])) == 1


@pytest.mark.system  # a whole run: `make test`, not the edit loop
def test_errors_count_among_the_evaluated_cases_and_resume_continues_the_stopped_run(
    ragexp: Any, store_uri: str, tmp_path: Path
) -> None:
    gate_file = tmp_path / "maintenance"
    ids = [*[f"ok-{i}" for i in range(36)], "contract-36", *[f"gated-{i}" for i in range(37, 40)]]
    data = write_jsonl(tmp_path / "cases.jsonl", labelled(ids))
    rules = ["~gates.rules", "+gates.rules={recall_at_k:{max_drop:0.05}}", "gates.max_error_rate=null"]
    with serve(FAULTY) as url:
        args = [
            "run",
            "provider=http",
            f"provider.system.url={url}",
            f"dataset.path={data}",
            "concurrency=1",
            *FAST,
            *rules,
        ]
        base = ragexp(*args, "--json")
        assert base.code == 0, base.stderr
        baseline = base.json()["run_id"]
        gate_file.touch()
    with serve(FAULTY, "--gate-file", str(gate_file)) as url:
        args = [
            "run",
            "provider=http",
            f"provider.system.url={url}",
            f"dataset.path={data}",
            "concurrency=1",
            *FAST,
            *rules,
        ]
        sequential = [*args, "--baseline", baseline, "--until-decided", "sequential.batch=10", "sequential.seed=3"]
        first = ragexp(*sequential, "provider.system.abort_after=1")
        assert first.code == 1, first.stderr
        client = MlflowClient(store_uri)
        runs = client.search_runs([client.get_experiment_by_name("ragexp").experiment_id])
        (stopped,) = [r for r in runs if r.info.run_id != baseline]
        assert stopped.data.tags["ragexp.status"] == "aborted"
        asked_first = stats(url)
        gate_file.unlink()
        resumed = ragexp(*sequential, "provider.system.abort_after=1", "--resume", stopped.info.run_id, "--json")
        asked = stats(url)
    assert resumed.code == 0, resumed.stderr
    payload = resumed.json()
    assert payload["run_id"] == stopped.info.run_id
    again = {case for case, times in asked.items() if len(times) > len(asked_first.get(case, []))}
    answered_first = {case for case in asked_first if not case.startswith("gated-")}
    assert not again & answered_first  # nothing answered before the stop is asked again
    evaluated = payload["sequential"]["evaluated"]
    assert evaluated == payload["case_count"] and evaluated % 10 == 0
    rows = MlflowClient(store_uri).download_artifacts(payload["run_id"], "cases.jsonl", str(tmp_path / "rows"))
    seen = [json.loads(line)["id"] for line in Path(rows).read_text().splitlines()]
    assert len(seen) == evaluated
    # The contract error counts only if that case was evaluated; cases not evaluated are no errors.
    assert payload["error_count"] == int("contract-36" in seen)
    metrics = MlflowClient(store_uri).get_run(payload["run_id"]).data.metrics
    assert metrics["error_rate"] == pytest.approx(payload["error_count"] / evaluated)


def test_conversations_are_sampled_batched_and_stopped_whole_with_their_history(
    ragexp: Any, store_uri: str, tmp_path: Path
) -> None:
    # A rule no unchanged candidate can pass (no drop allowed at all): the run goes on batch by
    # batch, each a few conversations, and every turn is asked after its earlier turns, with them.
    rules = ["~gates.rules", "+gates.rules={answer_accuracy:{max_drop:0.0},recall_at_k:{max_drop:0.0}}"]
    full = ragexp("run", "dataset=kb_zh_chat", *rules, "--json")
    assert full.code == 0, full.stderr
    baseline = full.json()["run_id"]
    run = ragexp(
        "run", "dataset=kb_zh_chat", *rules, "--baseline", baseline, "--until-decided", "sequential.batch=4", "--json"
    )
    assert run.code == 0, run.stderr
    payload = run.json()
    whole = rows_of(store_uri, baseline, tmp_path)
    asked = list(rows_of(store_uri, payload["run_id"], tmp_path).values())
    assert len(asked) == payload["sequential"]["evaluated"] and len(asked) > 4
    for row in asked:  # the same turns, the same answers, the same scores as the full run's
        assert row["metrics"] == whole[row["id"]]["metrics"], row["id"]
        assert row["output"]["answer"] == whole[row["id"]]["output"]["answer"], row["id"]
    # Each conversation comes whole and in order: its turns 1..n, one after another.
    order = [(row["conversation"], row["turn"]) for row in asked]
    runs: list[tuple[str, list[int]]] = []
    for conversation, turn in order:
        if runs and runs[-1][0] == conversation:
            runs[-1][1].append(turn)
        else:
            runs.append((conversation, [turn]))
    assert len({conversation for conversation, _ in runs}) == len(runs)
    sizes = {row["conversation"]: 0 for row in whole.values()}
    for row in whole.values():
        sizes[row["conversation"]] += 1
    assert all(turns == list(range(1, sizes[conversation] + 1)) for conversation, turns in runs)
    # The gate recomputes the looks from the logged order: the run's own bounds.
    gate = ragexp("gate", "--baseline", baseline, "--candidate", payload["run_id"], *rules, "--json")
    recorded = {(r["metric"], r["rule"]): r for r in payload["sequential"]["rules"]}
    for rule in gate.json()["rules"]:
        if (rule["metric"], rule["rule"]) in recorded and rule.get("sequential"):
            assert rule["sequential"]["low"] == recorded[(rule["metric"], rule["rule"])]["low"]


def test_a_plain_resume_of_an_interrupted_sequential_run_is_refused_in_one_line(
    ragexp: Any, store_uri: str, tmp_path: Path
) -> None:
    chat.INTERRUPT.clear()
    chats = write_jsonl(tmp_path / "chats.jsonl", CHATS)
    args = ["run", f"dataset.path={chats}", "system=python", "provider.system.target=tests.pipelines.chat:remembers"]
    args += ["metrics.names=[recall_at_k,mrr]", "k=1", "concurrency=1", "~gates.rules"]
    args += ["+gates.rules={recall_at_k:{max_drop:0.0}}", "sequential.batch=1"]
    baseline = ragexp(*args, "--json").json()["run_id"]
    chat.INTERRUPT.add("conv-ret#2")
    first = ragexp(*args, "--baseline", baseline, "--until-decided")
    assert first.code == 130, first.stderr
    assert "--until-decided --resume" in first.stderr  # the continue-with line keeps the flag
    client = MlflowClient(store_uri)
    runs = client.search_runs([client.get_experiment_by_name("ragexp").experiment_id])
    (stopped,) = [r.info.run_id for r in runs if r.info.run_id != baseline]
    before = client.get_run(stopped).data.tags
    plain = ragexp(*args, "--resume", stopped)
    assert plain.code == 1
    assert plain.stderr.strip().splitlines() == [
        f"ragexp: error: run {stopped} is a run of --until-decided: continue it with --until-decided --resume {stopped}"
    ]
    assert client.get_run(stopped).data.tags == before and client.get_run(stopped).info.status == "KILLED"
    resumed = ragexp(*args, "--until-decided", "--resume", stopped, "--json")
    assert resumed.code == 0, resumed.stderr
    assert resumed.json()["sequential"]["evaluated"] == resumed.json()["case_count"]
