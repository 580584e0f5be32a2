#!/usr/bin/env bash
# Set up (if needed) and run the whole test suite (or, with `--quick`, a cross-section of it) on the TensorFlow,
# JAX and PyTorch backends.
# The backends run side by side (most tests are small models whose time is Python and tracing, one
# core each); each backend's output is printed when it finishes. TEST_SERIAL=1 runs them one after the other.
# Each backend's log ends with its 12 slowest tests (where the time goes).
# TEST_BACKENDS="tensorflow jax" picks backends (PyTorch is left out when setup left it out: SETUP_TORCH=0).
# `--quick` runs only the tests marked `quick` (pytest's `-m quick`): a cross-section of every feature (penalties,
# Proximal, budgets, report, monitor, surgery on a few model families, export, scikit-learn, CLI) on the same
# backends, in about 2 minutes on 2 otherwise idle cores; the whole suite still runs every one of them.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -x -k surgery` or `bash scripts/test.sh --quick -x`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
args=()
for arg in "$@"; do
  if [[ "$arg" == "--quick" ]]; then args+=(-m quick); else args+=("$arg"); fi
done
set -- ${args[@]+"${args[@]}"}
source scripts/setup.sh

export TF_CPP_MIN_LOG_LEVEL=2
# JAX runs most test models op by op, compiling each op for each new shape (the random architectures draw many):
# XLA's CPU code built without LLVM's optimizations compiles in about two thirds of the time (the tests check
# values, not speed; benchmarks/ do not use this). A value the caller set is kept.
jax_flags="${XLA_FLAGS:---xla_backend_optimization_level=0}"
# Side by side, three processes share the cores: each computes its ops on one thread (a thread pool per process
# of as many threads as cores spins and switches more than it computes here; measured on 2 cores, three test files
# per backend side by side: 245 s -> 229 s of wall time, every backend faster). Values the caller set are kept.
if [[ "${TEST_SERIAL:-0}" != "1" ]]; then
  export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" TF_NUM_INTRAOP_THREADS="${TF_NUM_INTRAOP_THREADS:-1}"
  [[ -n "${XLA_FLAGS:-}" ]] || jax_flags="$jax_flags --xla_cpu_multi_thread_eigen=false"
fi
# Tests that start JAX processes of their own (tests/test_distribution.py) give them these flags from any leg.
export TEST_JAX_XLA_FLAGS="$jax_flags"
xla_flags_for() { if [[ "$1" == "jax" ]]; then echo "$jax_flags"; else echo "${XLA_FLAGS:-}"; fi; }
if [[ -n "${TEST_BACKENDS:-}" ]]; then
  read -r -a backends <<<"$TEST_BACKENDS"
elif .venv/bin/python -c "import torch" >/dev/null 2>&1; then
  backends=(tensorflow jax torch)
else
  echo "[test] PyTorch is not installed (SETUP_TORCH=0): testing TensorFlow and JAX only"
  backends=(tensorflow jax)
fi
# Tests marked `turns` (many cases alike: model families, documentation blocks) deal their cases out over these
# backends, each case on one of them (tests/conftest.py); TEST_TURNS="" runs every case on every backend. PyTorch's
# leg is the shortest (eager steps of small models are quick): it is named four times and takes four shares.
turns=("${backends[@]}")
if [[ " ${backends[*]} " == *" torch "* ]]; then turns+=(torch torch torch); fi
export TEST_TURNS="${TEST_TURNS-${turns[*]}}"
status=0
if [[ "${TEST_SERIAL:-0}" == "1" ]]; then
  for backend in "${backends[@]}"; do
    echo "[test] KERAS_BACKEND=$backend"
    XLA_FLAGS="$(xla_flags_for "$backend")" KERAS_BACKEND=$backend .venv/bin/python -m pytest -q "$@" || status=1
  done
  exit $status
fi

logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
declare -A pids
for backend in "${backends[@]}"; do
  XLA_FLAGS="$(xla_flags_for "$backend")" KERAS_BACKEND=$backend .venv/bin/python -m pytest -q -p no:cacheprovider --durations=12 "$@" \
    >"$logs/$backend.log" 2>&1 &
  pids[$backend]=$!
done
for backend in "${backends[@]}"; do
  code=0
  wait "${pids[$backend]}" || code=$?
  echo "[test] KERAS_BACKEND=$backend (exit status $code)"
  cat "$logs/$backend.log"
  [[ $code -eq 0 ]] || status=1
done
exit $status
