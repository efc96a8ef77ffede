#!/usr/bin/env bash
# Regenerates scripts/constraints-cpu.txt: the exact versions scripts/setup.sh installs on CPU machines.
# Needs uv (`pip install uv`); resolves for Python 3.11 on x86_64 Linux with the torch CPU wheel in $WHEELS.
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=${WHEELS:-/opt/wheels}
req=$(mktemp); out=$(mktemp); trap 'rm -f "$req" "$out"' EXIT
printf -- '-e .[dev]\nvllm-cpu==0.32.0\ntransformers>=5.16.1,<5.20\n' > "$req"
uv pip compile "$req" --find-links "$WHEELS" --python-version 3.11 --python-platform x86_64-manylinux_2_28 \
  --no-header --no-annotate -o "$out"
{ sed -n 1,3p scripts/constraints-cpu.txt; grep -E '^[A-Za-z0-9]' "$out" | grep -v -E '^(-e |torch==)'; } > "$out.new"
mv "$out.new" scripts/constraints-cpu.txt
echo "scripts/constraints-cpu.txt: $(grep -c '==' scripts/constraints-cpu.txt) pins"
