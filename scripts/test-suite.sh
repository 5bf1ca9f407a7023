#!/usr/bin/env bash
# The whole test suite with the services it needs, as CI runs it: the PostgreSQL-backed MLflow
# tracking server of scripts/team-server.sh, started here and stopped at the end, unless
# RAGEXP_TEST_MLFLOW_SERVER already names one (.ci/run starts it before `make test`) or a server
# already answers on the team port. Arguments go to pytest.
#
#   scripts/test-suite.sh            # what `make test` runs
#   scripts/test-suite.sh -k report  # a part of it, with the same server
#
# RAGEXP_TEAM_SERVER and RAGEXP_TEST_PYTHON name another server script and Python (the tests of
# this script use them).
set -euo pipefail
cd "$(dirname "$0")/.."
SERVER=${RAGEXP_TEAM_SERVER:-scripts/team-server.sh}
PYTHON=${RAGEXP_TEST_PYTHON:-.venv/bin/python}
PORT=${RAGEXP_MLFLOW_PORT:-5055}
if [ -z "${RAGEXP_TEST_MLFLOW_SERVER:-}" ]; then
  if curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1; then
    RAGEXP_TEST_MLFLOW_SERVER="http://127.0.0.1:$PORT"
    echo "tests: using the tracking server already answering at $RAGEXP_TEST_MLFLOW_SERVER" >&2
  else
    echo "tests: starting the shared tracking server (PostgreSQL backend): $SERVER start" >&2
    RAGEXP_TEST_MLFLOW_SERVER=$("$SERVER" start)
    trap '"$SERVER" stop || true' EXIT   # pytest's exit code stays the script's
  fi
  export RAGEXP_TEST_MLFLOW_SERVER
fi
echo "tests: shared tracking server $RAGEXP_TEST_MLFLOW_SERVER" >&2
"$PYTHON" -m pytest "$@"
