#!/usr/bin/env bash
# Converts the family fixtures with llama.cpp's own converter (convert_hf_to_gguf.py of the
# llama.cpp that PyPI's llama-cpp-python 0.3.36 vendors, the peer's), into
# tests/fixtures/gguf/converted/: GGUF files as users get them, beside the ones
# scripts/make_family_fixtures.py writes by its transcription of that converter. The fixtures'
# byte-level tokenizers are synthetic, so no hash in the converter's table names their
# pre-tokenizer: a copy of the converter is patched to take it from FORCE_PRE instead of
# refusing. The vision fixtures' towers are also written as llama.cpp's projector files
# (`--mmproj`: converted/mmproj-NAME.gguf); their towers have fewer blocks than the merger's
# `mm.2`, which the converter's name table only reaches from three blocks on, so the copy builds
# that table for at least three. Nothing of llama.cpp is kept in the project, only the files it
# writes.
# Needs: python3 with torch, transformers, safetensors, sentencepiece, numpy (as the fixture
# scripts). Usage: scripts/convert_fixtures_with_llamacpp.sh [FIXTURE...] (only those; all without)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=$root/models/.download
version=0.3.36
sdist=$work/llama_cpp_python-$version.tar.gz
mkdir -p "$work"
[ -f "$sdist" ] || python3 -m pip download -q --disable-pip-version-check --no-deps --no-binary llama-cpp-python \
  -d "$work" "llama-cpp-python==$version"
src=$(mktemp -d)
trap 'rm -rf "$src"' EXIT
tar -xzf "$sdist" -C "$src" --strip-components=2 \
  "llama_cpp_python-$version/vendor/llama.cpp/convert_hf_to_gguf.py" \
  "llama_cpp_python-$version/vendor/llama.cpp/conversion" \
  "llama_cpp_python-$version/vendor/llama.cpp/gguf-py"
python3 - "$src/llama.cpp/conversion/base.py" <<'PY'
import sys
path = sys.argv[1]
s = open(path).read()
refuse = '            raise NotImplementedError("BPE pre-tokenizer was not recognized - update get_vocab_base_pre()")'
assert s.count(refuse) == 1, "the converter changed: its refusal of an unknown pre-tokenizer is not where it was"
s = s.replace(refuse, '            res = __import__("os").environ.get("FORCE_PRE")\n            if res is None:\n    ' + refuse)
table = 'gguf.get_tensor_name_map(gguf.MODEL_ARCH.MMPROJ, self.block_count)'
assert s.count(table) == 1, "the converter changed: its projector's name table is not made where it was"
s = s.replace(table, 'gguf.get_tensor_name_map(gguf.MODEL_ARCH.MMPROJ, max(self.block_count, 3))')
open(path, "w").write(s)
PY
out=$root/tests/fixtures/gguf/converted
mkdir -p "$out"
# fixture, pre-tokenizer, converter options (Qwen3.5's checkpoints carry a stub MTP head: left out),
# and the class the converter takes it as where it registers none for the fixture's own (Mistral 4's
# language model is converted by its Mistral 3 class, by `model_type`)
for spec in tiny-qwen35-f32:qwen35:--no-mtp tiny-qwen35moe-f32:qwen35:--no-mtp tiny-qwen3next-f32:qwen2:--no-mtp \
            tiny-mistral-f32:default: tiny-mixtral-f32:default: \
            tiny-ministral3-f32:default: tiny-phi3-f32:default: tiny-gemma3-f32:default: \
            tiny-llama-f32:llama-bpe: tiny-gptoss-f32:gpt-4o: tiny-gptoss-mxfp4:gpt-4o: \
            tiny-smollm3-f32:llama-bpe: tiny-olmo2-f32:dbrx: tiny-olmo3-f32:dbrx: \
            tiny-granite-f32:refact: tiny-glm4moe-f32:glm4: tiny-glm4-f32:glm4: \
            tiny-glm4moelite-f32:glm4: tiny-deepseekv2-f32:glm4: \
            tiny-mistral4-f32:default::Ministral3ForCausalLM tiny-qwen3vl-f32:qwen2: \
            tiny-qwen25vl-f32:qwen2: tiny-qwen2vl-f32:qwen2: tiny-gemma3vl-f32:default:; do
  IFS=: read -r name pre opts class <<<"$spec"
  if [ $# -gt 0 ] && [[ " $* " != *" $name "* ]]; then continue; fi
  dir=$root/tests/fixtures/$name
  if [ -n "$class" ]; then
    cp -r "$dir" "$src/$name"
    dir=$src/$name
    python3 -c 'import json, sys; p = sys.argv[1]; c = json.load(open(p)); c["architectures"] = [sys.argv[2]]; json.dump(c, open(p, "w"))' \
      "$dir/config.json" "$class"
  fi
  # shellcheck disable=SC2086 # opts is one flag or none
  FORCE_PRE=$pre PYTHONPATH=$src/llama.cpp/gguf-py python3 "$src/llama.cpp/convert_hf_to_gguf.py" \
    "$dir" --outfile "$out/$name.gguf" --outtype f32 $opts >/dev/null 2>&1 \
    || { echo "$name: the converter failed" >&2; exit 1; }
  echo "$out/$name.gguf"
done
# The vision towers, as projector files beside their language models.
for name in tiny-qwen2vl-f32 tiny-qwen25vl-f32 tiny-qwen3vl-f32 tiny-qwen35-f32 tiny-qwen35moe-f32 tiny-gemma3vl-f32; do
  if [ $# -gt 0 ] && [[ " $* " != *" $name "* ]]; then continue; fi
  PYTHONPATH=$src/llama.cpp/gguf-py python3 "$src/llama.cpp/convert_hf_to_gguf.py" \
    "$root/tests/fixtures/$name" --mmproj --outfile "$out/mmproj-$name.gguf" --outtype f32 >/dev/null 2>&1 \
    || { echo "$name: the converter failed on its tower" >&2; exit 1; }
  echo "$out/mmproj-$name.gguf"
done
# A projector file in Q8_0 (its matrices whose rows are whole blocks), as vision GGUF repos ship some.
if [ $# -eq 0 ] || [[ " $* " == *" tiny-gemma3vl-f32 "* ]]; then
  PYTHONPATH=$src/llama.cpp/gguf-py python3 "$src/llama.cpp/convert_hf_to_gguf.py" \
    "$root/tests/fixtures/tiny-gemma3vl-f32" --mmproj --outfile "$out/mmproj-tiny-gemma3vl-q8_0.gguf" --outtype q8_0 \
    >/dev/null 2>&1 || { echo "tiny-gemma3vl-f32: the converter failed on its tower in Q8_0" >&2; exit 1; }
  echo "$out/mmproj-tiny-gemma3vl-q8_0.gguf"
fi
