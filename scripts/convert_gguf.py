#!/usr/bin/env python3
"""Convert a Qwen2 GGUF file into a Hugging Face model directory (no torch needed).

Writes config.json, generation_config.json, model.safetensors (bf16 or f32),
tokenizer.json and tokenizer_config.json (with the GGUF's chat template).
Every quantized tensor is dequantized by ggml's own reader (PyPI `gguf`).
The separate `output.weight` is dropped: the model ties its embeddings
(`tie_word_embeddings = true`), as upstream Qwen2.5-0.5B does.

Usage: convert_gguf.py MODEL.gguf OUT_DIR [--dtype bf16|f32]
"""
import argparse
import json
import os
import struct
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

# GGUF per-layer tensor name -> Hugging Face name.
LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
GLOBAL_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight"}

# Qwen2's pre-tokenizer split pattern (tokenizer.ggml.pre = "qwen2").
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def field(reader, key):
    f = reader.fields.get(key)
    return None if f is None else f.contents()


def hf_name(gguf_name):
    if gguf_name in GLOBAL_NAMES:
        return GLOBAL_NAMES[gguf_name]
    if gguf_name.startswith("blk."):
        _, layer, rest = gguf_name.split(".", 2)
        return f"model.layers.{layer}.{LAYER_NAMES[rest]}"
    return None


def to_bf16_bits(x):
    """float32 -> bf16 bit patterns, round to nearest even."""
    bits = x.astype(np.float32).view(np.uint32)
    rounding = ((bits >> 16) & 1) + 0x7FFF
    return ((bits + rounding) >> 16).astype(np.uint16)


def write_safetensors(path, tensors, dtype):
    """tensors: list of (name, float32 array). Streams data so only one tensor is converted at a time."""
    header, offset = {}, 0
    width = 2 if dtype == "bf16" else 4
    for name, arr in tensors:
        size = arr.size * width
        header[name] = {"dtype": "BF16" if dtype == "bf16" else "F32", "shape": list(arr.shape),
                        "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for _, arr in tensors:
            data = to_bf16_bits(arr) if dtype == "bf16" else arr.astype("<f4")
            f.write(data.tobytes())
    os.replace(tmp, path)


def tokenizer_files(reader):
    tokens = [str(t) for t in field(reader, "tokenizer.ggml.tokens")]
    types = list(field(reader, "tokenizer.ggml.token_type"))
    merges = [m.split(" ", 1) for m in field(reader, "tokenizer.ggml.merges")]
    # Type 1 = normal, 3 = control, 4 = user-defined, 5 = unused (vocabulary padding).
    vocab = {tok: i for i, (tok, ty) in enumerate(zip(tokens, types)) if ty == 1}
    added = [
        {"id": i, "content": tok, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": True}
        for i, (tok, ty) in enumerate(zip(tokens, types)) if ty in (3, 4)
    ]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    tokenizer = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN2_SPLIT}, "behavior": "Isolated", "invert": False},
            byte_level]},
        "post_processor": byte_level, "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
                  "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": False, "vocab": vocab, "merges": merges},
    }
    eos = tokens[int(field(reader, "tokenizer.ggml.eos_token_id"))]
    pad_id = field(reader, "tokenizer.ggml.padding_token_id")
    config = {
        "add_bos_token": False, "add_prefix_space": False, "bos_token": None,
        "chat_template": field(reader, "tokenizer.chat_template"), "clean_up_tokenization_spaces": False,
        "eos_token": eos, "errors": "replace", "model_max_length": int(field(reader, "qwen2.context_length")),
        "pad_token": tokens[int(pad_id)] if pad_id is not None else None, "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer", "unk_token": None,
        "added_tokens_decoder": {str(a["id"]): {k: v for k, v in a.items() if k != "id"} for a in added},
    }
    return tokenizer, config


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("gguf")
    ap.add_argument("out")
    ap.add_argument("--dtype", choices=["bf16", "f32"], default="bf16")
    args = ap.parse_args()

    reader = GGUFReader(args.gguf)
    arch = field(reader, "general.architecture")
    if arch != "qwen2":
        sys.exit(f"unsupported architecture {arch!r}: only qwen2 converts")
    n_vocab = len(reader.fields["tokenizer.ggml.tokens"].data)
    heads = int(field(reader, "qwen2.attention.head_count"))
    config = {
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu",
        "hidden_size": int(field(reader, "qwen2.embedding_length")),
        "intermediate_size": int(field(reader, "qwen2.feed_forward_length")),
        "num_hidden_layers": int(field(reader, "qwen2.block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(field(reader, "qwen2.attention.head_count_kv")),
        "max_position_embeddings": int(field(reader, "qwen2.context_length")),
        "rms_norm_eps": float(np.float32(field(reader, "qwen2.attention.layer_norm_rms_epsilon")).round(7)),
        "rope_theta": float(field(reader, "qwen2.rope.freq_base")),
        "vocab_size": n_vocab, "tie_word_embeddings": True,
        "bos_token_id": int(field(reader, "tokenizer.ggml.bos_token_id")),
        "eos_token_id": int(field(reader, "tokenizer.ggml.eos_token_id")),
        "torch_dtype": "bfloat16" if args.dtype == "bf16" else "float32",
        "use_sliding_window": False, "attention_dropout": 0.0, "initializer_range": 0.02,
    }

    tensors = []
    for t in reader.tensors:
        name = hf_name(t.name)
        if name is None:
            continue  # output.weight: tied to the embedding
        arr = dequantize(t.data, t.tensor_type).astype(np.float32, copy=False)
        tensors.append((name, arr.reshape([int(d) for d in reversed(t.shape)])))

    os.makedirs(args.out, exist_ok=True)
    write_safetensors(os.path.join(args.out, "model.safetensors"), tensors, args.dtype)
    tokenizer, tok_config = tokenizer_files(reader)
    eos_ids = [config["eos_token_id"], config["bos_token_id"]]
    files = {
        "config.json": config,
        "generation_config.json": {"bos_token_id": config["bos_token_id"], "eos_token_id": eos_ids},
        "tokenizer.json": tokenizer,
        "tokenizer_config.json": tok_config,
    }
    for fname, obj in files.items():
        with open(os.path.join(args.out, fname), "w", encoding="utf-8") as f:
            json.dump(obj, f, ensure_ascii=False, indent=1)
    print(f"wrote {args.out}: {len(tensors)} tensors ({args.dtype})")


if __name__ == "__main__":
    main()
