#!/usr/bin/env bash
# modern_cnn.py's budget row with its defaults, one process per network and seed side by side (a GPU has room for
# all of them; each compiles and checks on its own CPU cores), each stopped after LIMIT seconds so that the results
# of the others still come back. Rows go to OUT/<network>_s<seed>.json; every process's log to OUT/all.log.
#   OUT=DIR DATA=folder-of-fashion-mnist-idx EPOCHS=10 LIMIT=450 bash benchmarks/modern_cnn_seeds.sh
#   NETWORKS="mobilenetv2" SEEDS="0 1 2" PY=python3 EXTRA="--quick" ...      (defaults: both networks, seeds 0 1 2)
# Merge the rows afterwards: python benchmarks/modern_cnn.py --merge OUT/*.json --out benchmarks/results --name NAME
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
: "${OUT:?set OUT to a folder for the results}"
mkdir -p "$OUT"
export KERAS_BACKEND="${KERAS_BACKEND:-jax}" XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=3
data=()
[[ -n "${DATA:-}" ]] && data=(--data-dir "$DATA")
for network in ${NETWORKS:-mobilenetv2 efficientnet}; do
  for seed in ${SEEDS:-0 1 2}; do
    timeout "${LIMIT:-450}" "${PY:-python}" benchmarks/modern_cnn.py ${data[@]+"${data[@]}"} --networks "$network" \
      --first-seed "$seed" --seeds 1 --epochs "${EPOCHS:-10}" --defaults --skip-magnitude --out "$OUT" \
      --name "${network}_s${seed}" ${EXTRA:-} >"$OUT/${network}_s${seed}.log" 2>&1 &
  done
done
wait
for log in "$OUT"/*_s?.log; do echo "== $(basename "$log")"; cat "$log"; done >"$OUT/all.log"
rm -f "$OUT"/*_s?.log "$OUT"/*_s?.md
grep -h "seed .* dense:\|seed .* budget:" "$OUT/all.log"
