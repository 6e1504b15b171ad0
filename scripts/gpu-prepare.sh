#!/usr/bin/env bash
# Prepares issue 31's run on a lent NVIDIA machine (scripts/gpu-measure.sh) from this checkout.
#
#   scripts/gpu-prepare.sh build    the Vulkan loader's packages (.gl), the wgpu build of
#                                   llaisys and of the layer_kernels and replay tests, stripped
#                                   and xz'd, the demo model's tokenizer and the gguf wheel (.gpu).
#                                   About 35 minutes on a fresh 2-core machine: start it first
#                                   thing in a session whose device `status` says a GPU is lent.
#   scripts/gpu-prepare.sh slim     just before the device call: leaves the fixtures the
#                                   carried tests do not read out of git's index (and ignored),
#                                   since the device tool sends every tracked file and the carry
#                                   within 64 MiB, and the fixtures alone are over 50.
#   scripts/gpu-prepare.sh restore  right after it: the index as HEAD has it again. The files on
#                                   disk are never touched.
#
# The call: command `bash scripts/gpu-measure.sh`, carry [".gl", ".gpu"], timeout about 540 s.
set -euo pipefail
cd "$(dirname "$0")/.."
# What the carried tests read (model/tests/replay.rs; layer_kernels reads no fixture).
KEEP=(tests/fixtures/tiny-tied-f32 tests/fixtures/tiny-qwen3-f32 tests/fixtures/tiny-qwen2moe-f32
  tests/fixtures/gguf/tiny-kquant.gguf)
SLIM_EXCLUDES=(/tests/fixtures/gguf/ '/tests/fixtures/tiny-*/' /fuzz/corpus/)
exclude=.git/info/exclude

mib() { awk '{s += $1} END {printf "%.1f", s / 1048576}'; }

case "${1:-}" in
build)
  grep -qx '/.gl/' "$exclude" 2>/dev/null || printf '/.gl/\n/.gpu/\n' >>"$exclude"
  mkdir -p .gl .gpu /tmp/amd64/partial
  o=(-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=/tmp/amd64)
  apt-get "${o[@]}" update >/dev/null
  (cd .gl && apt-get "${o[@]}" download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2)
  export CARGO_INCREMENTAL=0
  cargo build --release -p llaisys-server --features wgpu
  rm -f .gpu/llaisys .gpu/llaisys.xz
  strip -o .gpu/llaisys target/release/llaisys && xz -T2 .gpu/llaisys
  python3 scripts/random_family_gguf.py --donor-only models/qwen2.5-coder-0.5b-instruct.gguf .gpu/tokenizer.gguf
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 gguf -d .gpu
  cargo test --release -p llaisys-model --features wgpu --test layer_kernels --test replay --no-run
  for t in layer_kernels replay; do
    bin=$(ls -t target/release/deps/"$t"-* | grep -v '\.d$' | head -1)
    strip -o ".gpu/$t" "$bin" && xz -T2 -f ".gpu/$t"
  done
  ls -la .gl .gpu
  ;;
slim)
  git rm -r -q --cached tests/fixtures/gguf tests/fixtures/tiny-* fuzz/corpus
  git add "${KEEP[@]}"
  printf '%s\n' "${SLIM_EXCLUDES[@]}" >>"$exclude"
  tracked=$(git ls-files -z | xargs -0 stat -c %s | mib)
  carried=$(du -sb .gl .gpu | cut -f1 | mib)
  echo "tracked $tracked MiB, carried $carried MiB (the tool takes 64 MiB in all)"
  ;;
restore)
  git reset -q
  for e in "${SLIM_EXCLUDES[@]}"; do
    grep -vxF -- "$e" "$exclude" >"$exclude.new" || true
    mv "$exclude.new" "$exclude"
  done
  git status --short
  ;;
*)
  sed -n '2,16p' "$0"
  exit 2
  ;;
esac
