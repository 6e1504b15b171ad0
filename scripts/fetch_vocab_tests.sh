#!/usr/bin/env bash
# Fetches llama.cpp's tokenizer tests for the vocabularies llaisys reads from GGUF files: the
# real Llama 3 (`llama-bpe`) and Qwen2 vocabularies as llama.cpp's converter writes them
# (models/ggml-vocab-NAME.gguf), each with its test texts (.inp) and the ids Hugging Face's
# tokenizer gives them (.out). They come from the llama-cpp-python source package on PyPI,
# which vendors llama.cpp, and are checked against their sha256.
# Usage: scripts/fetch_vocab_tests.sh [OUT_DIR]   (default: models/.download/vocab-tests)
# Idempotent; prints the folder, which LLAISYS_VOCAB_TESTS names for the tests.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$root/models/.download/vocab-tests}
work=$root/models/.download
version=0.3.36
mkdir -p "$out" "$work"
sums="97272e430d53bc7688f52d5e0ad8ea8f163ede9f1bbd1694feaa504797d5d96e  ggml-vocab-llama-bpe.gguf
be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0  ggml-vocab-llama-bpe.gguf.inp
118abf2034a197fc5c9dec5204dfdeee7004c7c70952ae577f66b99e212fab9b  ggml-vocab-llama-bpe.gguf.out
44c2f46b715f585c6ab513970e8a006bfa5badd6108560054921cf598d154d8c  ggml-vocab-qwen2.gguf
be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0  ggml-vocab-qwen2.gguf.inp
de785bb305cc6fa9d43908ed5da337f853c0b79e971348fcfb9f0915a39c5363  ggml-vocab-qwen2.gguf.out"
if ! (cd "$out" && echo "$sums" | sha256sum -c --quiet - >/dev/null 2>&1); then
  sdist=$work/llama_cpp_python-$version.tar.gz
  # pip prepares the package's metadata in an isolated build environment; nothing is built.
  [ -f "$sdist" ] || python3 -m pip download -q --disable-pip-version-check --no-deps --no-binary llama-cpp-python \
    -d "$work" "llama-cpp-python==$version"
  names=$(echo "$sums" | awk '{print "llama_cpp_python-'$version'/vendor/llama.cpp/models/" $2}')
  # shellcheck disable=SC2086 # one archive member per word
  tar -xzf "$sdist" -C "$out" --strip-components=4 $names
  (cd "$out" && echo "$sums" | sha256sum -c --quiet -) || { echo "sha256 mismatch in $out" >&2; exit 1; }
fi
echo "$out"
