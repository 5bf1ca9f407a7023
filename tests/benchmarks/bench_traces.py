"""Per-case cost of logging traces with assessments: ragexp's bulk writer vs MLflow's own path.

    make bench-traces                       # SQLite in a temp folder, and the server if reachable
    python tests/benchmarks/bench_traces.py --cases 10000 --baseline-cases 200 \
        --server http://127.0.0.1:5055 --server-cases 2000
    python tests/benchmarks/bench_traces.py --only server --server http://127.0.0.1:5077
    python tests/benchmarks/bench_traces.py --only pinned --pinned-cases 500

For each store, side by side in one process:
- ragexp: ``TraceWriter.write`` (what ``ragexp run`` calls), N cases, each a trace with a root,
  a retriever and four stage spans, 3 expectations and 5 feedback assessments;
- MLflow: the public path a user would write, the same content through ``mlflow.start_span``
  (synchronous export, so the async queue cannot drop anything) then one ``log_expectation`` /
  ``log_feedback`` call per assessment, inside ``mlflow.start_run``.
Afterwards every trace and every assessment is counted back from the store; a shortfall fails.

Pinned (``--only pinned``; part of ``make bench-traces`` when this machine has two cores to give):
a SQLite-backed ``mlflow server`` in a temp folder started under ``taskset -c 1``, this process
pinned to core 0, so the server never shares the client's core. The same cases go through
ragexp's writer (MLflow's REST client, up to ``SERVER_THREADS`` calls in flight) and through
MLflow's public path above run in a pool of as many threads, and the wall-time ratio is printed.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.servers.procs import mlflow_server  # noqa: E402
from tests.test_traces import trace_counts  # noqa: E402

os.environ["MLFLOW_ENABLE_ASYNC_TRACE_LOGGING"] = "false"  # the baseline must not drop traces

METRICS = ["recall_at_k", "mrr", "ndcg_at_k", "citation_precision", "answer_accuracy"]
STAGES = {"embedding": 0.004, "vector": 0.006, "rerank": 0.02, "model": 0.4}
CLIENT_CORE, SERVER_CORE = 0, 1
WARM_UP = 20
"""Untimed traces per side before the pinned measurement."""


def cases(n: int) -> list:
    from ragexp.case_traces import CaseTrace, FeedbackRecord

    return [
        CaseTrace(
            case_id=f"case-{i:06d}",
            question=f"退款多久到账？问题 {i}",
            answer=f"退款一般 1-3 个工作日到账 [1]。回答 {i}",
            error=None,
            latency_seconds=0.43,
            ranked_ids=[f"doc-{i}-{r}" for r in range(5)],
            contexts=[f"文档 {r} 的内容，关于退款和物流。" * 4 for r in range(5)],
            timings=dict(STAGES),
            expectations={"expected_facts": ["1-3 个工作日"], "relevant_ids": [f"doc-{i}-0"], "unanswerable": False},
            feedback=[FeedbackRecord(name, (i % 7) / 6) for name in METRICS],
        )
        for i in range(n)
    ]


def ragexp_path(uri: str, experiment: str, n: int) -> tuple[float, int, int, float]:
    from ragexp.tracking.store import Store
    from ragexp.tracking.traces import TraceWriter

    store = Store(uri)
    experiment_id = store.experiment_id(experiment, create=True)
    assert experiment_id is not None
    run_id = store.create_run(experiment, "bench-ragexp", {}, {})
    records = cases(n)
    writer = TraceWriter(store, experiment_id, run_id)
    started = time.perf_counter()
    writer.write(records)
    seconds = time.perf_counter() - started
    counted = time.perf_counter()
    traces, assessments = trace_counts(store.uri, run_id)
    store.end_run(run_id, "FINISHED")
    return seconds, traces, assessments, time.perf_counter() - counted


def mlflow_path(uri: str, experiment: str, n: int, threads: int = 1) -> tuple[float, int, int]:
    """MLflow's public path for ``n`` cases, one at a time or ``threads`` at a time (MLflow links
    a trace started in any thread to the newest active run)."""
    import mlflow
    from mlflow.entities import AssessmentSource, AssessmentSourceType, Document

    from ragexp.tracking.store import Store

    mlflow.set_tracking_uri(uri)
    mlflow.set_experiment(experiment)
    code = AssessmentSource(source_type=AssessmentSourceType.CODE, source_id="bench")
    human = AssessmentSource(source_type=AssessmentSourceType.HUMAN, source_id="dataset")
    records = cases(n)

    def log(case: Any) -> None:
        with mlflow.start_span("rag_case", span_type="CHAIN") as root:
            root.set_inputs({"case_id": case.case_id, "question": case.question})
            with mlflow.start_span("retrieve", span_type="RETRIEVER") as retriever:
                retriever.set_inputs({"query": case.question})
                retriever.set_outputs(
                    [
                        Document(page_content=text, metadata={"doc_uri": doc}, id=doc)
                        for doc, text in zip(case.ranked_ids, case.contexts, strict=True)
                    ]
                )
                for stage in STAGES:
                    with mlflow.start_span(stage) as span:
                        span.set_outputs({"seconds": STAGES[stage]})
            root.set_outputs(case.answer)
            trace_id = root.trace_id
        for name, value in case.expectations.items():
            mlflow.log_expectation(trace_id=trace_id, name=name, value=value, source=human)
        for item in case.feedback:
            mlflow.log_feedback(trace_id=trace_id, name=item.name, value=item.value, source=code)

    with mlflow.start_run(run_name="bench-mlflow") as run:
        started = time.perf_counter()
        if threads == 1:
            for case in records:
                log(case)
        else:
            with ThreadPoolExecutor(max_workers=threads) as pool:
                for _ in pool.map(log, records):
                    pass  # re-raises the first failure
        seconds = time.perf_counter() - started
    store = Store(uri)
    experiment_id = store.experiment_id(experiment, create=False)
    assert experiment_id is not None
    traces, assessments = trace_counts(uri, run.info.run_id)
    return seconds, traces, assessments


def bench(label: str, uri: str, n: int, baseline_n: int) -> bool:
    experiment = f"bench-traces-{int(time.time())}"
    print(f"\n== {label}: {uri}", flush=True)
    seconds, traces, assessments, count_s = ragexp_path(uri, experiment, n)
    ours = seconds / n * 1000
    ok = traces == n and assessments == n * 8
    print(
        f"ragexp bulk writer : {n:6d} cases {seconds:8.2f} s  {ours:7.2f} ms/case   "
        f"counted {traces} traces, {assessments} assessments (expected {n}, {n * 8}; count took {count_s:.1f} s)"
    )
    base_s, base_traces, base_assessments = mlflow_path(uri, experiment + "-mlflow", baseline_n)
    theirs = base_s / baseline_n * 1000
    ok_base = base_traces == baseline_n and base_assessments == baseline_n * 8
    print(
        f"mlflow public path : {baseline_n:6d} cases {base_s:8.2f} s  {theirs:7.2f} ms/case   "
        f"counted {base_traces} traces, {base_assessments} assessments"
    )
    print(f"ratio              : ragexp is {theirs / ours:.1f}x cheaper per case")
    if not ok:
        print("MISSING DATA in ragexp's traces", file=sys.stderr)
    if not ok_base:
        print("note: MLflow's path lost data (see counts above)", file=sys.stderr)
    return ok


@contextlib.contextmanager
def pinned_server(folder: Path, workers: int) -> Iterator[str]:
    """``mlflow server`` over a SQLite store in ``folder``, on core ``SERVER_CORE`` only."""
    with mlflow_server(folder, workers=workers, prefix=("taskset", "-c", str(SERVER_CORE))) as url:
        yield url


def bench_pinned(n: int, workers: int) -> bool:
    """ragexp's writer against MLflow's public path in a pool, the server on its own core."""
    from ragexp.tracking.traces import SERVER_THREADS

    cores = os.sched_getaffinity(0)
    if not {CLIENT_CORE, SERVER_CORE} <= cores:
        print(
            f"\n== pinned server: needs cores {CLIENT_CORE} and {SERVER_CORE}, this process may use "
            f"{sorted(cores)}; skipped"
        )
        return True
    with (
        tempfile.TemporaryDirectory(prefix="ragexp-bench-traces-server-") as tmp,
        pinned_server(Path(tmp), workers) as url,
    ):
        os.sched_setaffinity(0, {CLIENT_CORE})
        try:
            print(
                f"\n== SQLite-backed tracking server {url}: server ({workers} worker{'s' * (workers > 1)}) "
                f"on core {SERVER_CORE}, this client on core {CLIENT_CORE}; {n} cases each side, "
                f"{SERVER_THREADS} in flight each side",
                flush=True,
            )
            experiment = f"bench-traces-pinned-{int(time.time())}"
            # Both sides first write a few untimed traces: the server's and the client's first
            # calls (imports, connections, caches) are not per-case cost.
            ragexp_path(url, experiment + "-warm-up", WARM_UP)
            mlflow_path(url, experiment + "-warm-up-mlflow", WARM_UP, SERVER_THREADS)
            ours_s, traces, assessments, _ = ragexp_path(url, experiment, n)
            ok = traces == n and assessments == n * 8
            print(
                f"{'ragexp writer':40}: {ours_s:7.2f} s  {ours_s / n * 1000:7.2f} ms/case   "
                f"counted {traces} traces, {assessments} assessments"
            )
            theirs_s, base_traces, base_assessments = mlflow_path(url, experiment + "-mlflow", n, SERVER_THREADS)
            print(
                f"{f'MLflow public path, {SERVER_THREADS} threads':40}: {theirs_s:7.2f} s  "
                f"{theirs_s / n * 1000:7.2f} ms/case   counted {base_traces} traces, {base_assessments} assessments"
            )
        finally:
            os.sched_setaffinity(0, cores)
    ratio = theirs_s / ours_s
    print(f"{'wall-time ratio':40}: ragexp is {ratio:.2f}x faster")
    if not ok:
        print("MISSING DATA in ragexp's traces", file=sys.stderr)
    if base_traces != n or base_assessments != n * 8:
        print("note: MLflow's path lost data (see counts above)", file=sys.stderr)
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", type=int, default=10_000, help="cases through ragexp's writer (SQLite)")
    parser.add_argument("--baseline-cases", type=int, default=200, help="cases through MLflow's public path")
    parser.add_argument("--server", default=os.environ.get("RAGEXP_TEST_MLFLOW_SERVER", "http://127.0.0.1:5055"))
    parser.add_argument("--server-cases", type=int, default=2000, help="cases through ragexp's writer (server)")
    parser.add_argument("--only", choices=["sqlite", "server", "pinned"], help="measure one store only")
    parser.add_argument("--pinned-cases", type=int, default=500, help="cases per side on the pinned server")
    parser.add_argument("--pinned-workers", type=int, default=1, help="workers of the pinned server")
    args = parser.parse_args()
    print(
        "One run, on a shared machine: other processes load the same cores, so ratios move between runs.",
        f"Load average {os.getloadavg()[0]:.2f} at start.",
    )
    ok = True
    if args.only in (None, "sqlite"):
        with tempfile.TemporaryDirectory(prefix="ragexp-bench-traces-") as tmp:
            uri = f"sqlite:///{tmp}/mlflow.db"
            from ragexp.tracking.store import Store

            Store(uri).experiment_id("warm-up", create=True)  # schema migrations are not per-case cost
            ok &= bench("SQLite store", uri, args.cases, args.baseline_cases)
    if args.server and args.only in (None, "server"):
        import httpx

        try:
            httpx.get(args.server.rstrip("/") + "/health", timeout=5).raise_for_status()
        except httpx.HTTPError as exc:
            print(f"\n== server {args.server} unreachable ({exc}); skipped")
        else:
            ok &= bench("PostgreSQL-backed tracking server", args.server, args.server_cases, args.baseline_cases // 2)
    if args.only in (None, "pinned"):
        ok &= bench_pinned(args.pinned_cases, args.pinned_workers)
    print(f"\nload average {os.getloadavg()[0]:.2f} at the end")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
