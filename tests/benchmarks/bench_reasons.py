"""Benchmark: what per-case rationales add to an offline run, side by side with a tree without them.

Both sides run `ragexp run provider=replay` on the same generated dataset of recorded outputs
(imperfect ones: relevant ids missed or ranked below K, citations of irrelevant ids, missing
facts, unanswerable cases), each into a SQLite store of its own that exists before the timed runs.
The other side is a git revision (default ``main``) extracted with ``git archive`` and put first
on PYTHONPATH; the sides alternate, and the ratio is the median over the repetitions of this
tree's CPU time (user + system) over the other's.

    .venv/bin/python tests/benchmarks/bench_reasons.py [--cases 100000] [--repeat 3] [--against main]

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--against", default="main", help="the git revision without rationales")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ragexp-bench-reasons-") as tmp:
        other = Path(tmp, "other")
        other.mkdir()
        archive = subprocess.run(["git", "archive", args.against], cwd=ROOT, capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(other)], input=archive.stdout, check=True)
        data = Path(tmp, "cases.jsonl")
        generate(data, args.cases)
        sides = {"with rationales": ROOT, f"{args.against} (without)": other}
        runs: dict[str, list[Timing]] = {name: [] for name in sides}

        def run(name: str, tree: Path, cases: Path) -> Timing:
            env = {
                **os.environ,
                "PYTHONPATH": str(tree),
                "MLFLOW_TRACKING_URI": f"sqlite:///{tmp}/{abs(hash(name))}/mlflow.db",
            }
            cmd = [sys.executable, "-m", "ragexp.cli.app", "run", "provider=replay", f"dataset.path={cases}", "--json"]
            return timed(cmd, env)

        small = Path(tmp, "small.jsonl")
        generate(small, 10)
        for name, tree in sides.items():  # creates each store, untimed
            run(name, tree, small)
        for _ in range(args.repeat):
            for name, tree in sides.items():
                runs[name].append(run(name, tree, data))
    ours, theirs = runs["with rationales"], runs[f"{args.against} (without)"]
    for name, timings in runs.items():
        cpu = ", ".join(f"{t.cpu:.1f}" for t in timings)
        wall = ", ".join(f"{t.wall:.1f}" for t in timings)
        print(f"{name:24} cpu s: {cpu}   wall s: {wall}")
    ratio = statistics.median(a.cpu / b.cpu for a, b in zip(ours, theirs, strict=True))
    wall_ratio = statistics.median(a.wall / b.wall for a, b in zip(ours, theirs, strict=True))
    verdict = "met" if ratio <= TARGET else "NOT MET"
    print(f"{args.cases:,} cases: CPU ratio {ratio:.3f} (wall {wall_ratio:.3f}); target <= {TARGET:.2f}: {verdict}")


if __name__ == "__main__":
    main()
