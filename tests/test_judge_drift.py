"""A judge that cannot drift unseen: the served identity of every grade, the cache keyed by it,
runs judged by different served identities refused unless bridged, canaries, and the bridges.

The judges are the deterministic stand-in (tests/servers/judge.py) on 127.0.0.1, started twice
with the same config and differing only in what their replies say served them (``model``,
``system_fingerprint``), or once changing its fingerprint mid-run."""

from __future__ import annotations

import json
from pathlib import Path
from statistics import NormalDist
from typing import Any

import numpy as np
import pytest
from mlflow.tracking import MlflowClient

from ragexp.escape import markdown
from ragexp.metrics.canaries import agreement, agreement_change, bridged_delta
from tests.conftest import ROOT, write_jsonl
from tests.judge_drift_sim import simulate
from tests.servers.procs import serve, stats

JUDGE = ROOT / "tests/servers/judge.py"

CONTEXT = "Albert Einstein proposed the theory of relativity. Marie Curie studied radioactivity."
ANSWERS = [
    "Albert Einstein proposed relativity.",
    "Einstein proposed relativity. He was born on planet Mars.",
    "Marie Curie studied radioactivity.",
    "Curie studied radioactivity. She lived on the Moon.",
    "Einstein proposed relativity. Curie studied radioactivity.",
    "Nobody knows anything about physics.",
]
CASES = [
    {
        "id": f"c{i}",
        "question": "Who did what in physics?",
        "relevant_ids": ["d1"],
        "expected_facts": ["Einstein"],
        "reference": "Albert Einstein proposed relativity.",
        "response": answer,
        "retrieved_ids": ["d1"],
        "retrieved_contexts": [CONTEXT],
        "citations": [1],
    }
    for i, answer in enumerate(ANSWERS)
]
METRICS = "metrics.names=[faithfulness,recall_at_k]"


def judge_args(url: str, *extra: str) -> list[str]:
    return [
        "provider=replay_judge",
        f"provider.judge.base_url={url}",
        f"provider.judge.embeddings.url={url}",
        "provider.judge.api_key_env=null",
        "provider.judge.max_retries=0",
        METRICS,
        *extra,
    ]


def run(ragexp: Any, data: Path, url: str, *extra: str) -> tuple[dict[str, Any], Any]:
    result = ragexp("run", f"dataset.path={data}", *judge_args(url, *extra), "--json")
    assert result.code == 0, result.stderr
    payload = result.json()
    return payload, result


def tags_and_metrics(store_uri: str, run_id: str) -> tuple[dict[str, str], dict[str, float]]:
    record = MlflowClient(store_uri).get_run(run_id)
    return record.data.tags, record.data.metrics


@pytest.mark.system
def test_a_swapped_judge_is_seen_never_served_another_models_grades_and_its_runs_are_refused(
    ragexp: Any, store_uri: str, tmp_path: Path
) -> None:
    data = write_jsonl(tmp_path / "cases.jsonl", CASES)
    n = len(CASES)
    same = ("--served-model", "judge-model-2026-01")
    with serve(JUDGE, *same, "--fingerprint", "fp_a") as url_a:
        first, _ = run(ragexp, data, url_a)
        again, _ = run(ragexp, data, url_a)
        calls_a = stats(url_a)["chat"]
    with serve(JUDGE, *same, "--fingerprint", "fp_b") as url_b:
        swapped, _ = run(ragexp, data, url_b)
        calls_b = stats(url_b)["chat"]
    with serve(JUDGE, *same, "--fingerprint", "fp_a") as url_back:
        back, _ = run(ragexp, data, url_back)
    # The alias now served by another model snapshot, the fingerprint as before.
    with serve(JUDGE, "--served-model", "judge-model-2026-02", "--fingerprint", "fp_a") as url_model:
        other_model, _ = run(ragexp, data, url_model)

    tags_1, metrics_1 = tags_and_metrics(store_uri, first["run_id"])
    tags_2, metrics_2 = tags_and_metrics(store_uri, again["run_id"])
    tags_3, metrics_3 = tags_and_metrics(store_uri, swapped["run_id"])
    tags_4, metrics_4 = tags_and_metrics(store_uri, back["run_id"])
    prompts = tags_1["ragexp.judge"].split("prompts=")[1].split("|")[0]
    served_a = f"chat=judge-model-2026-01@fp_a|prompts={prompts}"
    served_b = f"chat=judge-model-2026-01@fp_b|prompts={prompts}"
    # The config is the same; only what the server says served it differs.
    assert first["config_hash"] == swapped["config_hash"] and tags_1["ragexp.judge"] == tags_3["ragexp.judge"]
    assert tags_1["ragexp.judge.served"] == tags_2["ragexp.judge.served"] == tags_4["ragexp.judge.served"] == served_a
    assert tags_3["ragexp.judge.served"] == served_b and tags_3["ragexp.judge.served_count"] == "1"
    # The params say the same (params are what MLflow's run comparison lines up).
    params = {key: MlflowClient(store_uri).get_run(key).data.params for key in (first["run_id"], swapped["run_id"])}
    assert params[first["run_id"]]["judge.served"] == served_a and params[swapped["run_id"]]["judge.served"] == served_b
    assert params[first["run_id"]]["judge.served_count"] == params[swapped["run_id"]]["judge.served_count"] == "1"

    # First run: every grade fresh. A rerun on the same judge: one grade asked afresh to learn who
    # serves, the rest from the cache.
    assert metrics_1["judge.cache_hits"] == 0
    assert metrics_2["judge.cache_hits"] == n - 1 and metrics_2["judge.cache_refused"] == 0
    # The swapped judge: the probe shows another identity, so not one cached grade is used.
    assert metrics_3["judge.cache_hits"] == 0 and metrics_3["judge.cache_refused"] == n - 1
    assert calls_b == metrics_3["judge.chat_calls"] > 0
    assert calls_a == metrics_1["judge.chat_calls"] + metrics_2["judge.chat_calls"]
    # Swapped back: the first judge's grades are still kept under its identity.
    assert metrics_4["judge.cache_hits"] == n - 1 and metrics_4["judge.cache_refused"] == 0
    # Another served model behind the same name and fingerprint: not one grade reused either.
    tags_5, metrics_5 = tags_and_metrics(store_uri, other_model["run_id"])
    assert tags_5["ragexp.judge.served"] == f"chat=judge-model-2026-02@fp_a|prompts={prompts}"
    assert metrics_5["judge.cache_hits"] == 0 and metrics_5["judge.cache_refused"] == n - 1
    assert first["summary"] == swapped["summary"] == back["summary"]  # the stand-ins grade alike

    # Runs judged by different served identities are not comparable: exit 3, naming both.
    for command in (["diff", first["run_id"], swapped["run_id"]], ["gate", "--baseline", first["run_id"]]):
        args = [*command, "--candidate", swapped["run_id"]] if command[0] == "gate" else command
        refused = ragexp(*args)
        assert refused.code == 3, refused.stderr
        assert f"judge served identity differs ({served_a} vs {served_b})" in refused.stderr
    same_judge = ragexp("diff", first["run_id"], again["run_id"], "--json")
    assert same_judge.code == 0, same_judge.stderr


def test_a_judge_redeployed_mid_run_is_said_and_recorded(ragexp: Any, store_uri: str, tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "cases.jsonl", CASES)
    args = ("--served-model", "judge-model-2026-01", "--fingerprint", "fp_a")
    with serve(JUDGE, *args, "--switch-after", "4", "--switch-fingerprint", "fp_c") as url:
        payload, result = run(ragexp, data, url, "provider.judge.concurrency=1")
        calls = stats(url)["chat"]
    tags, metrics = tags_and_metrics(store_uri, payload["run_id"])
    assert calls == metrics["judge.chat_calls"] > 4
    served = tags["ragexp.judge.served"].split("; ")
    assert [part.split("|")[0] for part in served] == [
        "chat=judge-model-2026-01@fp_a",
        "chat=judge-model-2026-01@fp_c",
    ]
    assert tags["ragexp.judge.served_count"] == "2"
    params = MlflowClient(store_uri).get_run(payload["run_id"]).data.params
    assert params["judge.served"] == tags["ragexp.judge.served"] and params["judge.served_count"] == "2"
    assert "the judge's grades were served by 2 identities" in result.stderr


def test_mindie_and_tei_report_what_they_are(ragexp: Any, store_uri: str, tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "cases.jsonl", CASES[:2])
    with serve(JUDGE, "--version", "2.0.RC1", "--fingerprint", "rev-7") as url:
        payload, _ = run(
            ragexp,
            data,
            url,
            "judge=mindie",
            f"provider.judge.base_url={url}",
            f"provider.judge.embeddings.url={url.removesuffix('/v1')}",
            "provider.judge.embeddings.kind=tei",
            "metrics.names=[faithfulness,answer_similarity]",
        )
    tags, _ = tags_and_metrics(store_uri, payload["run_id"])
    served = tags["ragexp.judge.served"].split("; ")
    parts = {part for identity in served for part in identity.split("|")}
    assert "chat=judge-model@rev-7" in parts and "mindie=2.0.RC1" in parts
    assert "tei=embed-model@rev-7" in parts
    assert json.loads(json.dumps(tags))  # the tag is plain text


@pytest.mark.parametrize("seed", [3])
def test_simulated_drift_is_detected_on_the_canaries_and_the_bridge_covers_the_true_delta(seed: int) -> None:
    # The benchmark's simulation at a fifth of its size (make bench-judge-drift: 1,000).
    figures = simulate(200, seed=seed)
    assert figures.detected >= 0.95
    assert figures.raw_coverage <= 0.05  # the raw delta carries the judge's drift
    assert figures.bridged_coverage >= 0.90
    assert abs(figures.mean_bridged - figures.true_delta) < abs(figures.mean_raw - figures.true_delta) / 4


def test_no_drift_is_no_detection_and_both_deltas_cover() -> None:
    figures = simulate(200, drift=0.0, seed=5)
    assert figures.detected <= 0.10  # the test's size, not a finding
    assert figures.raw_coverage >= 0.90 and figures.bridged_coverage >= 0.90


def test_agreement_and_its_change_on_known_values() -> None:
    human = np.array([0.0, 0.2, 0.4, 0.6, 0.8, 1.0] * 2)
    judge = human + 0.1
    found = agreement(np.clip(judge, 0, 1), human, threshold=0.5, min_labelled=10)
    assert found is not None and found.n == 12
    assert found.bias == pytest.approx((0.1 * 10) / 12) and found.mae == pytest.approx(found.bias)
    # 0.4 becomes 0.5, a pass: 10 of 12 calls agree, 8 and 6 passes: κ = (120 - 72) / (144 - 72).
    assert found.kappa == pytest.approx(2 / 3)
    change = agreement_change(human, human + np.array([0.1, 0.0] * 6), human, threshold=0.5)
    assert change is not None and change.change == pytest.approx(0.05)
    assert change.ci_low < 0.05 < change.ci_high and 0 < change.p_value < 0.05
    assert agreement_change(human, human, human, threshold=0.5).p_value == 1.0  # type: ignore[union-attr]
    bridge = bridged_delta(np.array([0.5, 0.6, 0.7, 0.8]), np.array([0.7, 0.8, 0.9, 1.0]), human, human + 0.1, human)
    assert bridge is not None and bridge.raw == pytest.approx(0.2)
    assert bridge.correction == pytest.approx(-0.1) and bridge.delta == pytest.approx(0.1)


SUPPORTED = "Albert Einstein proposed relativity."
HALF = "Einstein proposed relativity. He was born on planet Mars."
NONE = "The Moon is made of green cheese entirely."
CANARY_JUDGE = [1.0] * 4 + [0.5] * 4 + [0.0] * 4
"""What the stand-in's faithfulness gives the canaries below (sentences supported by the context)."""
CANARY_HUMAN = [1.0] * 4 + [0.5, 0.5, 0.0, 0.0] + [0.0] * 4


def canary_rows() -> list[dict[str, Any]]:
    answers = [SUPPORTED] * 4 + [HALF] * 4 + [NONE] * 4
    return [
        {
            "id": f"k{i}",
            "question": f"Who proposed relativity? ({i})",
            "contexts": ["Albert Einstein proposed the theory of relativity."],
            "answer": answer,
            "human": {"faithfulness": human},
        }
        for i, (answer, human) in enumerate(zip(answers, CANARY_HUMAN, strict=True))
    ]


@pytest.mark.system
def test_canaries_are_graded_in_every_judged_run_per_served_identity_and_their_agreement_logged(
    ragexp: Any, store_uri: str, tmp_path: Path
) -> None:
    data = write_jsonl(tmp_path / "cases.jsonl", CASES)
    canaries = write_jsonl(tmp_path / "canaries.jsonl", canary_rows())
    digest = __import__("hashlib").sha256(canaries.read_bytes()).hexdigest()
    extra = f"provider.judge.canaries={canaries}"
    with serve(JUDGE, "--fingerprint", "fp_a") as url_a:
        first, _ = run(ragexp, data, url_a, extra)
        again, _ = run(ragexp, data, url_a, extra)
    with serve(JUDGE, "--fingerprint", "fp_b") as url_b:
        swapped, _ = run(ragexp, data, url_b, extra)
    total = len(CASES) + len(CANARY_JUDGE)
    for payload in (first, again, swapped):
        tags, metrics = tags_and_metrics(store_uri, payload["run_id"])
        assert tags["ragexp.judge.canaries"] == digest[:12]
        # κ at 0.5: the judge passes 8, people 6, 10 of 12 agree: (120 - 72) / (144 - 72).
        assert metrics["judge_agreement.faithfulness.kappa"] == pytest.approx(2 / 3)
        assert metrics["judge_agreement.faithfulness.bias"] == pytest.approx(1 / 12)
        assert metrics["judge_agreement.faithfulness.mae"] == pytest.approx(1 / 12)
        assert metrics["judge_agreement.faithfulness.n"] == 12
        folder = MlflowClient(store_uri).download_artifacts(payload["run_id"], "canaries.json", str(tmp_path / "a"))
        artifact = json.loads(Path(folder).read_text())
        assert artifact["judge"]["faithfulness"] == CANARY_JUDGE and artifact["human"]["faithfulness"] == CANARY_HUMAN
        assert artifact["digest"] == digest
    _, metrics_2 = tags_and_metrics(store_uri, again["run_id"])
    _, metrics_3 = tags_and_metrics(store_uri, swapped["run_id"])
    # Cases and canaries alike: from the cache for the same judge, graded again for the swapped one.
    assert metrics_2["judge.cache_hits"] == total - 1 and metrics_2["judge.cache_refused"] == 0
    assert metrics_3["judge.cache_hits"] == 0 and metrics_3["judge.cache_refused"] >= total - 1


def test_a_canary_file_with_a_bad_line_is_one_clear_error(ragexp: Any, tmp_path: Path) -> None:
    rows = canary_rows()
    rows[2]["human"] = {"faithfulness": "high"}
    canaries = write_jsonl(tmp_path / "canaries.jsonl", rows)
    from ragexp.errors import ConfigError
    from ragexp.metrics.canaries import load_canaries

    with pytest.raises(ConfigError, match=r"canaries.jsonl:3: human.faithfulness: a finite number is required"):
        load_canaries(canaries)
    assert len(load_canaries(write_jsonl(tmp_path / "ok.jsonl", canary_rows())).items) == 12


CANDIDATE_ANSWERS = [
    "Albert Einstein proposed relativity. Zephyrs carried it to Vienna.",
    "Einstein proposed relativity.",
    "Marie Curie studied radioactivity.",
    "Curie studied radioactivity. Zephyrs sang in her laboratory.",
    "Einstein proposed relativity. Curie studied radioactivity.",
    "Einstein and Curie did physics.",
]


def prompts(url: str) -> list[str]:
    import httpx

    found: list[str] = httpx.get(url.removesuffix("/v1") + "/prompts").json()
    return found


@pytest.mark.system
def test_bridged_comparisons_rejudge_only_the_baselines_outputs_or_correct_by_the_canaries(
    ragexp: Any, store_uri: str, tmp_path: Path
) -> None:
    base_data = write_jsonl(tmp_path / "base.jsonl", CASES)
    cand_rows = [{**case, "response": answer} for case, answer in zip(CASES, CANDIDATE_ANSWERS, strict=True)]
    cand_data = write_jsonl(tmp_path / "cand.jsonl", cand_rows)
    canaries = write_jsonl(tmp_path / "canaries.jsonl", canary_rows())
    extra = f"provider.judge.canaries={canaries}"
    with serve(JUDGE, "--fingerprint", "fp_a") as url_a:
        base, _ = run(ragexp, base_data, url_a, extra)
    with serve(JUDGE, "--fingerprint", "fp_b") as url_b:
        cand, _ = run(ragexp, cand_data, url_b, extra)
        assert base["dataset_hash"] == cand["dataset_hash"]
        refused = ragexp("diff", base["run_id"], cand["run_id"])
        assert refused.code == 3 and "--bridge-judge rejudge|canaries" in refused.stderr

        before, asked = stats(url_b)["chat"], len(prompts(url_b))
        bridged = ragexp("diff", base["run_id"], cand["run_id"], "--bridge-judge", "rejudge", "--json")
        assert bridged.code == 0, bridged.stderr
        calls, new_prompts = stats(url_b)["chat"] - before, prompts(url_b)[asked:]
        again = ragexp("diff", base["run_id"], cand["run_id"], "--bridge-judge", "rejudge", "--json")
        assert again.code == 0, again.stderr
        calls_again = stats(url_b)["chat"] - before - calls
        # report --baseline refuses the pair as diff does, and bridges it as diff does.
        assert ragexp("report", cand["run_id"], "--baseline", base["run_id"], "--out", str(tmp_path / "r0")).code == 3
        out = tmp_path / "rejudged"
        args = ("report", cand["run_id"], "--baseline", base["run_id"], "--language", "en", "--out", str(out))
        reported = ragexp(*args, "--bridge-judge", "rejudge")
        assert reported.code == 0, reported.stderr
        rejudged_md = (out / "report.md").read_text(encoding="utf-8")

    payload = bridged.json()
    bridge = payload["bridge"]
    # Judge calls only, for the baseline's outputs only: every call counted by the judge is one the
    # bridge made, and no candidate answer was sent.
    assert bridge["method"] == "rejudge" and bridge["judge_calls"] == calls > 0
    # c2 and c4 answered the same in both runs: the candidate's judge graded them in its run already.
    assert bridge["rejudged"] == len(CASES) and bridge["cache_hits"] == 2
    assert any("Einstein proposed relativity. He was born on planet Mars." in p for p in new_prompts)
    assert not any("Zephyr" in p for p in new_prompts)
    faithfulness = next(m for m in payload["metrics"] if m["name"] == "faithfulness")
    assert faithfulness["baseline"] == pytest.approx(base["summary"]["faithfulness"])  # the stand-ins grade alike
    assert faithfulness["candidate"] == pytest.approx(cand["summary"]["faithfulness"])
    # The second bridge is served by the cache, bar the one grade that shows who serves the judge.
    assert (
        again.json()["bridge"]["cache_hits"] == len(CASES) - 1
        and 0 < calls_again == again.json()["bridge"]["judge_calls"] < calls
    )

    by_canaries = ragexp("diff", base["run_id"], cand["run_id"], "--bridge-judge", "canaries", "--json")
    assert by_canaries.code == 0, by_canaries.stderr
    found = by_canaries.json()["bridge"]
    assert found["method"] == "canaries"
    [metric] = found["metrics"]
    raw = cand["summary"]["faithfulness"] - base["summary"]["faithfulness"]
    assert metric["name"] == "faithfulness" and metric["raw"] == pytest.approx(raw)
    assert metric["correction"] == 0.0 and metric["delta"] == pytest.approx(raw)  # the judges grade alike
    assert metric["ci_low"] < metric["delta"] < metric["ci_high"] and metric["canaries"] == 12
    assert "judge bridged (canaries): faithfulness delta" in by_canaries.stderr
    said = f"judge bridged (rejudge): the baseline's outputs graded by the candidate's judge, {len(CASES)} grades ("
    assert markdown(said) in rejudged_md
    out = tmp_path / "by_canaries"
    reported = ragexp(
        "report", cand["run_id"], "--baseline", base["run_id"], "--bridge-judge", "canaries", "--out", str(out)
    )
    assert reported.code == 0, reported.stderr
    said = (
        f"judge bridged (canaries): faithfulness delta {metric['delta']:+.4f} [{metric['ci_low']:+.4f}, "
        f"{metric['ci_high']:+.4f}] (raw {metric['raw']:+.4f}, canary correction +0.0000; 6 cases, 12 canaries)"
    )
    assert markdown(said) in (out / "report.md").read_text(encoding="utf-8")

    rules = "gates.rules={faithfulness:{max_drop:0.5}}"
    gate = ragexp("gate", "--baseline", base["run_id"], "--candidate", cand["run_id"], rules, "--json")
    assert gate.code == 3, gate.stderr
    gate = ragexp(
        "gate",
        "--baseline",
        base["run_id"],
        "--candidate",
        cand["run_id"],
        rules,
        "--bridge-judge",
        "canaries",
        "--json",
    )
    # Compared now (exit 2, not 3): the preset's rules on metrics these runs lack fail; faithfulness
    # is decided on the bridged delta.
    assert gate.code == 2, gate.stdout + gate.stderr
    assert {f["metric"] for f in gate.json()["failures"]} == {
        "mrr",
        "citation_precision",
        "answer_accuracy",
        "p95_seconds",
    }
    [rule] = [r for r in gate.json()["rules"] if r["metric"] == "faithfulness"]
    assert rule["method"] == "bridged: canaries" and rule["outcome"] == "passed"
    assert "bridged by the canaries, delta +0.0000 [" in rule["message"]
    assert gate.json()["bridge"]["method"] == "canaries"


@pytest.mark.system
def test_a_judge_turned_lenient_shows_in_its_canary_agreement_in_diff_and_can_fail_the_gate(
    ragexp: Any, store_uri: str, tmp_path: Path
) -> None:
    data = write_jsonl(tmp_path / "cases.jsonl", CASES)
    canaries = write_jsonl(tmp_path / "canaries.jsonl", canary_rows())
    extra = f"provider.judge.canaries={canaries}"
    with serve(JUDGE, "--fingerprint", "fp_a") as url_a:
        base, _ = run(ragexp, data, url_a, extra)
    # The same model name, a new fingerprint, and now any statement about Mars is "supported".
    with serve(JUDGE, "--fingerprint", "fp_b", "--lenient-on", "Mars") as url_b:
        cand, _ = run(ragexp, data, url_b, extra)
    _, metrics = tags_and_metrics(store_uri, cand["run_id"])
    # The four half-supported canaries (one Mars sentence each) now graded 1.0 against people's 0.5, 0.5, 0, 0.
    assert metrics["judge_agreement.faithfulness.bias"] == pytest.approx(3 / 12)

    diff = ragexp("diff", base["run_id"], cand["run_id"], "--bridge-judge", "canaries", "--json")
    assert diff.code == 0, diff.stderr
    [row] = diff.json()["judge_agreement"]
    assert row["bias_change"] == pytest.approx(2 / 12) and row["kappa_change"] == 0.0 and row["same_canaries"]
    assert "judge agreement on the canaries, faithfulness: κ 0.67 -> 0.67 (+0.00), bias +0.083 -> +0.250" in diff.stderr
    # The same 12 canaries in both runs, paired: four canaries each moved +0.5 (grade and error alike).
    shifts = np.array([0.5] * 4 + [0.0] * 8)
    se = shifts.std(ddof=1) / np.sqrt(12)
    p_value = 2 * (1 - NormalDist().cdf((2 / 12) / se))
    paired = row["paired"]
    assert paired["n"] == 12 and paired["change"] == pytest.approx(2 / 12) and paired["confidence"] == 0.95
    assert paired["ci_low"] == pytest.approx(2 / 12 - 1.959964 * se, abs=1e-6)
    assert paired["p_value"] == pytest.approx(p_value)
    assert paired["mae_change"] == pytest.approx(2 / 12) and paired["mae_p_value"] == pytest.approx(p_value)
    # Every canary's pass/fail is the same for both judges, so κ moved by exactly 0 in every resample.
    assert paired["kappa_change"] == 0.0 and paired["kappa_ci_low"] == 0.0 and paired["kappa_ci_high"] == 0.0
    assert f"paired on 12 canaries (95% intervals): bias +0.167 [{paired['ci_low']:+.3f}, " in diff.stderr
    assert f"p={p_value:.3g}, MAE +0.167" in diff.stderr
    [bridged] = diff.json()["bridge"]["metrics"]
    # The same outputs: raw +1/12 (case c1's Mars sentence now supported); the canaries correct by
    # the judges' gap on them, -4 x 0.5 / 12.
    assert bridged["raw"] == pytest.approx(1 / 12) and bridged["correction"] == pytest.approx(-2 / 12)
    assert bridged["delta"] == pytest.approx(-1 / 12)

    rules = (
        "gates.rules={faithfulness:{max_drop:0.5}}",
        "gates.judge_bias.max_change=0.1",
        "gates.judge_agreement.min_kappa=0.5",
        "gates.judge_bias.max_abs=0.3",
    )
    gate = ragexp(
        "gate",
        "--baseline",
        base["run_id"],
        "--candidate",
        cand["run_id"],
        *rules,
        "--bridge-judge",
        "canaries",
        "--json",
    )
    assert gate.code == 2, gate.stderr
    by_rule = {r["rule"]: r for r in gate.json()["rules"] if r["rule"].startswith("judge_")}
    assert by_rule["judge_bias.max_change"]["outcome"] == "failed"
    assert by_rule["judge_bias.max_change"]["message"] == (
        f"faithfulness: bias on the canaries +0.083 -> +0.250, moved +0.167 [{paired['ci_low']:+.3f}, "
        f"{paired['ci_high']:+.3f}] paired on 12 canaries, p={p_value:.3g} (allowed 0.1): the judge changed"
    )
    assert by_rule["judge_agreement.min_kappa"]["outcome"] == "passed"
    assert by_rule["judge_bias.max_abs"]["outcome"] == "passed"

    # At 99% the paired test cannot tell this move (p about 0.02) from noise: the rule passes saying
    # so, and gates.on_underpowered=fail makes that a failure.
    def judge_gate(*extra: str) -> Any:
        return ragexp("gate", "--baseline", base["run_id"], "--candidate", cand["run_id"], *extra, "--json")

    strict = ("gates.judge_bias.max_change=0.1", "gates.confidence=0.99", "--bridge-judge", "canaries")
    cannot = judge_gate("gates.rules={faithfulness:{max_drop:0.5}}", *strict)
    [rule] = [r for r in cannot.json()["rules"] if r["rule"] == "judge_bias.max_change"]
    assert rule["outcome"] == "passed" and rule["underpowered"]
    assert rule["message"].endswith("(allowed 0.1): beyond the bound, but not told from noise at 99%: it cannot tell")
    failing = judge_gate("gates.rules={faithfulness:{max_drop:0.5}}", *strict, "gates.on_underpowered=fail")
    [rule] = [r for r in failing.json()["rules"] if r["rule"] == "judge_bias.max_change"]
    assert rule["outcome"] == "failed"

    # A gate of judge rules alone (no metric bound) is a gate: it checks the judge.
    only_judge = judge_gate("~gates.rules", "gates.judge_bias.max_change=0.1", "--bridge-judge", "canaries")
    assert only_judge.code == 2, only_judge.stderr
    assert [f["rule"] for f in only_judge.json()["failures"]] == ["judge_bias.max_change"]
    passing = judge_gate("~gates.rules", "gates.judge_agreement.min_kappa=0.5", "--bridge-judge", "canaries")
    assert passing.code == 0, passing.stderr
    assert {r["rule"] for r in passing.json()["rules"]} == {"max_error_rate", "judge_agreement.min_kappa"}


CHATS = [
    {"id": "alone", "question": "满多少包邮？", "relevant_ids": ["shipping-fee"]},
    {
        "id": "conv-ret",
        "turns": [
            {"question": "退货怎么办？", "relevant_ids": ["return-policy"], "reference": "签收后七天内可退货。"},
            {"question": "那运费呢？", "relevant_ids": ["return-fee"], "reference": "退货运费由买家承担。"},
        ],
    },
    {
        "id": "conv-inv",
        "turns": [
            {"question": "怎么开发票？", "relevant_ids": ["invoice-types"], "reference": "可开电子普通发票。"},
            {"question": "多久能收到？", "relevant_ids": ["invoice-time"]},
        ],
    },
]
"""Conversations in the bundled kb_zh_chat's shape: follow-ups that mean nothing without their history."""
ON_TOPIC = "{name: on_topic, kind: judge, rubric: 'the answer is about what the user asks', needs: [question, answer]}"


@pytest.mark.system
def test_rejudge_grades_each_baseline_turn_after_the_same_history_its_own_judge_read(
    ragexp: Any, store_uri: str, tmp_path: Path
) -> None:
    from tests.pipelines import chat

    data = write_jsonl(tmp_path / "chats.jsonl", CHATS)

    def chat_run(target: str, url: str) -> dict[str, Any]:
        done = ragexp(
            "run",
            f"dataset.path={data}",
            "system=python",
            f"provider.system.target=tests.pipelines.chat:{target}",
            "metrics.names=[recall_at_k]",
            "k=1",
            "judge=openai",
            f"provider.judge.base_url={url}",
            "provider.judge.api_key_env=null",
            "provider.judge.max_retries=0",
            f"metrics.custom=[{ON_TOPIC}]",
            "--json",
        )
        assert done.code == 0, done.stderr
        found: dict[str, Any] = done.json()
        return found

    def question(prompt: str) -> str:
        found: str = json.loads(prompt.split("input: ", 1)[1])["question"]
        return found

    with serve(JUDGE, "--fingerprint", "fp_a") as url_a:
        base = chat_run("remembers", url_a)
        original = [question(p) for p in prompts(url_a) if "那运费呢？" in p]
    with serve(JUDGE, "--fingerprint", "fp_b") as url_b:
        cand = chat_run("forgets", url_b)
        asked = len(prompts(url_b))
        bridged = ragexp("diff", base["run_id"], cand["run_id"], "--bridge-judge", "rejudge", "--json")
        assert bridged.code == 0, bridged.stderr
        rejudged = [question(p) for p in prompts(url_b)[asked:] if "那运费呢？" in p]
    # The baseline's follow-up was judged after its first turn and the baseline's answer to it;
    # graded again by the candidate's judge, it is read after the very same conversation.
    first = chat.DOCS["return-policy"]
    history = f"[conversation so far]\nuser: 退货怎么办？\nassistant: {first}\n[question]\n那运费呢？"
    assert original == [history] and rejudged == [history]
    on_topic = next(m for m in bridged.json()["metrics"] if m["name"] == "on_topic")
    assert on_topic["baseline"] == pytest.approx(base["summary"]["on_topic"])  # the stand-ins grade alike


def test_the_served_identities_param_always_fits_and_keeps_two_sets_apart() -> None:
    from ragexp import limits
    from ragexp.workflows.run_log import served_params

    one = "; ".join(f"chat=judge-{i}@fp_{i}|prompts=abc" for i in range(400))  # about 12,000 characters
    other = one.replace("judge-399", "judge-x")
    found, apart = served_params(one), served_params(other)
    assert len(one) > limits.PARAM_VALUE.chars and found["judge.served_count"] == "400"
    for key, value in found.items():
        assert limits.problem(limits.PARAM_KEY, key) is None and limits.problem(limits.PARAM_VALUE, value) is None
    assert found["judge.served"].startswith(one[:1000]) and found["judge.served"] != apart["judge.served"]
    small = served_params("chat=m@fp|prompts=abc")
    assert small == {"judge.served": "chat=m@fp|prompts=abc", "judge.served_count": "1"}


def test_a_resumed_run_keeps_the_served_params_its_first_attempt_logged(
    store_uri: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from ragexp.errors import TrackingError
    from ragexp.tracking.store import Store
    from ragexp.workflows.run_log import log_served_params

    store = Store(store_uri)
    run_id = store.create_run("resumed", "r", {}, {"k": "5"})
    log_served_params(store, run_id, "chat=m@fp_a|prompts=ab", resumed=False)
    # The second attempt heard another identity: the params stay (a param cannot change), it says so.
    log_served_params(store, run_id, "chat=m@fp_b|prompts=ab", resumed=True)
    assert Store(store_uri).get_run(run_id).params["judge.served"] == "chat=m@fp_a|prompts=ab"
    assert "keeps the judge's served identities its first attempt recorded" in capsys.readouterr().err
    with pytest.raises(TrackingError, match="judge"):
        log_served_params(store, run_id, "chat=m@fp_b|prompts=ab", resumed=False)
