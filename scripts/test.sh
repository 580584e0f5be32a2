#!/usr/bin/env bash
# Set up (if needed) and run the whole test suite on the TensorFlow and the JAX backend.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -x -k surgery`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/setup.sh

export TF_CPP_MIN_LOG_LEVEL=2
status=0
for backend in tensorflow jax; do
  echo "[test] KERAS_BACKEND=$backend"
  KERAS_BACKEND=$backend .venv/bin/python -m pytest -q "$@" || status=1
done
exit $status
