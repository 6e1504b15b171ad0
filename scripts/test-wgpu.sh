#!/usr/bin/env bash
# D3: the wgpu backend's tests on Mesa's llvmpipe (a software GPU, so any machine runs them):
# the fixture parity and KV-cache tests of the model, and `llaisys serve` end to end, built with
# the `wgpu` feature and run on the `gl` device (OpenGL ES through EGL).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/mesa.sh
export LLAISYS_TEST_DEVICE=gl
# Headless Mesa wants a private runtime directory.
XDG_RUNTIME_DIR="$(mktemp -d)"
export XDG_RUNTIME_DIR
# One build for both packages (the wgpu stack takes most of it).
cargo test -p llaisys-model -p llaisys-server --features llaisys-model/wgpu,llaisys-server/wgpu \
  --test parity --test kv_cache --test launches --test layer_kernels --test cli
