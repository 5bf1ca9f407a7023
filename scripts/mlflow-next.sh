#!/usr/bin/env bash
# The differential tests (ragexp's direct rows, trace rows, span JSON and reader answers against
# MLflow's own) under the newest MLflow on the registry, so a release is checked the day it can
# be installed (`make test-mlflow-next`, a CI step).
#
#   scripts/mlflow-next.sh [PYTEST ARGS...]
#
# A second virtualenv (.venv-next/) gets exactly requirements.lock, then the newest installable
# `mlflow` wheel over it with --no-deps: a new MLflow release reaches the registry before its
# mlflow-skinny/mlflow-tracing do, and only the package that changed should change. When nothing
# newer than the locked MLflow is installable it says so in one line and exits 0; otherwise the
# exit code is pytest's on `-m differential`.
# NEXT_VENV, PYTHON and UV override the virtualenv's folder, the interpreter it is made from and
# the uv binary (make setup installs one into .venv/).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${NEXT_VENV:-.venv-next}
PYTHON=${PYTHON:-python3.11}
UV=${UV:-.venv/bin/uv}

locked=$(sed -n 's/^mlflow==\([^ ]*\).*/\1/p' requirements.lock)
if [ -z "$locked" ]; then
  echo "mlflow-next: requirements.lock pins no mlflow" >&2
  exit 1
fi

if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv "$VENV"
fi
# Every run starts from the lock again: a wheel installed by an earlier run is replaced.
"$UV" pip sync --python "$VENV/bin/python" --quiet requirements.lock

wheels=$(mktemp -d)
trap 'rm -rf "$wheels"' EXIT
# pip picks the newest final release it can install here (pre-releases are not candidates).
if ! "$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --dest "$wheels" mlflow >"$wheels/pip.log" 2>&1; then
  echo "mlflow-next: could not ask the registry for mlflow ($(grep -m1 -i error "$wheels/pip.log" || tail -1 "$wheels/pip.log"))" >&2
  exit 1
fi
wheel=$(ls "$wheels"/mlflow-*.whl | head -1)
newest=$(basename "$wheel" | cut -d- -f2)
newer=$("$VENV/bin/python" -c 'import sys; from packaging.version import Version as V; print(int(V(sys.argv[1]) > V(sys.argv[2])))' "$newest" "$locked")
if [ "$newer" != 1 ]; then
  echo "mlflow-next: no MLflow newer than the locked $locked is installable (newest: $newest); nothing to check"
  exit 0
fi

"$UV" pip install --python "$VENV/bin/python" --no-deps --quiet "$wheel"
"$UV" pip install --python "$VENV/bin/python" --no-deps --quiet -e .
installed=$("$VENV/bin/python" -c 'from importlib.metadata import version; print(version("mlflow"))' 2>/dev/null)
echo "mlflow-next: differential tests under mlflow $installed (locked: $locked; its other packages as locked)"
"$VENV/bin/python" -m pytest -m differential -p no:cacheprovider "$@"
