#!/usr/bin/env bash
# Set up (if needed) and run the demo: train a group-sparse MLP on the bundled
# DIGITS data, then print accuracy, sparsity, kept features and neurons.
# Extra arguments go to `keras-group-lasso demo` (see --help).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/setup.sh
export TF_CPP_MIN_LOG_LEVEL=2
exec .venv/bin/keras-group-lasso demo "$@"
