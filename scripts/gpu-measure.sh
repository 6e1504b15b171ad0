#!/usr/bin/env bash
# Issue 31's measurements on a lent NVIDIA machine, as one short run of the device tool.
# Random-weight GGUFs of real shapes are written there (the real files cannot travel): by default
# the demo model's shape in bf16 and Q4_K_M, qwen3-moe-mini's (an MoE) in Q4_K_M and the demo
# shape in Q8_0; the quantized ones as random blocks (scripts/random_family_gguf.py). A session
# is lent 15 minutes of device time, its machine's start included, so the run goes in phases,
# most wanted first, and a run cut by its limit still brings back every figure before the cut:
#  1. every file: greedy ids on the GPU against the CPU's (where they differ, again with Burn's
#     ops alone, to tell the kernels from the rest), then batch-1 decode through `llaisys bench`
#     (which counts kernel launches and host<->device transfers a decode step), its steps
#     replayed from their recorded graphs (the default);
#  2. the first file in full: decode with graphs off (every launch from the host) and with each
#     kernel timed, prefill 512, aggregate throughput at 16 and 64 concurrent (and at 16 with
#     its kernels timed), 64 concurrent sampled as Qwen2.5's generation defaults (top-k 20 with
#     a repetition penalty: each row's 64 candidates found on the device);
#  3. the test binaries that travel, on the GPU (f16 and bf16 there too: llvmpipe has f32
#     alone), each within TEST_TIMEOUT seconds (default 100);
#  4. the MoE file at 4 (experts a pair at a time), 16 and 64 concurrent (grouped on the device);
#  5. the first file with an f32 KV cache (greedy ids and decode; the default is f16), with the
#     few-row products at 4 rows (the default 16), and sampled with temperature 1 alone and with
#     OpenAI's presence and frequency penalties; the bench's readbacks a step say how often a
#     row is read whole.
# The GPU's utilisation is sampled alongside (a host-bound path shows as a GPU mostly idle).
#
# Prepared here by scripts/gpu-prepare.sh: `build` (the stripped binary and test binaries, the
# tokenizer, the gguf wheel, the Vulkan loader's packages: about 35 minutes on 2 cores, so start
# it as soon as a session's device status says a GPU is lent), then `slim` just before the call
# (the tracked fixtures alone are over 50 of the tool's 64 MiB) and `restore` right after.
# Other test binaries (parity, launches, streams) run too where .gpu/NAME.xz travels.
# Run there (carry .gl and .gpu): bash scripts/gpu-measure.sh (its files go to $OUT, the tool's
# folder), with a timeout of about 540 s.
# Environment: MODELS (NAME:SHAPE:TYPE ..., the first measured in full), DECODE_TOKENS (default
# 512: the GPU raises its clocks from 345 MHz over the first second or two of work, so a short
# decode is measured partly at low clocks), BURN=1 adds batch-1 decode with Burn's ops alone
# (LLAISYS_GPU_KERNELS=off, the same binary). Every figure lands in $OUT/log.txt, the GPU's
# utilisation and clocks in $OUT/util.csv.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/gpu-measure}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/log.txt") 2>&1
BIN=/tmp/llaisys
xz -dc .gpu/llaisys.xz >$BIN && chmod +x $BIN
for f in .gl/*.deb; do dpkg -x "$f" /; done
ldconfig
icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
[ -f "$icd" ] && export VK_DRIVER_FILES=$icd
egl=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
[ -f "$egl" ] && export __EGL_VENDOR_LIBRARY_FILENAMES=$egl
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv
lscpu | grep -E 'Model name|^CPU\(s\)'
step() { echo; echo "=== $(date +%T) $*"; }

python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu/gguf-*.whl
export PYTHONPATH=/tmp/site
declare -A gen
read -r -a models <<<"${MODELS:-r05-bf16:qwen2.5-0.5b:bf16 r05-q4km:qwen2.5-0.5b:q4_k_m moe-q4km:qwen3-moe-mini:q4_k_m r05-q8:qwen2.5-0.5b:q8_0}"
for m in "${models[@]}"; do
  IFS=: read -r name shape type <<<"$m"
  (python3 scripts/random_family_gguf.py .gpu/tokenizer.gguf "/tmp/$name.gguf.part" "$shape" "$type" \
    && mv "/tmp/$name.gguf.part" "/tmp/$name.gguf") >"/tmp/$name.gen.log" 2>&1 &
  gen[$name]=$!
done

nvidia-smi --query-gpu=timestamp,utilization.gpu,utilization.memory,clocks.sm,power.draw \
  --format=csv -lms 250 >"$OUT/util.csv" 2>&1 &
smi=$!

ids() {  # ids DEVICE MODEL [ARGS]: greedy ids of 32 tokens after "Hello"
  timeout 120 $BIN generate --model "$2" --device "$1" --prompt Hello --max-tokens 32 --ids "${@:3}"
}
ready() {  # ready NAME: wait for its file; false (and its log shown) where it was not written
  wait "${gen[$1]}" 2>/dev/null
  [ -f "/tmp/$1.gguf" ] || { cat "/tmp/$1.gen.log"; return 1; }
}
compare() {  # compare NAME: greedy ids on the CPU and the GPU (and Burn's ops alone where they differ)
  local name=$1 M=/tmp/$1.gguf
  step "$name: greedy ids, cpu then vulkan"
  ids cpu "$M" >"/tmp/$name.cpu.ids"
  ids vulkan "$M" >"/tmp/$name.gpu.ids"
  cat "/tmp/$name.cpu.ids" "/tmp/$name.gpu.ids"
  if cmp -s "/tmp/$name.cpu.ids" "/tmp/$name.gpu.ids"; then echo "$name: ids equal"; else
    echo "$name: IDS DIFFER"
    # The kernels' or not: Burn's ops alone, over the blocks dequantized at load.
    LLAISYS_GPU_KERNELS=off ids vulkan "$M" | tee "/tmp/$name.burn.ids"
    if cmp -s "/tmp/$name.cpu.ids" "/tmp/$name.burn.ids"; then echo "$name, Burn's ops: ids equal"; else echo "$name, Burn's ops: IDS DIFFER"; fi
  fi
}
decode() {  # decode NAME RUNS [ARGS]: batch-1 decode, steps replayed from their recorded graphs
  step "$1 decode ${DECODE_TOKENS:-512} tokens ${*:3}"
  timeout 90 $BIN bench --model "/tmp/$1.gguf" --device vulkan --only decode --runs "$2" --decode-tokens "${DECODE_TOKENS:-512}" "${@:3}"
}
# Phases, most wanted first: a run cut by its limit still brings back what came before.
# 1. Every file: greedy ids against the CPU's, then batch-1 decode.
for m in "${models[@]}"; do
  IFS=: read -r name shape type <<<"$m"
  ready "$name" || continue
  compare "$name"
  decode "$name" 3
done
# 2. The first file in full: where a step's time goes, prefill, concurrency.
IFS=: read -r name shape type <<<"${models[0]}"
M=/tmp/$name.gguf
if ready "$name"; then
  step "$name decode, graphs off (every launch from the host)"
  LLAISYS_GPU_GRAPHS=off timeout 90 $BIN bench --model "$M" --device vulkan --only decode --runs 2 --decode-tokens "${DECODE_TOKENS:-512}"
  step "$name decode, each kernel timed (graphs off: a replay launches nothing to time)"
  LLAISYS_GPU_GRAPHS=off timeout 60 $BIN bench --model "$M" --device vulkan --only decode --decode-tokens 32 --runs 1 --kernel-times
  step "$name prefill 512"
  timeout 60 $BIN bench --model "$M" --device vulkan --only prefill --prefill 512 --runs 2
  step "$name throughput 16, 64"
  timeout 150 $BIN bench --model "$M" --device vulkan --only throughput --concurrency 16,64 --runs 1
  step "$name throughput 16, kernels timed one at a time (graphs off): where a 16-row step's time goes"
  LLAISYS_GPU_GRAPHS=off timeout 90 $BIN bench --model "$M" --device vulkan --only throughput --concurrency 16 --runs 1 --kernel-times
  step "$name sampled as Qwen2.5's generation defaults (top-k 20, top-p 0.8, repetition penalty 1.05): 64 concurrent"
  timeout 120 $BIN bench --model "$M" --device vulkan --only throughput --concurrency 64 --runs 1 \
    --temperature 0.7 --top-k 20 --top-p 0.8 --repetition-penalty 1.05
fi
# 3. The test binaries that travel, on the GPU (f16 and bf16 there too: llvmpipe has f32 alone).
# They find their fixtures under the path they were built in.
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
for t in layer_kernels parity launches replay streams; do
  [ -f ".gpu/$t.xz" ] || continue
  step "test $t on vulkan"
  xz -dc ".gpu/$t.xz" >"/tmp/$t" && chmod +x "/tmp/$t"
  LLAISYS_TEST_DEVICE=vulkan timeout "${TEST_TIMEOUT:-100}" "/tmp/$t" --test-threads 1
done

# 4. The MoE file's concurrency (4 rows: a pair at a time; 16 and 64: grouped on the device).
for m in "${models[@]}"; do
  IFS=: read -r name shape type <<<"$m"
  [ "$shape" = qwen3-moe-mini ] && ready "$name" || continue
  step "$name throughput 4, 16 and 64"
  timeout 150 $BIN bench --model "/tmp/$name.gguf" --device vulkan --only throughput --concurrency 4,16,64 --runs 1
done
# 5. Settings against their defaults, as time allows.
IFS=: read -r name shape type <<<"${models[0]}"
if ready "$name"; then
  step "$name greedy ids and decode, f32 KV cache (the default is f16)"
  ids vulkan "$M" --kv-dtype f32 | tee "/tmp/$name.f32.ids"
  if cmp -s "/tmp/$name.cpu.ids" "/tmp/$name.f32.ids"; then echo "$name f32 KV: ids equal"; else echo "$name f32 KV: IDS DIFFER"; fi
  decode "$name" 2 --kv-dtype f32
  step "$name throughput 16 and 64 with the few-row products at 4 rows (the default is 16)"
  LLAISYS_GPU_FUSED_ROWS=4 timeout 150 $BIN bench --model "$M" --device vulkan --only throughput --concurrency 16,64 --runs 1
  step "$name sampled with temperature 1 alone, then OpenAI's penalties: 64 concurrent"
  timeout 120 $BIN bench --model "$M" --device vulkan --only throughput --concurrency 64 --runs 1 --temperature 1
  timeout 90 $BIN bench --model "$M" --device vulkan --only throughput --concurrency 64 --runs 1 \
    --temperature 1 --presence-penalty 0.5 --frequency-penalty 0.3
fi
[ -n "${BURN:-}" ] && { step "$name decode with Burn's ops alone"; LLAISYS_GPU_KERNELS=off timeout 90 $BIN bench --model "$M" --device vulkan --only decode --runs 1 --decode-tokens 128; }
step done
kill $smi
