#!/usr/bin/env bash
# Issue 31's measurements on a lent NVIDIA machine, as one short run of the device tool.
# Random-weight GGUFs of real shapes are written there (the real files cannot travel): the demo
# model's shape in bf16, Q4_K_M and Q8_0, Qwen3-0.6B's in Q4_K_M and qwen3-moe-mini's (an MoE) in
# Q4_K_M; the quantized ones as random blocks (scripts/random_family_gguf.py). For each, greedy
# ids on the GPU are compared with the CPU's (where they differ, again with Burn's ops alone) and
# batch-1 decode is measured through `llaisys bench` (which counts kernel launches and
# host↔device transfers per decode step, and ranks kernels by device time with --kernel-times;
# the MoE's decode steps route their experts on the device: no readback before the logits),
# with decode steps replayed from their recorded graphs (the default) and without
# (LLAISYS_GPU_GRAPHS=off).
# The first file also gets prefill 512, aggregate throughput at 16 and 64 concurrent (and at 16
# with its kernels timed: the H200 spent about 45 ms a 16-row step against 9 a one-row one), greedy
# ids and decode with an f32 KV cache (the default, f16, runs everywhere else), and decode and
# 64 concurrent sampled: as Qwen2.5's generation defaults (top-k 20 with a repetition penalty:
# each row's 64 candidates found on the device) and with temperature 1 alone (OpenAI's default:
# 64 candidates and the row's mass found there) and with OpenAI's presence and frequency
# penalties (the same, and the logits of the tokens they change); in each the row is read only
# where they cannot decide, and the bench's readbacks a step say how often. The GPU's utilisation is sampled
# alongside (a host-bound path shows as a GPU mostly idle). While the files are written, the
# kernels' and the whole models' tests run on the GPU (f16 and bf16 there too: llvmpipe has f32 alone).
#
# Prepared here, before the call (see .library/device/README.md for the .gl packages):
#   cargo build --release -p llaisys-server --features wgpu
#   mkdir -p .gpu && strip -o .gpu/llaisys target/release/llaisys && xz -T2 .gpu/llaisys
#   (87 MB stripped, 16 MB as .xz: the tree that travels is limited to 64 MiB)
#   python3 scripts/random_family_gguf.py --donor-only models/qwen2.5-coder-0.5b-instruct.gguf .gpu/tokenizer.gguf
#   pip download --no-deps --only-binary=:all: gguf -d .gpu
#   optionally tests, each stripped and xz'd to .gpu/NAME.xz (NAME: layer_kernels, parity,
#   launches, replay, streams: a model's work on one stream, checked by CubeCL's streaming log): cargo test --release -p llaisys-model --features wgpu --test NAME --no-run
# On a fresh 2-core machine the release build takes about 31 minutes and the tests' about 20
# more (they rebuild the GPU stack with other features): start them first thing in a session.
# Run there (carry .gl and .gpu):  bash scripts/gpu-measure.sh   (about 7-9 minutes, and up to
# 3.5 more for the MoE file's grouping comparisons, which run last: a tight budget cuts those)
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
read -r -a models <<<"${MODELS:-r05-bf16:qwen2.5-0.5b:bf16 r05-q4km:qwen2.5-0.5b:q4_k_m r05-q8:qwen2.5-0.5b:q8_0 q3-q4km:qwen3-0.6b:q4_k_m moe-q4km:qwen3-moe-mini:q4_k_m}"
for m in "${models[@]}"; do
  IFS=: read -r name shape type <<<"$m"
  (python3 scripts/random_family_gguf.py .gpu/tokenizer.gguf "/tmp/$name.gguf.part" "$shape" "$type" \
    && mv "/tmp/$name.gguf.part" "/tmp/$name.gguf") >"/tmp/$name.gen.log" 2>&1 &
  gen[$name]=$!
done

nvidia-smi --query-gpu=timestamp,utilization.gpu,utilization.memory,clocks.sm,power.draw \
  --format=csv -lms 250 >"$OUT/util.csv" 2>&1 &
smi=$!

# The tests find their fixtures under the path they were built in.
[ -e /work/main ] || { mkdir -p /work && ln -s "$PWD" /work/main; }
for t in layer_kernels parity launches replay streams; do
  [ -f ".gpu/$t.xz" ] || continue
  step "test $t on vulkan"
  xz -dc ".gpu/$t.xz" >"/tmp/$t" && chmod +x "/tmp/$t"
  LLAISYS_TEST_DEVICE=vulkan timeout 150 "/tmp/$t" --test-threads 1
done

ids() {  # ids DEVICE MODEL [ARGS]: greedy ids of 32 tokens after "Hello"
  timeout 120 $BIN generate --model "$2" --device "$1" --prompt Hello --max-tokens 32 --ids "${@:3}"
}
first=1
for m in "${models[@]}"; do
  IFS=: read -r name shape type <<<"$m"
  M=/tmp/$name.gguf
  wait "${gen[$name]}"
  [ -f "$M" ] || { cat "/tmp/$name.gen.log"; continue; }
  step "$name ($shape $type): greedy ids, cpu then vulkan"
  ids cpu "$M" >"/tmp/$name.cpu.ids"
  ids vulkan "$M" >"/tmp/$name.gpu.ids"
  cat "/tmp/$name.cpu.ids" "/tmp/$name.gpu.ids"
  if cmp -s "/tmp/$name.cpu.ids" "/tmp/$name.gpu.ids"; then echo "$name: ids equal"; else
    echo "$name: IDS DIFFER"
    # The kernels' or not: Burn's ops alone, over the blocks dequantized at load.
    LLAISYS_GPU_KERNELS=off ids vulkan "$M" | tee "/tmp/$name.burn.ids"
    if cmp -s "/tmp/$name.cpu.ids" "/tmp/$name.burn.ids"; then echo "$name, Burn's ops: ids equal"; else echo "$name, Burn's ops: IDS DIFFER"; fi
  fi
  step "$name decode ${DECODE_TOKENS:-512} tokens (steps replayed from their recorded graphs)"
  timeout 90 $BIN bench --model "$M" --device vulkan --only decode --runs 3 --decode-tokens "${DECODE_TOKENS:-512}"
  step "$name decode ${DECODE_TOKENS:-512} tokens, graphs off (every launch from the host)"
  LLAISYS_GPU_GRAPHS=off timeout 90 $BIN bench --model "$M" --device vulkan --only decode --runs 2 --decode-tokens "${DECODE_TOKENS:-512}"
  step "$name decode, each kernel timed (graphs off: a replay launches nothing to time)"
  LLAISYS_GPU_GRAPHS=off timeout 60 $BIN bench --model "$M" --device vulkan --only decode --decode-tokens 32 --runs 1 --kernel-times
  if [ -n "${BURN:-}" ]; then
    step "$name decode with Burn's ops alone"
    LLAISYS_GPU_KERNELS=off timeout 90 $BIN bench --model "$M" --device vulkan --only decode --runs 1 --decode-tokens 128
  fi
  if [ "$type" = q4_k_m ] && [ "$shape" = qwen2.5-0.5b ]; then
    # Quantized blocks: past the few-row products' rows, each product dequantizes its matrix.
    step "$name throughput 16: the few-row products' 16 rows (the default), then 4 (past them, blocks dequantized each step)"
    timeout 90 $BIN bench --model "$M" --device vulkan --only throughput --concurrency 16 --runs 1
    LLAISYS_GPU_FUSED_ROWS=4 timeout 90 $BIN bench --model "$M" --device vulkan --only throughput --concurrency 16 --runs 1
  fi
  if [ "$shape" = qwen3-moe-mini ]; then
    # 4 rows of 8 experts each are 32 pairs, at most one an expert: a pair at a time on the
    # device; 16 and 64 rows grouped by expert on the device (at most 16 pairs an expert).
    step "$name throughput 4 (experts a pair at a time on the device), 16 and 64 (grouped on the device)"
    timeout 150 $BIN bench --model "$M" --device vulkan --only throughput --concurrency 4,16,64 --runs 1
    # Where the device's grouping stops paying (LLAISYS_GPU_MOE_GROUPED, pairs an expert): 16
    # rows grouped on the host, and a prefill of 512 (128 pairs an expert) on the device, each
    # against the default's figure above or below.
    step "$name throughput 16, grouped on the host"
    LLAISYS_GPU_MOE_GROUPED=0 timeout 90 $BIN bench --model "$M" --device vulkan --only throughput --concurrency 16 --runs 1
    step "$name prefill 512 on the host's grouping (the default), then on the device's"
    timeout 60 $BIN bench --model "$M" --device vulkan --only prefill --prefill 512 --runs 2
    LLAISYS_GPU_MOE_GROUPED=1000 timeout 60 $BIN bench --model "$M" --device vulkan --only prefill --prefill 512 --runs 2
  fi
  [ $first = 1 ] || continue
  first=0
  step "$name greedy ids, f32 KV cache (the default is f16)"
  ids vulkan "$M" --kv-dtype f32 | tee "/tmp/$name.f32.ids"
  if cmp -s "/tmp/$name.cpu.ids" "/tmp/$name.f32.ids"; then echo "$name f32 KV: ids equal"; else echo "$name f32 KV: IDS DIFFER"; fi
  step "$name decode, f32 KV cache"
  timeout 90 $BIN bench --model "$M" --device vulkan --kv-dtype f32 --only decode --runs 3 --decode-tokens "${DECODE_TOKENS:-512}"
  step "$name prefill 512"
  timeout 60 $BIN bench --model "$M" --device vulkan --only prefill --prefill 512 --runs 2
  step "$name throughput 16, 64"
  timeout 150 $BIN bench --model "$M" --device vulkan --only throughput --concurrency 16,64 --runs 1
  step "$name throughput 16 and 64 with the few-row products at 4 rows (past them Burn's matmul, blocks dequantized each step), then at 64 (the default is 16)"
  LLAISYS_GPU_FUSED_ROWS=4 timeout 150 $BIN bench --model "$M" --device vulkan --only throughput --concurrency 16,64 --runs 1
  LLAISYS_GPU_FUSED_ROWS=64 timeout 150 $BIN bench --model "$M" --device vulkan --only throughput --concurrency 64 --runs 1
  step "$name throughput 16, kernels timed one at a time (graphs off, so every launch is timed): where a 16-row step's time goes"
  LLAISYS_GPU_GRAPHS=off timeout 90 $BIN bench --model "$M" --device vulkan --only throughput --concurrency 16 --runs 1 --kernel-times
  step "$name sampled as Qwen2.5's generation defaults (top-k 20, top-p 0.8, repetition penalty 1.05: 64 candidates on the device): decode, then 64 concurrent"
  QWEN=(--temperature 0.7 --top-k 20 --top-p 0.8 --repetition-penalty 1.05)
  timeout 90 $BIN bench --model "$M" --device vulkan --only decode --runs 2 --decode-tokens 256 "${QWEN[@]}"
  timeout 120 $BIN bench --model "$M" --device vulkan --only throughput --concurrency 64 --runs 1 "${QWEN[@]}"
  step "$name sampled with temperature 1 alone (candidates and mass on the device): decode, then 64 concurrent"
  timeout 90 $BIN bench --model "$M" --device vulkan --only decode --runs 2 --decode-tokens 256 --temperature 1
  timeout 120 $BIN bench --model "$M" --device vulkan --only throughput --concurrency 64 --runs 1 --temperature 1
  step "$name sampled with OpenAI's penalties, no top-k (candidates, mass and the penalised tokens' logits on the device): decode, then 64 concurrent"
  OPENAI=(--temperature 1 --presence-penalty 0.5 --frequency-penalty 0.3)
  timeout 60 $BIN bench --model "$M" --device vulkan --only decode --runs 2 --decode-tokens 256 "${OPENAI[@]}"
  timeout 90 $BIN bench --model "$M" --device vulkan --only throughput --concurrency 64 --runs 1 "${OPENAI[@]}"
done
step done
kill $smi
