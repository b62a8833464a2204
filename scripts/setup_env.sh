#!/usr/bin/env bash
# Create the project's virtual environment and install trainperf into it.
#
# torch: an interpreter that already has torch (a GPU machine with a CUDA build,
# say) keeps it: the venv is created with --system-site-packages and pip sees
# the requirement satisfied. Otherwise TORCH_SPEC (default torch==2.13.0, which
# pip takes from a local CPU wheel where one lies in its find-links) is
# installed first, so that the unpinned requirement never pulls a multi-GB CUDA
# build. Set TORCH_INDEX to a wheel index (e.g. the CPU index of pytorch.org)
# to choose the build explicitly.
set -euo pipefail
VENV=${1:-.venv}
PY=${PYTHON:-python3}
EXTRAS=${EXTRAS:-test}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}

if [ ! -x "$VENV/bin/python" ]; then
  if "$PY" -c "import torch" >/dev/null 2>&1; then
    echo "setup: keeping the torch already installed for $PY ($("$PY" -c 'import torch; print(torch.__version__)'))"
    "$PY" -m venv --system-site-packages "$VENV"
  else
    "$PY" -m venv "$VENV"
  fi
fi
if ! "$VENV/bin/python" -c "import torch" >/dev/null 2>&1; then
  echo "setup: installing $TORCH_SPEC"
  if [ -n "${TORCH_INDEX:-}" ]; then
    "$VENV/bin/pip" install -q "$TORCH_SPEC" --index-url "$TORCH_INDEX"
  else
    "$VENV/bin/pip" install -q "$TORCH_SPEC"
  fi
fi
# Keep the torch that is there (CPU or CUDA build): the extras' requirements must not replace it.
"$VENV/bin/python" -c "import torch; print('torch==' + torch.__version__.split('+')[0])" > "$VENV/torch-pin.txt"
"$VENV/bin/pip" install -q -e ".[$EXTRAS]" -c "$VENV/torch-pin.txt"
"$VENV/bin/python" -c "import torch, trainperf; print('setup: torch', torch.__version__, '| trainperf ready')"
