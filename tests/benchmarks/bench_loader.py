"""Benchmark: ``load_dataset`` on 100,000 cases, against the floor of parsing the same lines.

    .venv/bin/python tests/benchmarks/bench_loader.py [--cases 100000] [--repeat 5]

Two JSON Lines files of ``--cases`` cases: label-only rows (what ``provider=fake`` runs on) and
the same rows with recorded outputs (``provider=replay``). Timed in one process, the median of
``--repeat`` runs each: ``load_dataset`` (read, parse, check every field by the rule table, build
the cases, hash them), and the floor, ``orjson.loads`` of every line with no check and no case.
The ratio is the cost of the checks and the cases over parsing alone.

Every row goes through one path (the rule table). A column-at-a-time check of label-only files
was kept only while it was at least 1.5x faster than the row path; this benchmark measured it
slower, and it was removed (the CHANGELOG has the figures).
"""

from __future__ import annotations

import argparse
import gc
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from ragexp.datasets.loader import load_dataset


def label_rows(count: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for i in range(count):
        if i % 10 == 3:
            rows.append({"id": f"u{i}", "question": f"第 {i} 题答不了？", "unanswerable": True})
            continue
        row: dict[str, Any] = {
            "id": f"c{i}",
            "question": f"问题 {i} 怎么办",
            "relevant_ids": [f"doc-{i}", f"doc-{i + 1}"],
            "expected_facts": [f"事实{i}"],
        }
        if i % 5 == 0:
            row["reference"] = f"参考 {i}"
        rows.append(row)
    return rows


def replay_rows(count: int) -> list[dict[str, Any]]:
    return [
        {
            **row,
            "response": f"回答 {n}",
            "retrieved_ids": [f"doc-{n}", f"doc-{n + 7}", f"doc-{n + 1}"],
            "retrieved_contexts": [f"上下文 {n}", "", f"上下文 {n + 1}"],
            "citations": [1, 3],
            "latency_seconds": 0.25,
        }
        for n, row in enumerate(label_rows(count))
    ]


def median(repeat: int, job: Callable[[], int], expected: int) -> float:
    times = []
    for _ in range(repeat):
        gc.collect()
        started = time.perf_counter()
        built = job()
        times.append(time.perf_counter() - started)
        if built != expected:
            raise SystemExit(f"built {built} cases, expected {expected}")
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    print(f"{args.cases:,} cases, median of {args.repeat} in one process")
    with tempfile.TemporaryDirectory() as tmp:
        for kind, rows in (("label-only", label_rows(args.cases)), ("replay", replay_rows(args.cases))):
            path = Path(tmp) / f"{kind}.jsonl"
            path.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows))
            del rows

            def parse_only(path: Path = path) -> int:
                return sum(1 for line in path.read_bytes().split(b"\n") if line and orjson.loads(line))

            def load(path: Path = path) -> int:
                return len(load_dataset(path).cases)

            floor = median(args.repeat, parse_only, args.cases)
            loaded = median(args.repeat, load, args.cases)
            print(f"{kind:10}  load_dataset {loaded:.3f} s  parse only {floor:.3f} s  ratio {loaded / floor:.2f}x")


if __name__ == "__main__":
    main()
