#!/bin/sh
# The worker's Python environment, as the image has it: docker/install-worker.sh PREFIX VARIANT [SOURCE]
#   PREFIX   a new virtualenv there (the image: /opt/venv)
#   VARIANT  gpu: PyPI's torch (itself a CUDA build: its nvidia-* wheels carry the CUDA runtime, so the
#                 base image needs none; the host's driver comes with the NVIDIA container toolkit) and
#                 the GPU gauges (nvidia-ml-py)
#            cpu: the same torch and the int8 runtimes (OpenVINO, onnxruntime): int8 is `auto` on a CPU
#   SOURCE   the checkout or unpacked sdist to install (default .)
# Every package at the version the suite passed on (constraints.txt). The Dockerfile runs this script, and
# CI runs it into a prefix of its own, then runs the worker from there (tools/check_install.py).
set -eu
PREFIX=$1
VARIANT=${2:-gpu}
SOURCE=${3:-.}
PYTHON=${PYTHON:-python3}
case "$VARIANT" in
  gpu) EXTRAS=gpu ;;
  cpu) EXTRAS=int8 ;;
  *) echo "install-worker.sh: VARIANT must be gpu or cpu, not $VARIANT" >&2; exit 2 ;;
esac
"$PYTHON" -m venv "$PREFIX"
"$PREFIX/bin/python" -m pip install --quiet --upgrade pip
# torch first, alone: the largest download, and the one other wheels must agree with
"$PREFIX/bin/python" -m pip install --quiet -c "$SOURCE/constraints.txt" torch
"$PREFIX/bin/python" -m pip install --quiet -c "$SOURCE/constraints.txt" "$SOURCE[$EXTRAS]"
# The CPU variant keeps torch's CUDA libraries (PyPI's torch imports them even on a CPU: without them
# `import torch` fails) but not Triton, the compiler of GPU kernels, which nothing on a CPU loads (0.7 GB).
if [ "$VARIANT" = cpu ]; then
  "$PREFIX/bin/python" -m pip uninstall --quiet --yes triton
fi
"$PREFIX/bin/embedstream" --version
