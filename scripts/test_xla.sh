#!/usr/bin/env bash
# Build the XLA test environment (its own venv, torch and torch-xla at matching
# versions) and run the tests marked `xla` on the CPU PJRT device.
#
#   bash scripts/test_xla.sh [VENV]          # default VENV=.venv-xla
#
# Cost (x86-64 Linux, measured): PyPI's torch 2.9.1 for x86-64 is the CUDA build,
# which imports only with its nvidia-* wheels, so the venv is ~4.5 GB on disk and
# ~3.9 GB to download (a few minutes at ~13 MB/s); the xla tests then take a few
# minutes on 2 cores. XLA_FIND_LINKS (a folder of pre-downloaded wheels) saves
# the download. The venv is reused while its stamp is newer than this script.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${1:-.venv-xla}
PY=${PYTHON:-python3}
TORCH_SPEC=${XLA_TORCH_SPEC:-torch==2.9.1}
TORCH_XLA_SPEC=${XLA_TORCH_XLA_SPEC:-torch-xla==2.9.0}
STAMP="$VENV/.installed"

if [ ! -f "$STAMP" ] || [ "$STAMP" -ot "$0" ] || [ "$STAMP" -ot pyproject.toml ]; then
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
  FL=()
  [ -n "${XLA_FIND_LINKS:-}" ] && FL=(--find-links "$XLA_FIND_LINKS")
  # torch first and pinned, so that trainperf's unpinned `torch>=2.4` keeps it.
  "$VENV/bin/pip" install -q "${FL[@]}" "$TORCH_SPEC" "$TORCH_XLA_SPEC"
  "$VENV/bin/pip" install -q -e ".[test]" "$TORCH_SPEC"
  "$VENV/bin/python" -c "import torch, torch_xla; print('test-xla: torch', torch.__version__, '| torch_xla', torch_xla.__version__)"
  touch "$STAMP"
fi
export PJRT_DEVICE=CPU
# the CUDA build of torch finds no GPU here; keep torch_xla on its CPU client.
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES-}
exec "$VENV/bin/python" -m pytest -q -m xla tests/xla "${@:2}"
