"""Benchmark: what per-case rationales add to an offline run, with and without them side by side.

Both sides run `ragexp run provider=replay` on the same generated dataset of recorded outputs
(imperfect ones: relevant ids missed or ranked below K, citations of irrelevant ids, missing
facts, unanswerable cases), each into a SQLite store of its own that exists before the timed runs.
By default both sides are this tree, the one without rationales started through a benchmark-only
entry point that replaces the scoring step's ``fill_rationales`` with a no-op (so neither
building nor writing them is timed there; the child says it skipped them, and the benchmark
refuses a side that did not). ``--against REV`` instead puts a git revision (extracted with
``git archive``) first on PYTHONPATH as the side without. The sides alternate, and the ratio is
the median over the repetitions of the with-rationales side's CPU time (user + system) over the
other's.

    .venv/bin/python tests/benchmarks/bench_reasons.py [--cases 100000] [--repeat 3] [--against REV]

Target (issue 32 §6): rationales add at most 10% to a 100,000-case offline run.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_run import Timing, timed  # the same timed child as `make bench`

ROOT = Path(__file__).resolve().parents[2]
TARGET = 1.10


def generate(path: Path, count: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    with path.open("w", encoding="utf-8") as out:
        for i in range(count):
            if i % 10 == 9:
                refused = rng.random() < 0.7
                row = {
                    "id": f"c{i}",
                    "question": f"问题 {i}：这个问题知识库答不了？",
                    "unanswerable": True,
                    "response": "知识库中没有足够证据回答这个问题。" if refused else f"答案是 {i}。[1]",
                    "retrieved_ids": [] if refused else [f"doc-{rng.randrange(10**6)}"],
                    "retrieved_contexts": [] if refused else ["无关上下文"],
                    "citations": [] if refused else [1],
                }
            else:
                rel = [f"doc-{rng.randrange(10**6)}" for _ in range(rng.randint(1, 3))]
                ranked = [*rel[: rng.randint(0, len(rel))], *(f"doc-{rng.randrange(10**6)}" for _ in range(4))]
                rng.shuffle(ranked)
                facts = [f"事实{rng.randrange(1000)}", f"条款{rng.randrange(100)}"]
                row = {
                    "id": f"c{i}",
                    "question": f"问题 {i}：关于 {rel[0]} 的政策是什么？",
                    "relevant_ids": rel,
                    "expected_facts": facts,
                    "reference": f"参考答案 {i}。",
                    "response": "，".join(facts[: rng.randint(0, 2)]) + "。[1][2]",
                    "retrieved_ids": ranked,
                    "retrieved_contexts": [f"上下文 {d}" for d in ranked],
                    "citations": [1, 2],
                }
            out.write(json.dumps(row, ensure_ascii=False) + "\n")


SKIPPED = "rationales skipped:"
WITHOUT = f"""
import atexit, sys
import ragexp.workflows.run_score
skipped = []
ragexp.workflows.run_score.fill_rationales = lambda *args, **kwargs: skipped.append(1)
atexit.register(lambda: print("{SKIPPED}", len(skipped)))
from ragexp.cli.app import main
sys.argv[0] = "ragexp"
main()
"""
"""This tree's `ragexp` with the scoring step's rationales switched off (a benchmark-only entry point)."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--against", default=None, help="a git revision as the side without (default: this tree, off)")
    args = parser.parse_args()
    ragexp = ["-m", "ragexp.cli.app"]
    with tempfile.TemporaryDirectory(prefix="ragexp-bench-reasons-") as tmp:
        if args.against is None:
            without = "this tree, rationales off"
            sides = {"with rationales": (ROOT, ragexp), without: (ROOT, ["-c", WITHOUT])}
        else:
            other = Path(tmp, "other")
            other.mkdir()
            archive = subprocess.run(["git", "archive", args.against], cwd=ROOT, capture_output=True, check=True)
            subprocess.run(["tar", "-x", "-C", str(other)], input=archive.stdout, check=True)
            without = f"{args.against} (without)"
            sides = {"with rationales": (ROOT, ragexp), without: (other, ragexp)}
        data = Path(tmp, "cases.jsonl")
        generate(data, args.cases)
        runs: dict[str, list[Timing]] = {name: [] for name in sides}

        def run(name: str, cases: Path) -> Timing:
            tree, entry = sides[name]
            env = {
                **os.environ,
                "PYTHONPATH": str(tree),
                "MLFLOW_TRACKING_URI": f"sqlite:///{tmp}/{abs(hash(name))}/mlflow.db",
            }
            cmd = [sys.executable, *entry, "run", "provider=replay", f"dataset.path={cases}", "--json"]
            timing = timed(cmd, env)
            if entry[0] == "-c" and f"{SKIPPED} 1\n" not in timing.stdout:
                raise SystemExit(f"the side without rationales did not skip them once: {timing.stdout[-200:]!r}")
            return timing

        small = Path(tmp, "small.jsonl")
        generate(small, 10)
        for name in sides:  # creates each store, untimed
            run(name, small)
        for _ in range(args.repeat):
            for name in sides:
                runs[name].append(run(name, data))
    ours, theirs = runs["with rationales"], runs[without]
    for name, timings in runs.items():
        cpu = ", ".join(f"{t.cpu:.1f}" for t in timings)
        wall = ", ".join(f"{t.wall:.1f}" for t in timings)
        print(f"{name:26} cpu s: {cpu}   wall s: {wall}")
    pairs = ", ".join(f"{a.cpu / b.cpu:.3f}" for a, b in zip(ours, theirs, strict=True))
    ratio = statistics.median(a.cpu / b.cpu for a, b in zip(ours, theirs, strict=True))
    wall_ratio = statistics.median(a.wall / b.wall for a, b in zip(ours, theirs, strict=True))
    verdict = "met" if ratio <= TARGET else "NOT MET"
    fastest = min(t.cpu for t in ours) / min(t.cpu for t in theirs)  # other load only ever adds time
    print(f"CPU ratio per pair: {pairs}; fastest with / fastest without: {fastest:.3f}")
    print(
        f"{args.cases:,} cases, with / without rationales: CPU ratio {ratio:.3f} (wall {wall_ratio:.3f}); "
        f"target <= {TARGET:.2f}: {verdict}"
    )


if __name__ == "__main__":
    main()
