#!/usr/bin/env bash
# Build the XLA test environment (its own venv, torch and torch-xla at matching
# versions) and run the tests marked `xla` on the CPU PJRT device.
#
#   bash scripts/test_xla.sh [VENV]          # default VENV=.venv-xla
#
# Cost (x86-64 Linux, 2 cores, measured): PyPI's torch 2.9.1 for x86-64 is the
# CUDA build, which imports only with its nvidia-* wheels: ~4 GB to download
# (torch 0.9 GB, nvidia-*/triton ~3 GB, torch-xla 0.08 GB), 7.1 GB on disk, 8 min
# to install (with torch and torch-xla already downloaded); the xla tests take
# ~5 min (their XLA compilations dominate). XLA_FIND_LINKS (a folder of pre-downloaded wheels) saves
# the download. XLA_TORCH_INDEX (e.g. https://download.pytorch.org/whl/cpu, where
# reachable) takes torch from that index instead: the CPU build, ~0.2 GB, no
# nvidia-* wheels (not exercised here: that host was unreachable). The venv is
# reused while its stamp is newer than this script and pyproject.toml.
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
  if [ -n "${XLA_TORCH_INDEX:-}" ]; then
    "$VENV/bin/pip" install -q "$TORCH_SPEC" --index-url "$XLA_TORCH_INDEX"
  fi
  "$VENV/bin/pip" install -q "${FL[@]}" "$TORCH_SPEC" "$TORCH_XLA_SPEC"
  "$VENV/bin/pip" install -q -e ".[test-core]" "$TORCH_SPEC"
  "$VENV/bin/python" -c "import torch, torch_xla; print('test-xla: torch', torch.__version__, '| torch_xla', torch_xla.__version__)"
  touch "$STAMP"
fi
export PJRT_DEVICE=CPU
[ -n "${XLA_BUILD_ONLY:-}" ] && exit 0
exec "$VENV/bin/python" -m pytest -q -m xla tests/xla "${@:2}"
