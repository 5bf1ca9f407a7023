"""Benchmark: `ragexp draft --n 500` over 2,000 chunks against a drafting model on 127.0.0.1
that answers every call after 100 ms, at provider.judge.concurrency=32.

    .venv/bin/python tests/benchmarks/bench_draft.py [--n 500] [--chunks 2000] [--concurrency 32] [--delay-ms 100]

The drafting pass (:meth:`ragexp.draft.drafting.Drafter.draft`: planning, BM25 pairing and
checks, every call, deduplication) is timed in this process against the ideal
calls x latency / concurrency, counting the calls the server answered. Target: within 1.3x.
A second pass over the same cache must make no call. The whole command, as a fresh process, is
timed too. The drafting model runs on the same machine: on a loaded one the ratio measures
the load as much as the client (the load average is printed with it).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from ragexp.config.models import JudgeConfig  # noqa: E402
from ragexp.draft.corpus import read_corpus  # noqa: E402
from ragexp.draft.drafting import Drafter, Options  # noqa: E402
from tests.servers.procs import serve, stats  # noqa: E402

DRAFTER = ROOT / "tests/servers/drafter.py"
TARGET = 1.3


def corpus(path: Path, size: int) -> None:
    rng = random.Random(11)
    pool = [chr(code) for code in range(0x4E00, 0x4E00 + 800)]
    with path.open("w", encoding="utf-8") as out:
        for number in range(size):
            text = "。".join("".join(rng.choice(pool) for _ in range(rng.randint(15, 60))) for _ in range(4)) + "。"
            out.write(json.dumps({"id": f"doc-{number:05d}", "text": text}, ensure_ascii=False) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=500)
    parser.add_argument("--chunks", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--delay-ms", type=float, default=100.0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder, serve(DRAFTER, "--delay-ms", str(args.delay_ms)) as url:
        work = Path(folder)
        corpus(work / "chunks.jsonl", args.chunks)
        chunks = read_corpus(work / "chunks.jsonl")
        config = JudgeConfig(base_url=url, api_key_env=None, concurrency=args.concurrency, max_retries=0)
        options = Options(n=args.n)
        drafter = Drafter(config, work / "cache.sqlite")
        drafter.preflight()
        imported = time.perf_counter()
        import ragexp.metrics.judge.client  # noqa: F401  (imports ragas: a fixed cost, shown apart)

        import_seconds = time.perf_counter() - imported
        started = time.perf_counter()
        drafted = drafter.draft(chunks, options)
        seconds = time.perf_counter() - started
        served = int(stats(url)["chat"])
        ideal = served * args.delay_ms / 1000 / args.concurrency
        again = Drafter(config, work / "cache.sqlite").draft(chunks, options)
        command = [
            sys.executable, "-m", "ragexp.cli.app", "draft", "--corpus", str(work / "chunks.jsonl"),
            "--out", str(work / "draft.jsonl"), "--n", str(args.n), "--cache", str(work / "cli-cache.sqlite"),
            "judge=openai", f"provider.judge.base_url={url}", "provider.judge.api_key_env=null",
            f"provider.judge.concurrency={args.concurrency}", "provider.judge.max_retries=0",
        ]  # fmt: skip
        cli_started = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True, cwd=work)
        cli_seconds = time.perf_counter() - cli_started
        if done.returncode:
            raise SystemExit(done.stderr)
    ratio = seconds / ideal
    print(f"cases planned {args.n}, written {drafted.summary.written}, chunks {args.chunks}")
    print(f"model calls served {served} ({drafted.summary.usage.chat_calls} counted by the client)")
    print(f"drafting pass {seconds:.2f} s; ideal {served} x {args.delay_ms:g} ms / {args.concurrency} = {ideal:.2f} s")
    print(f"ratio {ratio:.2f}x (target <= {TARGET}x): {'ok' if ratio <= TARGET else 'MISSED'}")
    print(f"importing the judge client (ragas), before the pass: {import_seconds:.2f} s")
    print(f"rerun from the cache: {again.summary.usage.chat_calls} model calls")
    print(f"load average over the last minute: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPU(s)")
    print(f"whole command as a fresh process (interpreter, imports, corpus, cold cache): {cli_seconds:.2f} s")


if __name__ == "__main__":
    main()
