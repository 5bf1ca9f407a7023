#!/usr/bin/env bash
# A shared tracking server for a team (and for the tests): PostgreSQL from Debian's packages as
# the backend store, an MLflow server on 127.0.0.1 serving a local artifact root.
#
#   scripts/team-server.sh start    # prints the tracking URI (http://127.0.0.1:5055)
#   scripts/team-server.sh stop
#
# Point ragexp at it with MLFLOW_TRACKING_URI=http://127.0.0.1:5055 (or tracking.uri=...).
# Needs root for apt-get and for running PostgreSQL as its own user.
set -euo pipefail
PORT=${RAGEXP_MLFLOW_PORT:-5055}
STATE=${RAGEXP_SERVER_DIR:-$PWD/.team-server}
MLFLOW=${MLFLOW:-$PWD/.venv/bin/mlflow}
DB_URI=${RAGEXP_SERVER_DB_URI:-postgresql+psycopg2://ragexp:ragexp@127.0.0.1:5432/ragexp}
# Each request waits on PostgreSQL round trips (the GIL is free then), so more workers than
# cores keep 2 cores busy; each worker's connection pool covers its concurrent requests, so
# connections are reused rather than opened per request (MLflow's default keeps 5).
# 4 workers x (8 + 4) connections stays well under PostgreSQL's default max_connections (100).
WORKERS=${RAGEXP_SERVER_WORKERS:-4}
export MLFLOW_SQLALCHEMYSTORE_POOL_SIZE=${MLFLOW_SQLALCHEMYSTORE_POOL_SIZE:-8}
export MLFLOW_SQLALCHEMYSTORE_MAX_OVERFLOW=${MLFLOW_SQLALCHEMYSTORE_MAX_OVERFLOW:-4}

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
