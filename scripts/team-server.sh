#!/usr/bin/env bash
# A shared tracking server for a team (and for the tests): PostgreSQL from Debian's packages as
# the backend store, an MLflow server on 127.0.0.1 serving a local artifact root.
#
#   scripts/team-server.sh start    # prints the tracking URI (http://127.0.0.1:5055)
#   scripts/team-server.sh stop
#
# Point ragexp at it with MLFLOW_TRACKING_URI=http://127.0.0.1:5055 (or tracking.uri=...).
# RAGEXP_MLFLOW_PORT, RAGEXP_SERVER_DIR, RAGEXP_SERVER_DB_URI and RAGEXP_SERVER_WORKERS override
# the port, state folder, backend database and worker count (e.g. a second server for experiments).
# Needs root for apt-get and for running PostgreSQL as its own user.
set -euo pipefail
PORT=${RAGEXP_MLFLOW_PORT:-5055}
STATE=${RAGEXP_SERVER_DIR:-$PWD/.team-server}
MLFLOW=${MLFLOW:-$PWD/.venv/bin/mlflow}
DB_URI=${RAGEXP_SERVER_DB_URI:-postgresql+psycopg2://ragexp:ragexp@127.0.0.1:5432/ragexp}
# Workers: 4 instead of 2 (with a pool of 8+4 connections per worker, set through MLflow's
# MLFLOW_SQLALCHEMYSTORE_POOL_SIZE / _MAX_OVERFLOW, which pass through) made no difference
# beyond the noise for trace logging on 2 shared cores (docs/traces.md), so 2 it stays.
WORKERS=${RAGEXP_SERVER_WORKERS:-2}

as_postgres() { runuser -u postgres -- "$@"; }

start() {
  if ! command -v pg_ctlcluster >/dev/null 2>&1; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
  fi
  local version
  version=$(ls /usr/lib/postgresql | sort -n | tail -1)
  # stdout carries only the tracking URI (callers capture it): everything else goes elsewhere.
  pg_lsclusters -h | grep -q "^$version *main" || pg_createcluster "$version" main >/dev/null
  pg_ctlcluster "$version" main start >/dev/null 2>&1 || true   # already running is fine
  for _ in $(seq 1 30); do as_postgres psql -tAc "select 1" >/dev/null 2>&1 && break; sleep 1; done
  as_postgres psql -tAc "select 1 from pg_roles where rolname='ragexp'" | grep -q 1 ||
    as_postgres psql -qc "create role ragexp login password 'ragexp'"
  as_postgres psql -tAc "select 1 from pg_database where datname='ragexp'" | grep -q 1 ||
    as_postgres createdb -O ragexp ragexp
  mkdir -p "$STATE/artifacts"
  nohup "$MLFLOW" server --backend-store-uri "$DB_URI" --artifacts-destination "$STATE/artifacts" \
    --host 127.0.0.1 --port "$PORT" --workers "$WORKERS" >"$STATE/mlflow.log" 2>&1 &
  echo $! >"$STATE/mlflow.pid"
  for _ in $(seq 1 120); do
    kill -0 "$(cat "$STATE/mlflow.pid")" 2>/dev/null || break   # it died: no point in waiting
    if curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1; then
      echo "http://127.0.0.1:$PORT"
      return 0
    fi
    sleep 1
  done
  echo "mlflow server did not start; see $STATE/mlflow.log" >&2
  tail -20 "$STATE/mlflow.log" >&2
  return 1
}

stop() {
  if [ -f "$STATE/mlflow.pid" ]; then
    kill "$(cat "$STATE/mlflow.pid")" 2>/dev/null || true
    rm -f "$STATE/mlflow.pid"
  fi
  local version
  version=$(ls /usr/lib/postgresql 2>/dev/null | sort -n | tail -1)
  [ -n "$version" ] && pg_ctlcluster "$version" main stop 2>/dev/null || true
}

case "${1:-}" in
  start) start ;;
  stop) stop ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
