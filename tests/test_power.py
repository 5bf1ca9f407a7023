"""What each comparison can detect: the detectable effect, the cases it needs, and where it shows."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy import stats

from ragexp.compare.figures import fmt
from ragexp.compare.power import (
    EXACT_DISCORDANT,
    cannot_tell_line,
    cases_needed,
    detectable_effect,
    paired_power,
    pass_fail_cases_needed,
    pass_fail_effect,
    pass_fail_power,
    smallest_testable,
    t_quantile,
)
from ragexp.stats.paired import paired_differences
from tests.conftest import write_jsonl
from tests.test_compare import replay_rows, run_replay, seed_specs


def textbook(sd: float, n: int, confidence: float, power: float = 0.8) -> float:
    alpha = 1 - confidence
    return float((stats.t.ppf(1 - alpha / 2, n - 1) + stats.t.ppf(power, n - 1)) * sd / math.sqrt(n))


def test_t_quantile_is_students() -> None:
    for df in [1, 2, 3, 5, 6, 9, 34, 120, 999, 9_999, 10_000, 123_456, 10**8]:
        for p in [0.5, 0.8, 0.9, 0.95, 0.975, 0.995, 0.9995]:
            assert t_quantile(p, df) == pytest.approx(stats.t.ppf(p, df), rel=1e-9, abs=1e-12), (df, p)
    assert t_quantile(0.975, math.inf) == pytest.approx(stats.norm.ppf(0.975), rel=1e-12)


@pytest.mark.parametrize(
    ("sd", "n", "confidence"), [(0.3, 35, 0.95), (0.5, 12, 0.9), (0.04, 400, 0.99), (1.7, 6, 0.95)]
)
def test_detectable_effect_is_the_textbook_paired_formula(sd: float, n: int, confidence: float) -> None:
    assert detectable_effect(sd, n, confidence=confidence) == pytest.approx(textbook(sd, n, confidence), rel=1e-9)


def test_cases_needed_is_the_fewest_whose_detectable_effect_is_small_enough() -> None:
    for sd, effect, confidence in [(0.3, 0.05, 0.95), (0.45, 0.02, 0.95), (0.2, 0.1, 0.9), (0.5, 0.4, 0.95)]:
        n = cases_needed(sd, effect, confidence=confidence)
        assert n is not None
        assert textbook(sd, n, confidence) <= effect < textbook(sd, n - 1, confidence)
    # A zero effect is never detectable; no spread at all needs only enough pairs for the test.
    assert cases_needed(0.3, 0.0, confidence=0.95) is None
    assert cases_needed(0.0, 0.01, confidence=0.95) == smallest_testable(0.95) == 6


def test_too_few_pairs_detect_nothing() -> None:
    # With 5 pairs the sign-flip test's smallest two-sided p-value is 2/32 > 0.05.
    assert smallest_testable(0.95) == 6 and smallest_testable(0.9) == 5
    assert detectable_effect(0.3, 5, confidence=0.95) is None
    assert detectable_effect(0.3, 6, confidence=0.95) is not None
    found = paired_power(np.array([0.1, -0.2, np.nan, 0.3]), confidence=0.95)
    assert found is not None and found.n == 3 and found.detectable is None and found.cannot_tell(10.0)


def detection_rate(draw: Any, n: int, confidence: float, draws: int = 1000) -> float:
    """Share of ``draws`` simulated comparisons in which the gate's own test rejects 'no change'."""
    rng = np.random.default_rng(20261201)
    hits = 0
    for i in range(draws):
        p_value, _, _ = paired_differences(draw(rng, n), resamples=2000, confidence=confidence, seed=i)
        hits += p_value < 1 - confidence
    return hits / draws


@pytest.mark.system
@pytest.mark.parametrize(("n", "confidence"), [(35, 0.95), (100, 0.95), (400, 0.95), (120, 0.9)])
def test_sign_flip_test_detects_the_detectable_effect_four_times_in_five_continuous(n: int, confidence: float) -> None:
    sd = 0.25
    effect = detectable_effect(sd, n, confidence=confidence)
    assert effect is not None
    rate = detection_rate(lambda rng, size: rng.normal(effect, sd, size), n, confidence)
    assert rate == pytest.approx(0.8, abs=0.04)


def pass_fail_draw(effect: float, discordant: float) -> Any:
    """Paired pass/fail differences: up with (π + δ)/2, down with (π - δ)/2, else equal."""
    shares = [(discordant + effect) / 2, (discordant - effect) / 2, 1 - discordant]
    return lambda rng, size: rng.choice(np.array([1.0, -1.0, 0.0]), size=size, p=shares)


@pytest.mark.parametrize(("n", "discordant"), [(35, 0.3), (35, 0.6), (100, 0.1), (100, 0.3), (400, 0.05), (400, 0.2)])
def test_sign_flip_test_detects_the_detectable_effect_four_times_in_five_pass_fail(n: int, discordant: float) -> None:
    found = paired_power(pass_fail_draw(0.0, discordant)(np.random.default_rng(7), n), confidence=0.95)
    assert found is not None and found.discordant is not None
    effect = pass_fail_effect(n, discordant, confidence=0.95)
    assert effect is not None
    # The continuous formula promises a smaller change than this test finds 4 times in 5.
    assert effect > detectable_effect(float(np.sqrt(discordant - effect**2)), n, confidence=0.95)  # type: ignore[operator]
    assert pass_fail_power(n, discordant, effect, confidence=0.95) == pytest.approx(0.8, abs=1e-9)
    assert detection_rate(pass_fail_draw(effect, discordant), n, 0.95) == pytest.approx(0.8, abs=0.04)
    needed = pass_fail_cases_needed(discordant, effect, confidence=0.95)
    assert needed is not None and pass_fail_power(needed, discordant, effect, confidence=0.95) >= 0.8
    assert pass_fail_power(needed - 1, discordant, effect, confidence=0.95) < 0.8


def test_too_few_discordant_pairs_detect_nothing_and_say_so() -> None:
    # 35 pairs, about 5 discordant: all 5 up would be found (2/32 > .05 is not even rejectable
    # with 5) too rarely, so there is no detectable effect, and the gate's line says why.
    assert pass_fail_power(35, 0.15, 0.15, confidence=0.95) < 0.8
    assert pass_fail_effect(35, 0.15, confidence=0.95) is None
    diffs = np.array([1.0, -1.0, 1.0, 1.0, 1.0] + [0.0] * 30)
    found = paired_power(diffs, confidence=0.95)
    assert found is not None and found.discordant == pytest.approx(5 / 35) and found.detectable is None
    assert found.cannot_tell(0.5)
    assert "(detectable: none with 5 discordant pairs;" in cannot_tell_line(0.01, found)
    assert "仅 5 对结果不一致的样本时无法检测任何变化" in cannot_tell_line(0.01, found, "zh")


def test_many_discordant_pairs_use_mcnemars_closed_form() -> None:
    n, discordant = 20_000, 0.1
    assert n * discordant > EXACT_DISCORDANT
    effect = pass_fail_effect(n, discordant, confidence=0.95)
    z, zb = stats.norm.ppf(0.975), stats.norm.ppf(0.8)
    assert effect is not None
    assert effect * math.sqrt(n) == pytest.approx(z * math.sqrt(discordant) + zb * math.sqrt(discordant - effect**2))
    # Where both apply they agree: the exact power at the closed form's effect is 80%.
    assert pass_fail_power(n, discordant, effect, confidence=0.95) == pytest.approx(0.8, abs=0.01)


def per_case_mrr(specs: list[dict[str, Any]]) -> np.ndarray:
    """MRR ranks the whole retrieved list (the seed exercise's .76 counts rank 5 as 1/5)."""
    return np.array([1.0 / s["rank"] for s in specs])


def seeded_runs(ragexp: Any, tmp_path: Path) -> tuple[str, str, np.ndarray, np.ndarray]:
    base_specs = seed_specs([1] * 29 + [2] * 16 + [5] * 5, cites_wrong=1, wrong_answers=8, p95=2.0)
    cand_specs = seed_specs([1] * 26 + [2] * 20 + [4] * 4, cites_wrong=2, wrong_answers=6, p95=2.8)
    base = run_replay(ragexp, write_jsonl(tmp_path / "base.jsonl", replay_rows(base_specs)))
    cand = run_replay(ragexp, write_jsonl(tmp_path / "cand.jsonl", replay_rows(cand_specs)))
    return base["run_id"], cand["run_id"], per_case_mrr(base_specs), per_case_mrr(cand_specs)


def test_diff_and_gate_say_what_they_can_detect_without_changing_a_verdict(ragexp: Any, tmp_path: Path) -> None:
    base, cand, b_mrr, c_mrr = seeded_runs(ragexp, tmp_path)
    expected = textbook(float(np.std(c_mrr - b_mrr, ddof=1)), 50, 0.95)

    diff = ragexp("diff", base, cand, "--json")
    assert diff.code == 0, diff.stderr
    metrics = {m["name"]: m for m in diff.json()["metrics"]}
    assert metrics["mrr"]["detectable_effect"] == pytest.approx(expected)
    assert metrics["p95_seconds"]["detectable_effect"] is None  # a run-level figure: no per-case mean
    text = ragexp("diff", base, cand)
    assert "detectable" in text.stdout and f"{expected:.4f}" in text.stdout

    # MRR may drop by .01 (the release gate): far below what 50 cases can see.
    gate = ragexp("gate", "--baseline", base, "--candidate", cand, "--json")
    assert gate.code == 2, gate.stderr
    rules = {(r["metric"], r["rule"]): r for r in gate.json()["rules"]}
    mrr = rules[("mrr", "max_drop")]
    assert mrr["detectable_effect"] == pytest.approx(expected) and mrr["underpowered"] is True
    assert rules[("citation_precision", "min")]["underpowered"] is False
    assert rules[("p95_seconds", "max_increase_ratio")]["detectable_effect"] is None
    needed = cases_needed(float(np.std(c_mrr - b_mrr, ddof=1)), 0.01, confidence=0.95)
    assert needed is not None and needed > 1000
    line = (
        f"this gate cannot tell a drop of 0.01 from noise with 50 cases "
        f"(detectable: {fmt(expected)}; about {needed:,} cases would be needed)"
    )
    text = ragexp("gate", "--baseline", base, "--candidate", cand)
    assert text.code == 2 and line in text.stdout

    # A drop allowed beyond the detectable effect is not flagged; the verdicts are the rules' own.
    loose = [
        f"gates.rules.mrr.max_drop={expected * 1.5:.4f}",
        "gates.rules.citation_precision.min=0.9",
        "gates.rules.p95_seconds.max_increase_ratio=0.5",
        "~gates.rules.recall_at_k",
        "~gates.rules.answer_accuracy",
    ]
    passed = ragexp("gate", "--baseline", base, "--candidate", cand, "--json", *loose)
    assert passed.code == 0, passed.stdout + passed.stderr
    flags = {(r["metric"], r["rule"]): r["underpowered"] for r in passed.json()["rules"]}
    assert flags[("mrr", "max_drop")] is False
    tight = ragexp(
        "gate", "--baseline", base, "--candidate", cand, "--json", *loose[1:], "gates.rules.mrr.max_drop=0.03"
    )
    assert tight.code == 0, tight.stdout + tight.stderr  # underpowered, and it still passes (drop .02)
    assert {(r["metric"], r["rule"]): r["underpowered"] for r in tight.json()["rules"]}[("mrr", "max_drop")] is True


def test_junit_and_summary_flag_an_underpowered_rule(ragexp: Any, tmp_path: Path) -> None:
    base, cand, b_mrr, c_mrr = seeded_runs(ragexp, tmp_path)
    expected = textbook(float(np.std(c_mrr - b_mrr, ddof=1)), 50, 0.95)
    junit, summary, summary_zh = tmp_path / "gate.xml", tmp_path / "gate.md", tmp_path / "gate_zh.md"
    args = ("gate", "--baseline", base, "--candidate", cand)
    assert ragexp(*args, "--junit", str(junit), "--summary", str(summary), "--language", "en").code == 2
    assert ragexp(*args, "--summary", str(summary_zh), "--language", "zh").code == 2

    import xmlschema

    xmlschema.XMLSchema(Path(__file__).parent / "schemas" / "junit-10.xsd").validate(str(junit))
    cases = {(c.get("classname"), c.get("name")): c for c in ET.parse(junit).getroot().iter("testcase")}
    out = cases[("mrr", "max_drop")].find("system-out")
    assert out is not None and out.text is not None
    assert out.text.startswith("this gate cannot tell a drop of 0.01 from noise with 50 cases")
    assert f"detectable: {expected:.3g}" in out.text
    assert cases[("citation_precision", "min")].find("system-out") is None

    md = summary.read_text(encoding="utf-8")
    assert "**⚠️ What this gate cannot see**" in md and f"- `mrr` `max_drop` 0.01: {out.text}" in md
    assert md.index("What this gate cannot see") < md.index("### Rules that did not pass")
    header = next(line for line in md.splitlines() if line.startswith("| Metric | Better |"))
    columns = [cell.strip() for cell in header.strip("|").split("|")]
    mrr_row = next(line for line in md.splitlines() if line.startswith("| `mrr` | higher |"))
    cells = [cell.strip() for cell in mrr_row.strip("|").split("|")]
    assert len(cells) == len(columns) and cells[columns.index("Detectable")] == f"{expected:.4f}"
    zh = summary_zh.read_text(encoding="utf-8")
    assert "该门禁在 50 条样本上无法把 0.01 的下降与噪声区分开" in zh and f"可检测：{expected:.3g}" in zh


@pytest.mark.system
def test_power_before_any_candidate(ragexp: Any, tmp_path: Path) -> None:
    base, _, b_mrr, _ = seeded_runs(ragexp, tmp_path)
    found = ragexp("power", "--baseline", base, "--effect", "0.02", "--json")
    assert found.code == 0, found.stderr
    payload = found.json()
    mrr = next(m for m in payload["metrics"] if m["name"] == "mrr")
    sd = float(np.std(b_mrr, ddof=1)) * math.sqrt(2)  # independent runs of the baseline's variance
    assert mrr["cases"] == 50 and mrr["sd"] == pytest.approx(sd)
    assert mrr["detectable_effect"] == pytest.approx(textbook(sd, 50, 0.95))
    n = mrr["cases_needed"]
    assert textbook(sd, n, 0.95) <= 0.02 < textbook(sd, n - 1, 0.95)
    assert "p95_seconds" not in {m["name"] for m in payload["metrics"]}
    # A pass/fail metric: the discordant share is the paired difference's variance, and the
    # figures are the exact sign test's, above what the continuous formula promises.
    accuracy = next(m for m in payload["metrics"] if m["name"] == "answer_accuracy")
    share = accuracy["sd"] ** 2
    assert 0 < share < 1
    assert accuracy["detectable_effect"] == pytest.approx(pass_fail_effect(50, share, confidence=0.95))
    effect = accuracy["detectable_effect"]
    assert effect > textbook(math.sqrt(share - effect**2), 50, 0.95)  # the spread at that effect
    assert accuracy["cases_needed"] == pass_fail_cases_needed(share, 0.02, confidence=0.95)

    correlated = ragexp("power", "--baseline", base, "--effect", "0.02", "--correlation", "0.75", "--json").json()
    half = next(m for m in correlated["metrics"] if m["name"] == "mrr")
    assert half["sd"] == pytest.approx(sd / 2)

    text = ragexp("power", "--baseline", base, "--effect", "0.02")
    assert text.code == 0 and f"{n:,}" in text.stdout and "cases for 0.02" in text.stdout

    bad = ragexp("power", "--baseline", base, "--effect", "-0.1")
    assert bad.code == 1 and bad.stderr.strip() == "ragexp: error: --effect: expected a positive change, got -0.1"
    missing = ragexp("power", "--baseline", "0123456789abcdef0123456789abcdef")
    assert missing.code == 1 and len(missing.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(("rule", "words"), [("max_drop", "a drop of 0.5"), ("max_increase", "an increase of 0.5")])
def test_the_underpowered_note_names_the_direction_its_rule_bounds(rule: str, words: str) -> None:
    from ragexp.compare.gate import RuleResult
    from ragexp.compare.power import Power

    power = Power(n=20, sd=2.0, detectable=1.4, confidence=0.95)
    result = RuleResult("p95_seconds", rule, 1.0, 1.2, 0.5, "ok", "passed", underpowered=True, power=power, allowed=0.5)
    line = result.cannot_tell() or ""
    assert line.startswith(f"this gate cannot tell {words} from noise with 20 cases"), line
