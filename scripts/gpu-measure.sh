#!/usr/bin/env bash
# Issue 31's measurements on a lent NVIDIA machine (one short run of the device tool): a
# random-weight GGUF of the demo shape in bf16 is written there (the real file cannot travel),
# greedy ids on the GPU are compared with the CPU's, then batch-1 decode, prefill 512 and
# aggregate throughput at 16 and 64 concurrent are measured through `llaisys bench` (which counts
# kernel launches and host↔device transfers per decode step, and ranks kernels by device time with
# --kernel-times), with the GPU's utilisation sampled alongside (a host-bound path shows as a GPU
# mostly idle).
#
# Prepared here, before the call (see .library/device/README.md for the .gl packages):
#   cargo build --release -p llaisys-server --features wgpu --target-dir target/gpu
#   mkdir -p .gpu && strip -o .gpu/llaisys target/gpu/release/llaisys && xz -T2 .gpu/llaisys
#   (87 MB stripped, 16 MB as .xz: the tree that travels is limited to 64 MiB)
#   python3 scripts/random_family_gguf.py --donor-only models/qwen2.5-coder-0.5b-instruct.gguf .gpu/tokenizer.gguf
#   pip download --no-deps --only-binary=:all: gguf -d .gpu
#   optionally the kernels' tests: cargo test -p llaisys-model --features wgpu --test layer_kernels
#   --no-run, then strip that binary and xz it to .gpu/layer_kernels.xz
# Run there (carry .gl and .gpu):  bash scripts/gpu-measure.sh [NAME[:all|:decode|:burn]...]
# Each NAME is a build carried as .gpu/NAME.xz (default llaisys:all llaisys:burn); `decode`
# measures only batch-1 decode (a baseline rerun on the same machine), `burn` the same with
# LLAISYS_GPU_KERNELS=off (Burn's ops instead of llaisys' CubeCL kernels, the same binary), `all`
# adds the kernel times, prefill 512 and throughput. The CPU reference runs .gpu/llaisys.xz.
# DECODE_TOKENS (default 128) sets the batch-1 decode's length: the GPU raises its clocks over
# the first second or two of work (345 MHz idle, 1,980 at full speed), so a short decode is
# measured partly at low clocks; alternate builds (new:decode old:decode new:decode ...) to
# compare them. Every figure lands in $OUT/log.txt and $OUT/util.csv, the clocks with it.
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

python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu/gguf-*.whl
export PYTHONPATH=/tmp/site
M=/tmp/r05-bf16.gguf
time python3 scripts/random_family_gguf.py .gpu/tokenizer.gguf $M qwen2.5-0.5b bf16

nvidia-smi --query-gpu=timestamp,utilization.gpu,utilization.memory,clocks.sm,power.draw \
  --format=csv -lms 250 >"$OUT/util.csv" 2>&1 &
smi=$!

step() { echo; echo "=== $(date +%T) $*"; }
step cpu reference
timeout 60 $BIN generate --model $M --device cpu --prompt Hello --max-tokens 32 --ids
specs=("$@")
[ ${#specs[@]} -gt 0 ] || specs=(llaisys:all llaisys:burn)
for spec in "${specs[@]}"; do
  name=${spec%%:*} what=${spec#*:}
  if [ "$what" = burn ]; then export LLAISYS_GPU_KERNELS=off; else unset LLAISYS_GPU_KERNELS; fi
  BIN=/tmp/$name
  xz -dc ".gpu/$name.xz" >"$BIN" && chmod +x "$BIN" || continue
  dev=
  for d in ${DEVICES:-vulkan gl}; do
    step "$name $d generate"
    if timeout 120 $BIN generate --model $M --device "$d" --prompt Hello --max-tokens 32 --ids; then
      dev=$d
      break
    fi
  done
  [ -n "$dev" ] || { echo "$name: no GPU device ran"; continue; }
  step "$name $dev decode"
  timeout 90 $BIN bench --model $M --device "$dev" --only decode --runs 3 --decode-tokens "${DECODE_TOKENS:-128}"
  [ "$what" = all ] || continue
  step "$name $dev decode, each kernel timed"
  timeout 60 $BIN bench --model $M --device "$dev" --only decode --decode-tokens 32 --runs 1 --kernel-times
  step "$name $dev prefill 512"
  timeout 60 $BIN bench --model $M --device "$dev" --only prefill --prefill 512 --runs 2
  step "$name $dev throughput 16, 64"
  timeout 150 $BIN bench --model $M --device "$dev" --only throughput --concurrency 16,64 --runs 1
done
if [ -f .gpu/layer_kernels.xz ]; then
  # The kernels' own tests (model/tests/layer_kernels.rs, built with the wgpu feature) on the
  # GPU, where f16 and bf16 weights and caches are checked too (llvmpipe has f32 alone).
  step "layer kernels against their references on vulkan"
  xz -dc .gpu/layer_kernels.xz >/tmp/layer_kernels && chmod +x /tmp/layer_kernels
  LLAISYS_TEST_DEVICE=vulkan timeout 120 /tmp/layer_kernels --test-threads 1
fi
step done
kill $smi
