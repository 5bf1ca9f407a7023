"""Benchmark: a trivial metric of the team's own (``metrics.custom``, ``kind: python``).

    .venv/bin/python tests/benchmarks/bench_custom_metrics.py [--cases 100000] [--repeat 15] [--runs 3] [--no-runs]

Three rows:

- scoring, twice (a rule answering bools: "a refusal must give the hotline number"; one answering
  floats): ragexp's scoring step for a Python metric (``ragexp.metrics.custom.score_python``: the
  calls on worker threads under their deadline, every value read and checked, the errors and
  rationales put on their cases) on ``--cases`` cases, against a plain loop over the same cases
  and outputs that calls the same function and keeps its values as an array of floats (a score
  per case: the least scoring must give). CPU time (every thread) of each, the sides
  alternating, the fastest of ``--repeat`` each (the machine is shared: the fastest is the least
  disturbed); the cyclic collector off for both, as the CLI runs. Target: at most 1.5x the loop.
  Beside it, the ratio to the bare loop that only calls it and keeps what it returned.
- the whole run: what the metric adds to ``ragexp run provider=fake k=10 tracking.traces=false``
  on the same number of cases (CPU of the fresh process with the metric less the one without),
  per case (a 10-case pair's difference, the metric's fixed cost such as importing the Python-
  target machinery, taken off), beside the loop's per-case cost: the call, and everything a
  metric costs a run besides (its column in ``cases.jsonl``, ``scores.json`` and the run's table,
  its summary). No target: it says what a user pays per metric. The fastest of ``--runs``
  alternating runs each; on a loaded machine the difference of two runs of seconds is noisy.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

RAGEXP = [sys.executable, "-m", "ragexp.cli.app"]
HOTLINE = "400-820-8820"
TARGET = 1.5
SMALL = 10
RULES = f'''
def hotline(case, output):
    return not case.unanswerable or "{HOTLINE}" in output.answer

def share(case, output):
    return 1.0 if case.unanswerable or output.answer in case.expected_facts else 0.5
'''


def hotline(case: Any, output: Any) -> bool:
    return not case.unanswerable or HOTLINE in output.answer


def cases_and_results(count: int) -> tuple[list[Any], list[Any]]:
    from ragexp.records import Case, CaseResult, SystemOutput

    cases, results = [], []
    for i in range(count):
        unanswerable = i % 5 == 0
        refusal = "无法回答，请致电 " + HOTLINE if i % 2 else "无法回答"
        answer = refusal if unanswerable else f"fact {i}"
        cases.append(Case(f"c{i}", f"q{i}", [] if unanswerable else ["d0"], [f"fact {i}"], None, unanswerable, i + 1))
        results.append(CaseResult(f"c{i}", SystemOutput(["d0"], ["text"], answer, [1], 0.01)))
    return cases, results


def scoring_row(count: int, repeat: int, name: str = "hotline") -> dict[str, Any]:
    import numpy as np

    from ragexp.config.compose import compose
    from ragexp.metrics.custom import load_custom, score_python

    with tempfile.TemporaryDirectory(prefix="ragexp-bench-custom-") as tmp:
        (Path(tmp) / "bench_rules.py").write_text(RULES, encoding="utf-8")
        entry = f"{{name: {name}, kind: python, target: 'bench_rules:{name}', path: '{tmp}'}}"
        loaded = load_custom(compose([f"metrics.custom=[{entry}]"]).metrics.custom)
    function = loaded.python[0].function
    cases, results = cases_and_results(count)
    expected = [float(function(case, result.output)) for case, result in zip(cases, results, strict=True)]

    def plain() -> Any:
        values = [function(case, result.output) for case, result in zip(cases, results, strict=True)]
        return np.array(values, dtype=np.float64)

    def bare() -> Any:
        return [function(case, result.output) for case, result in zip(cases, results, strict=True)]

    answered = np.ones(len(cases), dtype=bool)

    def ours() -> Any:
        return score_python(loaded.python, cases, results, answered, workers=8)[name]

    sides = {"plain": plain, "ours": ours, "bare": bare}
    best = dict.fromkeys(sides, float("inf"))
    wall = dict.fromkeys(sides, float("inf"))
    gc.disable()
    for _ in range(repeat):
        for side, work in sides.items():
            started, clock = time.process_time(), time.perf_counter()
            values = work()
            best[side] = min(best[side], time.process_time() - started)
            wall[side] = min(wall[side], time.perf_counter() - clock)
            if np.asarray(values, dtype=np.float64).tolist() != expected:
                raise SystemExit(f"{side}: the values differ from the function's own")
    gc.enable()
    if any(result.metric_errors for result in results):
        raise SystemExit("a case of the benchmark errored")
    kind = "bool" if name == "hotline" else "float"
    return {
        "name": f"scoring a trivial Python metric ({kind} values), {count:,} cases, CPU",
        "measured": best["ours"],
        "reference": best["plain"],
        "reference_name": "plain loop calling it, its values as floats",
        "ratio": best["ours"] / best["plain"],
        "target": TARGET,
        "note": f"wall {wall['ours'] * 1e3:.1f} ms; vs the bare call loop ({best['bare'] * 1e3:.2f} ms): "
        f"{best['ours'] / best['bare']:.2f}x",
    }


def generate(path: Path, count: int) -> Path:
    with path.open("w", encoding="utf-8") as out:
        for i in range(count):
            unanswerable = i % 5 == 0
            row: dict[str, Any] = {"id": f"c{i}", "question": f"q{i}", "unanswerable": unanswerable}
            if not unanswerable:
                row.update({"relevant_ids": [f"d{i}"], "expected_facts": [f"fact {i}"]})
            out.write(json.dumps(row) + "\n")
    return path


def run_row(count: int, loop_per_case: float, runs: int) -> dict[str, Any]:
    from bench_python_systems import cpu_of  # a sibling script: CPU seconds of one child process

    with tempfile.TemporaryDirectory(prefix="ragexp-bench-custom-run-") as tmp:
        folder = Path(tmp)
        (folder / "bench_rules.py").write_text(RULES, encoding="utf-8")
        env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{folder}/mlruns/mlflow.db"}
        entry = f"{{name: hotline, kind: python, target: 'bench_rules:hotline', path: '{folder}'}}"
        cpu: dict[tuple[int, bool], float] = {}
        for size in (SMALL, count):
            data = generate(folder / f"cases-{size}.jsonl", size)
            # Without traces: the metric's 0s would make cases "imperfect", and past
            # tracking.traces_max_cases those get traces the run without it does not write
            # (bench_traces.py measures traces).
            base = [*RAGEXP, "run", "provider=fake", f"dataset.path={data}", "k=10", "tracking.traces=false", "--json"]
            cpu_of(base, env)  # lets MLflow create the store, untimed
            for _ in range(runs):  # alternating, the fastest of each: a fresh process is noisy
                for metric in (False, True):
                    took, stdout = cpu_of([*base, f"metrics.custom=[{entry}]"] if metric else base, env)
                    cpu[size, metric] = min(cpu.get((size, metric), float("inf")), took)
                    payload = json.loads(stdout)
                    if payload["error_count"] or (metric and payload["summary"].get("hotline") is None):
                        raise SystemExit(f"a run went wrong: {payload}")
    fixed = cpu[SMALL, True] - cpu[SMALL, False]
    per_case = ((cpu[count, True] - cpu[count, False]) - fixed) / (count - SMALL)
    return {
        "name": f"what the metric adds to a {count:,}-case run, per case, CPU (once per run: {fixed:.2f} s)",
        "measured": per_case,
        "reference": loop_per_case,
        "reference_name": "plain loop calling it, per case",
        "ratio": per_case / loop_per_case,
        "target": None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--cases", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--runs", type=int, default=3, help="whole runs of each side (the fastest counts)")
    parser.add_argument("--no-runs", action="store_true", help="the scoring rows only")
    args = parser.parse_args()
    scoring = scoring_row(args.cases, args.repeat)
    rows = [scoring, scoring_row(args.cases, args.repeat, "share")]
    if not args.no_runs:
        rows.append(run_row(args.cases, scoring["reference"] / args.cases, args.runs))
    failed = False
    for row in rows:
        unit, scale = ("ms", 1e3) if row["measured"] > 1e-3 else ("µs", 1e6)
        verdict = "-" if row["target"] is None else ("ok" if row["ratio"] <= row["target"] else "NOT MET")
        target = "" if row["target"] is None else f" (target <= {row['target']:g}x)"
        note = f" [{row['note']}]" if row.get("note") else ""
        print(
            f"{row['name']}: {row['measured'] * scale:.2f} {unit} vs {row['reference'] * scale:.2f} {unit} "
            f"({row['reference_name']}) = {row['ratio']:.2f}x{target}: {verdict}{note}"
        )
        failed |= verdict == "NOT MET"
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
