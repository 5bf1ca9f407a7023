"""Benchmark: the dataset loader's column-at-a-time check against its row path, 100,000 cases.

    .venv/bin/python tests/benchmarks/bench_loader.py [--cases 100000] [--repeat 5]

The same label-only JSON Lines file (what ``provider=fake`` runs on), split into lines once, goes
through each path in one process; the median of ``--repeat`` runs each, alternating. Rule (issue
23): the column path stays only if the row path takes at least 1.5 times as long.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from typing import Any

import orjson

from ragexp.datasets import loader

RULE = 1.5


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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", type=int, default=100_000)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    lines = b"".join(orjson.dumps(row) + b"\n" for row in label_rows(args.cases)).split(b"\n")
    paths = {
        "column": lambda: loader._label_columns(lines),
        "row": lambda: loader._parse_rows("bench.jsonl", lines),
    }
    found: dict[str, list[float]] = {name: [] for name in paths}
    for _ in range(args.repeat):
        for name, path in paths.items():
            gc.collect()
            started = time.perf_counter()
            cases = path()
            found[name].append(time.perf_counter() - started)
            if cases is None or len(cases) != args.cases:
                raise SystemExit(f"{name} path did not build {args.cases} cases")
    column, row = statistics.median(found["column"]), statistics.median(found["row"])
    print(f"{args.cases:,} label-only cases, median of {args.repeat}")
    print(f"column path {column:.3f} s  row path {row:.3f} s  row/column {row / column:.2f}x")
    print(f"keep the column path (>= {RULE}x): {'yes' if row / column >= RULE else 'no'}")


if __name__ == "__main__":
    main()
