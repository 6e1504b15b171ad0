#!/usr/bin/env bash
# Fetches llama.cpp's tokenizer tests for the vocabularies llaisys reads from GGUF files: the
# real Llama 3 (`llama-bpe`), Qwen2, Qwen3.5 (`qwen35`), Llama 2 (`llama-spm`, SentencePiece),
# Phi-3 (`phi-3`: Llama 2's with its added tokens, in a `phi3` file), DeepSeek LLM's (`deepseek-llm`:
# V2's), DeepSeek Coder's (`deepseek-coder`) and the StarCoder family's (`refact`, `starcoder`)
# vocabularies as llama.cpp's converter writes them
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
de785bb305cc6fa9d43908ed5da337f853c0b79e971348fcfb9f0915a39c5363  ggml-vocab-qwen2.gguf.out
63ed952ff338996cf0bdf24a7b10015124273f75c6dc9bb427356aa3f67ec62c  ggml-vocab-qwen35.gguf
0fc6547e7876cd5b2ef64a9d319c6e39040eb53986660bd4227ed7ddef017a94  ggml-vocab-qwen35.gguf.inp
5efe225820325303857d0a087a8d59216f0d1e9a9e31133e7a5b44c3c4e1e9ca  ggml-vocab-qwen35.gguf.out
16c3724582d59aa8bf84711894e833f916ee46a31d80e21312759c48bf8d0e69  ggml-vocab-llama-spm.gguf
be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0  ggml-vocab-llama-spm.gguf.inp
ad6905c925c49c022974fe67e030382e8a4f56eb4489a0b9481dcedb1ec73b29  ggml-vocab-llama-spm.gguf.out
967d7190d11c4842eab697079d98d56c2116e10eb617be355a2733bfc132e326  ggml-vocab-phi-3.gguf
be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0  ggml-vocab-phi-3.gguf.inp
ad6905c925c49c022974fe67e030382e8a4f56eb4489a0b9481dcedb1ec73b29  ggml-vocab-phi-3.gguf.out
867f77537b54565f0d81d508c04edc41aa1d4ffc1a92745f225b4c1b02755f76  ggml-vocab-deepseek-llm.gguf
be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0  ggml-vocab-deepseek-llm.gguf.inp
87cfc1a8a9a7ef25d04d28c26a67b6a620af7be938c9bd0feeb4d319b9302832  ggml-vocab-deepseek-llm.gguf.out
91cb1379f2e33af1c4866b194622b7a0e12e8f0c9dba7ba2f10d55978730bec1  ggml-vocab-deepseek-coder.gguf
be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0  ggml-vocab-deepseek-coder.gguf.inp
c2cea4584b0487e67fbd81f491bb44f89238722062126120d2c412edb3dbd853  ggml-vocab-deepseek-coder.gguf.out
ac3ceda902fed91ccf74312b305d9b86c37e4f8e35fa9cc6ef3ce34fca7d4678  ggml-vocab-refact.gguf
be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0  ggml-vocab-refact.gguf.inp
c7e5c1c5dc1dfd3e0d56576bf699d2aca0b760b80779523ea9d323aad6cd1b88  ggml-vocab-refact.gguf.out
fedb892b4e1bd3c1f2fcdae356440b14fb458f4264d586e5c987ed93df4e174d  ggml-vocab-starcoder.gguf
be0a11f7071f0c67d3053a2d377d8f35f0dbcb77ff11a60300fb57d36b477cf0  ggml-vocab-starcoder.gguf.inp
3ef12183c57ad076f9defd8e5eb454f509f5f0865cad35646abb4c4b2d2c5764  ggml-vocab-starcoder.gguf.out"
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
