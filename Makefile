# Two commands for a newcomer:  `make run` (set up, then evaluate the embedded default)
# and `make test` (set up, then run the test suite). Both install from the lock file.
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
RAY_STAMP := $(VENV)/.installed-ray

.PHONY: setup setup-ray browser run demo test test-fast lint bench bench-compare bench-runs bench-http bench-python-systems bench-judge bench-k-memory bench-sweep bench-demo bench-traces bench-tracking bench-systems bench-draft bench-loader bench-custom-metrics bench-evidence bench-sequential bench-conversations bench-attribution bench-reasons bench-judge-drift bench-hops test-mlflow-next lock bench-shadow

# The first set-up takes a few minutes: each step says what it does, and uv shows its progress.
$(STAMP): requirements.lock pyproject.toml
	@echo "set-up 1/4: a virtual environment in $(VENV) (once; later commands reuse it)"
	$(PYTHON) -m venv $(VENV)
	@echo "set-up 2/4: installing uv, the installer"
	$(BIN)/python -m pip install --quiet --disable-pip-version-check uv==0.13.9
	@echo "set-up 3/4: $$(grep -c '^[a-z]' requirements.lock) pinned packages from requirements.lock (MLflow, Hydra, ragas: the longest step)"
	$(BIN)/uv pip sync --python $(BIN)/python --compile-bytecode requirements.lock
	@echo "set-up 4/4: ragexp itself"
	$(BIN)/uv pip install --python $(BIN)/python --no-deps --compile-bytecode --quiet -e .
	touch $(STAMP)
	@echo "set-up done: $(BIN)/ragexp is the command (or: source $(BIN)/activate, then ragexp)"

setup: $(STAMP)

# The optional extra ragexp[ray] (hydra/launcher=ray): requirements-ray.lock is requirements.lock
# with the same pins plus Ray and hydra-ray-launcher. `make test` needs it (tests/test_ray.py).
$(RAY_STAMP): $(STAMP) requirements-ray.lock
	$(BIN)/uv pip sync --python $(BIN)/python --compile-bytecode --quiet requirements-ray.lock
	$(BIN)/uv pip install --python $(BIN)/python --no-deps --compile-bytecode --quiet -e .
	touch $(RAY_STAMP)

setup-ray: $(RAY_STAMP)

run: setup
	$(BIN)/ragexp run

# The whole loop on the bundled sample system in its own store (./ragexp-demo): baseline,
# candidate, diff, gate (fails on purpose), report, and where to look in the MLflow UI.
demo: setup
	$(BIN)/ragexp demo

# The report test renders HTML in Debian's headless Chromium (with CJK fonts for the Chinese report).
browser:
	@command -v chromium >/dev/null 2>&1 || { apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium fonts-noto-cjk >/dev/null; }

# The whole suite (what CI runs), with the PostgreSQL-backed tracking server the tests need
# (scripts/test-suite.sh starts it unless RAGEXP_TEST_MLFLOW_SERVER names one, as .ci/run does).
# test-fast: the edit loop, every test not marked `system` (the end-to-end tests, each marked in
# its file), which needs neither the Ray extra, nor a browser, nor that server.
test: setup-ray browser
	scripts/test-suite.sh

# The edit loop keeps Python's bytecode (and pytest's assertion rewrites) in __pycache__, even
# where the environment turns that off, so a rerun skips recompiling every test module.
test-fast: setup
	env -u PYTHONDONTWRITEBYTECODE $(BIN)/python -m pytest -m "not system"

# The differential tests (tests marked `differential`) under the newest MLflow on the registry, in
# .venv-next/ (the lock, then that mlflow wheel with --no-deps); one line and exit 0 when none is newer.
test-mlflow-next: setup
	scripts/mlflow-next.sh

lint: setup
	$(BIN)/ruff check ragexp hydra_plugins tests
	$(BIN)/ruff format --check ragexp hydra_plugins tests
	$(BIN)/mypy

bench: setup
	$(BIN)/python tests/benchmarks/bench_run.py $(BENCH_ARGS)

# The tree before issue 45's paired comparison: bench-compare times diff and gate against it on
# the same store (BENCH_AGAINST= leaves that A/B out; BENCH_ARGS="--ab-only" times only it).
BENCH_AGAINST ?= f00a93f
bench-compare: setup
	$(BIN)/python tests/benchmarks/bench_compare.py $(if $(BENCH_AGAINST),--against $(BENCH_AGAINST)) $(BENCH_ARGS)

bench-runs: setup
	$(BIN)/python tests/benchmarks/bench_runs.py

bench-http: setup
	$(BIN)/python tests/benchmarks/bench_http.py

# system=python: 10 ms sync at 8 and async at 32 vs ideal; an instant function's per-case cost vs a plain loop.
bench-python-systems: setup
	$(BIN)/python tests/benchmarks/bench_python_systems.py

bench-judge: setup
	$(BIN)/python tests/benchmarks/bench_judge.py

bench-k-memory: setup
	$(BIN)/python tests/benchmarks/bench_k_memory.py

bench-sweep: setup-ray
	$(BIN)/python tests/benchmarks/bench_sweep.py

bench-demo: setup
	$(BIN)/python tests/benchmarks/bench_demo.py

bench-draft: setup
	$(BIN)/python tests/benchmarks/bench_draft.py

# Per-case cost of traces + assessments: ragexp's bulk writer vs MLflow's start_span + log_feedback,
# on SQLite and on the tracking server at $$RAGEXP_TEST_MLFLOW_SERVER (default http://127.0.0.1:5055).
bench-traces: setup
	$(BIN)/python tests/benchmarks/bench_traces.py

# Each tracking command (run 35 / 10,000 cases, runs, diff, gate, traces per case) through the direct
# path and through MLflow, side by side; BENCH_ARGS="--python /path/to/other/venv/bin/python" adds a column.
bench-tracking: setup
	$(BIN)/python tests/benchmarks/bench_tracking.py $(BENCH_ARGS)

bench-systems: setup
	$(BIN)/python tests/benchmarks/bench_systems.py

# load_dataset on 100,000 label-only and 100,000 replay cases, against parsing the lines alone.
bench-loader: setup
	$(BIN)/python tests/benchmarks/bench_loader.py

# metrics.custom: scoring a trivial Python metric on 100,000 cases vs a plain loop calling it, and
# what the metric adds to a 100,000-case run.
bench-custom-metrics: setup
	$(BIN)/python tests/benchmarks/bench_custom_metrics.py

# run --until-decided in simulation: 500 pairs, false-fail rate, cases evaluated and judge calls saved vs fixed-n.
bench-sequential: setup
	$(BIN)/python tests/benchmarks/bench_sequential.py

# A shadow replay in simulation: the planted stratum found by an anytime-valid stop, then PPI on labels.
bench-shadow: setup
	$(BIN)/python tests/benchmarks/bench_shadow.py

# Scoring 100,000 cases at K=10 on evidence anchored to documents, beside the id path, in one run.
bench-evidence: setup
	$(BIN)/python tests/benchmarks/bench_evidence.py

# diff --attribute: replaying 1,000 changed cases (50 ms generator, concurrency 32) vs the ideal replay time.
bench-attribution: setup
	$(BIN)/python tests/benchmarks/bench_attribution.py

# 200 conversations x 3 turns at 50 ms a turn, concurrency 32, against the ideal (turn latencies / concurrency).
bench-conversations: setup
	$(BIN)/python tests/benchmarks/bench_conversations.py

# Per-case rationales on 100,000 offline cases: this tree with them vs with them switched off, in one
# run (target: at most 10% more CPU); BENCH_ARGS="--against REV" compares with a git revision instead.
bench-reasons: setup
	$(BIN)/python tests/benchmarks/bench_reasons.py $(BENCH_ARGS)

# Per-hop scoring of 100,000 two-hop cases vs the single-hop path on the same cases, in one run
# (target: at most 1.3x the CPU).
bench-hops: setup
	$(BIN)/python tests/benchmarks/bench_hops.py $(BENCH_ARGS)

# A judge 0.08 more lenient on borderline answers, 500 cases, 60 canaries, 1,000 simulations: the drift
# seen on the canaries (power >= 0.95) and the canary-bridged delta's interval covering the true one (>= 93%).
bench-judge-drift: setup
	$(BIN)/python tests/benchmarks/bench_judge_drift.py $(BENCH_ARGS)

# Re-pin every dependency after editing pyproject.toml: requirements.lock, then the Ray extra's lock
# within its pins (-c), cloudpickle overridden as requirements-ray.overrides explains.
lock: setup
	$(BIN)/uv pip compile pyproject.toml --extra dev --python-version 3.11 --generate-hashes --quiet -o requirements.lock
	$(BIN)/uv pip compile pyproject.toml --extra dev --extra ray --python-version 3.11 --generate-hashes --quiet \
	  -c requirements.lock --override requirements-ray.overrides -o requirements-ray.lock
