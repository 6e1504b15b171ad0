#!/usr/bin/env bash
# D3: the wgpu backend's tests on Mesa's llvmpipe (a software GPU, so any machine runs them):
# the fixture parity, KV-cache and image tests of the model, and `llaisys serve` end to end, built with
# the `wgpu` feature and run on the `gl` device (OpenGL ES through EGL).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/mesa.sh
export LLAISYS_TEST_DEVICE=gl
# Headless Mesa wants a private runtime directory.
XDG_RUNTIME_DIR="$(mktemp -d)"
export XDG_RUNTIME_DIR
# One build for both packages (the wgpu stack takes most of it).
wgpu_tests=(cargo test -p llaisys-model -p llaisys-server --features llaisys-model/wgpu,llaisys-server/wgpu)
# One test at a time in a process: wgpu's GL backend keeps one EGL context behind a lock that
# panics after waiting 6 s ("Could not lock adapter context"), and on llvmpipe a test in another
# thread can hold it that long (a fresh-clone run failed so once); the context serialises their
# GPU work anyway.
# Only the test binaries run below (the packages' others, their unit tests and examples took
# about 3 CPU minutes more to build, the model's unit tests last of all).
rest=(--test parity --test kv_cache --test launches --test streams --test cli --test images)
"${wgpu_tests[@]}" --test layer_kernels --test replay "${rest[@]}" --no-run
# Two processes side by side, one a core: on llvmpipe these tests spend most of their time
# compiling shaders (LLVM, on the thread that launches the kernel; 14 of the 22 minutes a fresh
# run took here were layer_kernels'), and Mesa's shader cache is shared between processes. The
# quantized products (the slowest test) and the replays run beside the rest.
one=("${wgpu_tests[@]}" --test layer_kernels -- --test-threads 1 quantized_products)
two=("${wgpu_tests[@]}" --test replay -- --test-threads 1)
lane=$(mktemp)
("${one[@]}" && "${two[@]}") > "$lane" 2>&1 &
beside=$!
status=0
"${wgpu_tests[@]}" --test layer_kernels -- --test-threads 1 --skip quantized_products || status=1
"${wgpu_tests[@]}" "${rest[@]}" -- --test-threads 1 || status=1
wait "$beside" || status=1
echo "== beside them: layer_kernels' quantized products, then the replays"
cat "$lane"
[ "$status" = 0 ]
# The demo model's GGUF, where scripts/test-demo-model.sh fetched it (CI runs that first): its
# embedding and output matrix are larger than llvmpipe's largest buffer, as blocks dequantized
# and as f32 (gpu_demo: the file dequantized at load, against the CPU).
demo=models/qwen2.5-coder-0.5b-instruct.gguf
if [ -f "$demo" ]; then
  LLAISYS_TEST_MODEL="$PWD/$demo" "${wgpu_tests[@]}" --test parity -- --test-threads 1 --ignored the_demo gpu_demo
else
  echo "skipped the demo model's test on llvmpipe: $demo is missing (scripts/fetch_demo_model.sh)"
fi
