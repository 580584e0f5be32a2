#!/usr/bin/env bash
# Creates ./.venv with the package, the Keras backends (TensorFlow, JAX, PyTorch) and the test tools.
# Safe to run again: it only installs what is missing. Sourced by demo.sh and test.sh.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv with $($PYTHON --version)"
  "$PYTHON" -m venv .venv
  .venv/bin/python -m pip install --quiet --upgrade pip
fi

# A machine with an NVIDIA driver gets the full TensorFlow (GPU); others the smaller CPU build.
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi >/dev/null 2>&1; then
  TF_EXTRA="tensorflow"
else
  TF_EXTRA="tensorflow-cpu"
fi
# PyTorch (the third Keras backend the tests run on) is its own extra: several GB with its CUDA
# libraries. SETUP_TORCH=0 leaves it out (scripts/test.sh then runs TensorFlow and JAX only).
# With it comes the benchmarks extra (matplotlib; Torch-Pruning, which needs PyTorch, for benchmarks/peers_cnn.py).
EXTRAS="$TF_EXTRA,test,docs"  # docs: mkdocs + mkdocstrings, so the tests can build the API reference
if [ "${SETUP_TORCH:-1}" != "0" ]; then EXTRAS="$EXTRAS,torch,benchmarks"; fi
stamp=".venv/.keras-group-lasso-installed-${EXTRAS//,/-}-$(cksum pyproject.toml | cut -d' ' -f1)"
if [ ! -f "$stamp" ]; then
  echo "[setup] installing keras-group-lasso[$EXTRAS] (first run takes a few minutes)"
  .venv/bin/python -m pip install --quiet -e ".[$EXTRAS]"
  # KerasHub, whose models the tests build from their constructors. Its own requirements name
  # tensorflow-text, which brings the full TensorFlow beside tensorflow-cpu; no test uses KerasHub's
  # text tokenizers, so it is installed without it (pip then warns that tensorflow-text is missing).
  .venv/bin/python -m pip install --quiet --no-deps "keras-hub==0.32.*"
  .venv/bin/python -m pip install --quiet regex rich "kagglehub!=1.0.1" "kagglesdk==0.1.28" sentencepiece tokenizers
  touch "$stamp"
fi

# Fashion-MNIST comes from a Debian package (no download at run time); optional. It needs root (or
# sudo without a password); SETUP_APT=0 skips this step.
if [ "${SETUP_APT:-1}" != "0" ] && [ ! -d /usr/share/datasets/fashion-mnist ] && command -v apt-get >/dev/null 2>&1; then
  apt_hint="the Fashion-MNIST examples and benchmarks will say so; as root, 'apt-get install dataset-fashion-mnist' adds it, SETUP_APT=0 skips this step"
  if [ "$(id -u)" = "0" ]; then SUDO=""; elif command -v sudo >/dev/null 2>&1; then SUDO="sudo -n"; else SUDO="skip"; fi
  if [ "$SUDO" = "skip" ]; then
    echo "[setup] note: not root and no sudo, so the Debian package dataset-fashion-mnist is not installed ($apt_hint)"
  else
    echo "[setup] installing the Debian package dataset-fashion-mnist${SUDO:+ (sudo -n: no password prompt)}"
    ($SUDO apt-get update -qq && $SUDO apt-get install -y -qq dataset-fashion-mnist >/dev/null) \
      || echo "[setup] warning: could not install the Debian package dataset-fashion-mnist ($apt_hint)"
  fi
fi
