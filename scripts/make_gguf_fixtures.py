#!/usr/bin/env python3
"""Build the GGUF test fixtures under tests/fixtures/gguf/ (CI never runs this: the files are committed).

- blocks.gguf: for each quantized type llaisys loads (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K,
  Q4_K, Q5_K, Q6_K, and IQ4_NL, IQ4_XS, MXFP4, which it converts at load), a tensor of random blocks
  (random bytes, every f16 scale replaced by a finite value, MXFP4's E8M0 scales by ones an f16 holds)
  named after the type, and `<TYPE>.f32`: the same values dequantized by ggml's numpy reference
  (PyPI `gguf`, `gguf.quants.dequantize`). Dequantization must match it bit for bit.
- tiny-tied-f32.gguf, tiny-tied-q8_0.gguf, tiny-tied-q4_0.gguf, tiny-untied-q5_0.gguf: the
  tiny safetensors fixtures as GGUF files with their tokenizer (tokenizer.ggml.*) and chat
  template, matrices quantized by `gguf.quants.quantize`.
- tiny-kquant.gguf: a tiny random Qwen2 with 256-wide rows (K-quants need multiples of 256),
  quantized to Q4_K_M by llama.cpp's llama-quantize (set LLAMA_QUANTIZE, default
  $PEER/bin/llama-quantize from ../shared/peer/llamacpp.sh).
- kquants.gguf: two matrices of tiny-kquant's f32 model (`<name>`, f32) and the same matrices as
  llama-quantize makes them in Q2_K, Q3_K, Q4_K, Q5_K and Q6_K (`<name>.Q4_K`, ...; `--pure`,
  no importance matrix), for comparing llaisys's K-quant quantizer with llama.cpp's.
- tiny-kquant.imatrix.gguf, tiny-kquant.imatrix.dat: importance matrices of tiny-kquant's f32
  model over a few paragraphs (`CALIBRATION`), by llama.cpp's llama-imatrix (set LLAMA_IMATRIX,
  default $PEER/bin/llama-imatrix) in its GGUF and its older .dat format.
- unsupported-type.gguf: tiny-tied with one matrix in Q8_1 (the files of other families and
  architectures are scripts/make_family_fixtures.py's).
- pre-deepseek-r1-qwen.gguf, pre-llama3.gguf, pre-falcon3.gguf, pre-pixtral.gguf, pre-midm-2.0.gguf: the
  tokenizer metadata (no tensors) of tiny-qwen3-f32.gguf and tiny-llama-f32.gguf
  (scripts/make_family_fixtures.py's) with `tokenizer.ggml.pre` set to a name llama.cpp reads as theirs
  (`deepseek-r1-qwen`; `llama3`, `falcon3`, `pixtral`, `midm-2.0`).
- tiny-mixtral-stacked-q8_0.gguf, tiny-mixtral-split-q8_0.gguf: tiny-mixtral-f32.gguf
  (scripts/make_family_fixtures.py's) with its matrices in Q8_0 (the routers and vectors in F32,
  as llama-quantize leaves them), the first
  with each layer's experts stacked per matrix (`blk.N.ffn_gate_exps.weight`), the second with
  one tensor per expert (`blk.N.ffn_gate.E.weight`) as llama.cpp's converter wrote Mixtral before
  it stacked them. The same blocks in both.
- reference.json: for every model file, per prompt, the token ids, the last position's logits
  and 12 greedy tokens from a float64 numpy forward pass over the file's dequantized weights,
  with the smallest top-1 margin along the greedy path.

Needs: numpy, gguf (the venv of scripts/fetch_demo_model.sh has both).
Usage: python scripts/make_gguf_fixtures.py [split-experts]  (split-experts: only those two files)
"""
import json
import os
import struct
import subprocess
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T, GGUFReader, GGUFWriter
from gguf.quants import dequantize, quantize

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "tests", "fixtures")
OUT = os.path.join(FIXTURES, "gguf")
GREEDY = 12
PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "Hello, world! Ünïcödé — 你好",
]
HF_TO_GGUF = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        raw = np.frombuffer(data[a:b], dtype=np.uint8)
        if info["dtype"] == "F32":
            arr = raw.view("<f4")
        elif info["dtype"] == "BF16":
            arr = (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            raise SystemExit(f"{name}: dtype {info['dtype']}")
        out[name] = arr.reshape(info["shape"]).astype(np.float32)
    return out


def hf_checkpoint(name):
    d = os.path.join(FIXTURES, name)
    tensors = {}
    index = os.path.join(d, "model.safetensors.index.json")
    files = sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index) else ["model.safetensors"]
    for f in files:
        tensors.update(read_safetensors(os.path.join(d, f)))
    config = json.load(open(os.path.join(d, "config.json")))
    return config, tensors


def gguf_name(hf):
    if hf == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf == "model.norm.weight":
        return "output_norm.weight"
    if hf == "lm_head.weight":
        return "output.weight"
    _, _, layer, rest = hf.split(".", 3)
    return f"blk.{layer}.{HF_TO_GGUF[rest]}"


def add_vocab(w, tok_json, vocab, pre):
    """A byte-level BPE tokenizer.json as llama.cpp's converter writes it (`pre`: its pre-tokenizer's
    name); the ids no token has are unused padding. Returns the tokens, by id."""
    tokens = [f"[PAD{i}]" for i in range(vocab)]
    types = [gguf.TokenType.UNUSED] * vocab
    for t, i in tok_json["model"]["vocab"].items():
        tokens[i], types[i] = t, gguf.TokenType.NORMAL
    for a in tok_json["added_tokens"]:
        tokens[a["id"]] = a["content"]
        types[a["id"]] = gguf.TokenType.CONTROL if a["special"] else gguf.TokenType.USER_DEFINED
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges([m if isinstance(m, str) else " ".join(m) for m in tok_json["model"]["merges"]])
    return tokens


def tokenizer_metadata(w, vocab_size):
    """The fixtures' trimmed Qwen tokenizer (tests/fixtures/tiny-tied-f32) as tokenizer.ggml.*."""
    d = os.path.join(FIXTURES, "tiny-tied-f32")
    tok = json.load(open(os.path.join(d, "tokenizer.json"), encoding="utf-8"))
    cfg = json.load(open(os.path.join(d, "tokenizer_config.json"), encoding="utf-8"))
    ids = {t: i for i, t in enumerate(add_vocab(w, tok, vocab_size, "qwen2"))}
    w.add_eos_token_id(ids[cfg["eos_token"]])
    w.add_bos_token_id(ids["<|endoftext|>"])
    w.add_pad_token_id(ids["<|endoftext|>"])
    w.add_add_bos_token(False)
    w.add_chat_template(cfg["chat_template"])


def write_model(path, config, tensors, qtype):
    """`tensors`: Hugging Face names -> float32 arrays. Matrices in `qtype`, vectors in F32."""
    w = GGUFWriter(path, "qwen2")
    w.add_name(os.path.basename(path))
    w.add_block_count(config["num_hidden_layers"])
    w.add_context_length(config["max_position_embeddings"])
    w.add_embedding_length(config["hidden_size"])
    w.add_feed_forward_length(config["intermediate_size"])
    w.add_head_count(config["num_attention_heads"])
    w.add_head_count_kv(config["num_key_value_heads"])
    theta = config.get("rope_theta") or config.get("rope_parameters", {}).get("rope_theta", 10000.0)
    w.add_rope_freq_base(float(theta))
    w.add_layer_norm_rms_eps(float(config["rms_norm_eps"]))
    w.add_file_type({T.F32: 0, T.Q8_0: 7, T.Q4_0: 2, T.Q5_0: 8}.get(qtype, 0))
    tokenizer_metadata(w, config["vocab_size"])
    for hf, arr in tensors.items():
        if config.get("tie_word_embeddings") and hf == "lm_head.weight":
            continue
        name = gguf_name(hf)
        if arr.ndim == 2 and qtype != T.F32:
            w.add_tensor(name, quantize(arr, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(name, arr.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def random_blocks(qtype, n_blocks, rng):
    size = gguf.GGML_QUANT_SIZES[qtype][1]
    raw = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    fields = {T.Q8_0: [0], T.Q4_0: [0], T.Q5_0: [0], T.Q4_1: [0, 2], T.Q5_1: [0, 2],
              T.Q4_K: [0, 2], T.Q5_K: [0, 2], T.Q6_K: [208], T.Q2_K: [80, 82], T.Q3_K: [108],
              T.IQ4_NL: [0], T.IQ4_XS: [0], T.MXFP4: []}[qtype]
    if qtype == T.MXFP4:
        raw[:, 0] = rng.integers(104, 144, size=n_blocks, dtype=np.uint8)
    for at in fields:
        scale = (rng.uniform(0.002, 0.05, n_blocks) * rng.choice([-1, 1], n_blocks)).astype(np.float16)
        raw[:, at:at + 2] = scale.view(np.uint8).reshape(n_blocks, 2)
    return raw


def write_blocks(path):
    rng = np.random.default_rng(7)
    w = GGUFWriter(path, "blocks")
    for qtype in [T.Q8_0, T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q4_K, T.Q5_K, T.Q6_K,
                  T.Q2_K, T.Q3_K, T.IQ4_NL, T.IQ4_XS, T.MXFP4]:
        block = gguf.GGML_QUANT_SIZES[qtype][0]
        rows, per_row = 3, max(1, 512 // block)
        raw = random_blocks(qtype, rows * per_row, rng).reshape(rows, -1)
        w.add_tensor(qtype.name, raw, raw_dtype=qtype)
        w.add_tensor(f"{qtype.name}.f32", dequantize(raw, qtype).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# ---- numpy Qwen2 forward pass (float64) over a GGUF file's dequantized weights ----

def load_gguf(path):
    r = GGUFReader(path)
    f = lambda k: r.fields[k].contents()
    cfg = dict(
        layers=int(f("qwen2.block_count")), hidden=int(f("qwen2.embedding_length")),
        heads=int(f("qwen2.attention.head_count")), kv=int(f("qwen2.attention.head_count_kv")),
        eps=float(f("qwen2.attention.layer_norm_rms_epsilon")), theta=float(f("qwen2.rope.freq_base")),
    )
    w = {}
    for t in r.tensors:
        arr = dequantize(t.data, t.tensor_type).astype(np.float64)
        w[t.name] = arr.reshape([int(d) for d in reversed(t.shape)])
    w.setdefault("output.weight", w["token_embd.weight"])
    return cfg, w


def forward(cfg, w, ids):
    n, hd = len(ids), cfg["hidden"] // cfg["heads"]
    rms = lambda x, g: x / np.sqrt((x * x).mean(-1, keepdims=True) + cfg["eps"]) * g
    inv = 1.0 / (np.float32(cfg["theta"]) ** (np.arange(0, hd, 2, dtype=np.float32) / np.float32(hd)))
    ang = (np.arange(n, dtype=np.float32)[:, None] * inv[None, :]).astype(np.float64)
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]

    def rope(x):
        a, b = x[..., : hd // 2], x[..., hd // 2:]
        return np.concatenate([a * cos - b * sin, b * cos + a * sin], -1)

    x = w["token_embd.weight"][ids]
    group = cfg["heads"] // cfg["kv"]
    mask = np.triu(np.full((n, n), -np.inf), 1)
    for l in range(cfg["layers"]):
        p = lambda s: w[f"blk.{l}.{s}"]
        h = rms(x, p("attn_norm.weight"))
        q = (h @ p("attn_q.weight").T + p("attn_q.bias")).reshape(n, cfg["heads"], hd)
        k = (h @ p("attn_k.weight").T + p("attn_k.bias")).reshape(n, cfg["kv"], hd)
        v = (h @ p("attn_v.weight").T + p("attn_v.bias")).reshape(n, cfg["kv"], hd)
        q, k = rope(q), rope(k)
        k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
        s = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(hd) + mask
        s = np.exp(s - s.max(-1, keepdims=True))
        s /= s.sum(-1, keepdims=True)
        a = np.einsum("hqk,khd->qhd", s, v).reshape(n, -1)
        x = x + a @ p("attn_output.weight").T
        h = rms(x, p("ffn_norm.weight"))
        g, u = h @ p("ffn_gate.weight").T, h @ p("ffn_up.weight").T
        x = x + (g / (1 + np.exp(-g)) * u) @ p("ffn_down.weight").T
    return rms(x, w["output_norm.weight"]) @ w["output.weight"].T


def reference(path, prompt_ids):
    cfg, w = load_gguf(path)
    out = []
    for ids in prompt_ids:
        ids = list(ids)
        logits = forward(cfg, w, ids)
        last = logits[-1].astype(np.float32).tolist()
        greedy, margin = [], np.inf
        for _ in range(GREEDY):
            row = forward(cfg, w, ids + greedy)[-1] if greedy else logits[-1]
            top = np.sort(row)[-2:]
            margin = min(margin, float(top[1] - top[0]))
            greedy.append(int(row.argmax()))
        out.append(dict(ids=ids, last_logits=last, greedy=greedy, min_margin=margin))
    return out


def tiny_kquant(rng):
    """A tiny random Qwen2 whose rows are multiples of 256, scaled like make_fixtures.py's."""
    h, inter, layers, heads, kv, vocab = 256, 512, 2, 4, 2, 1024
    hd = h // heads
    n = lambda *s, std=0.05: (rng.standard_normal(s) * std).astype(np.float32)
    t = {"model.embed_tokens.weight": n(vocab, h, std=0.05), "model.norm.weight": np.full(h, 40.0, np.float32)}
    for l in range(layers):
        p = f"model.layers.{l}."
        t[p + "input_layernorm.weight"] = np.ones(h, np.float32)
        t[p + "post_attention_layernorm.weight"] = np.ones(h, np.float32)
        for s, rows in [("q", h), ("k", kv * hd), ("v", kv * hd)]:
            t[p + f"self_attn.{s}_proj.weight"] = n(rows, h, std=0.06)
            t[p + f"self_attn.{s}_proj.bias"] = n(rows, std=0.02)
        t[p + "self_attn.o_proj.weight"] = n(h, h, std=0.06)
        t[p + "mlp.gate_proj.weight"] = n(inter, h, std=0.06)
        t[p + "mlp.up_proj.weight"] = n(inter, h, std=0.06)
        t[p + "mlp.down_proj.weight"] = n(h, inter, std=0.04)
    config = dict(num_hidden_layers=layers, max_position_embeddings=256, hidden_size=h, intermediate_size=inter,
                  num_attention_heads=heads, num_key_value_heads=kv, rope_theta=10000.0, rms_norm_eps=1e-6,
                  vocab_size=vocab, tie_word_embeddings=True)
    return config, t


def main():
    os.makedirs(OUT, exist_ok=True)
    write_blocks(os.path.join(OUT, "blocks.gguf"))
    models = {}
    tied_cfg, tied = hf_checkpoint("tiny-tied-f32")
    untied_cfg, untied = hf_checkpoint("tiny-untied-f32")
    for name, (cfg, t, q) in {
        "tiny-tied-f32": (tied_cfg, tied, T.F32),
        "tiny-tied-q8_0": (tied_cfg, tied, T.Q8_0),
        "tiny-tied-q4_0": (tied_cfg, tied, T.Q4_0),
        "tiny-untied-q5_0": (untied_cfg, untied, T.Q5_0),
    }.items():
        write_model(os.path.join(OUT, name + ".gguf"), cfg, t, q)
        models[name] = name + ".gguf"
    quantizer = os.environ.get("LLAMA_QUANTIZE") or os.path.expanduser("~/.cache/llaisys-peer/bin/llama-quantize")
    kcfg, kt = tiny_kquant(np.random.default_rng(11))
    f32_path = os.path.join(OUT, "tiny-kquant-f32.gguf.tmp")
    write_model(f32_path, kcfg, kt, T.F32)
    subprocess.run([quantizer, f32_path, os.path.join(OUT, "tiny-kquant.gguf"), "Q4_K_M"], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    write_kquants(os.path.join(OUT, "kquants.gguf"), f32_path, quantizer)
    write_imatrices(f32_path, os.path.join(OUT, "tiny-kquant.imatrix"))
    os.remove(f32_path)
    models["tiny-kquant"] = "tiny-kquant.gguf"
    # One matrix in a type llaisys does not load.
    unsupported = os.path.join(OUT, "unsupported-type.gguf")
    write_model(unsupported, tied_cfg, tied, T.Q8_0)
    patch_type(unsupported, "blk.0.attn_q.weight", T.Q8_1, tied["model.layers.0.self_attn.q_proj.weight"])

    for src, pre in [("tiny-qwen3-f32", "deepseek-r1-qwen"), ("tiny-llama-f32", "llama3"), ("tiny-llama-f32", "falcon3"),
                     ("tiny-llama-f32", "pixtral"), ("tiny-llama-f32", "midm-2.0")]:
        write_tokenizer_only(os.path.join(OUT, src + ".gguf"), os.path.join(OUT, f"pre-{pre}.gguf"), pre)

    write_split_experts()

    tok_ids = json.load(open(os.path.join(FIXTURES, "tiny-tied-f32", "reference.json")))["prompts"]
    prompt_ids = [p["ids"] for p in tok_ids]
    refs = {name: dict(file=f, prompts=reference(os.path.join(OUT, f), prompt_ids)) for name, f in models.items()}
    json.dump(refs, open(os.path.join(OUT, "reference.json"), "w"), indent=0)
    for name, r in refs.items():
        print(name, "min margin", min(p["min_margin"] for p in r["prompts"]))


def copy_fields(src, w, skip=(), replace=None):
    """GGUF reader `src`'s key-value fields written to writer `w` in their order, but the reader's
    own (`GGUF.*`), the architecture (the writer's) and the keys `skip`; a key of `replace` is
    written in its place by its function of `w` instead."""
    replace = replace or {}
    for field in src.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture" or field.name in skip:
            continue
        if field.name in replace:
            replace[field.name](w)
            continue
        sub = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        w.add_key_value(field.name, field.contents(), field.types[0], sub)


def write_split_experts():
    """tiny-mixtral-f32.gguf in Q8_0, its experts stacked and one tensor per expert."""
    src = GGUFReader(os.path.join(OUT, "tiny-mixtral-f32.gguf"))
    for layout in ["stacked", "split"]:
        path = os.path.join(OUT, f"tiny-mixtral-{layout}-q8_0.gguf")
        w = GGUFWriter(path, "llama")
        copy_fields(src, w)
        for t in src.tensors:
            data = np.array(t.data)
            if data.ndim == 1 or "ffn_gate_inp" in t.name:
                w.add_tensor(t.name, data)
            elif data.ndim == 2:
                w.add_tensor(t.name, quantize(data, T.Q8_0), raw_dtype=T.Q8_0)
            elif layout == "stacked":
                # [experts, out, in]: each expert's rows quantized as the split file's are.
                w.add_tensor(t.name, np.stack([quantize(e, T.Q8_0) for e in data]), raw_dtype=T.Q8_0)
            else:
                for e, expert in enumerate(data):
                    name = t.name.replace("_exps.", f".{e}.")
                    w.add_tensor(name, quantize(expert, T.Q8_0), raw_dtype=T.Q8_0)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()


def write_kquants(path, f32_path, quantizer):
    """Two matrices of the f32 model at `f32_path`, and as llama-quantize makes them in each K-quant."""
    names = ["blk.0.attn_k.weight", "blk.1.attn_v.weight"]
    f32 = {t.name: np.array(t.data) for t in GGUFReader(f32_path).tensors if t.name in names}
    w = GGUFWriter(path, "kquants")
    for name in names:
        w.add_tensor(name, f32[name].astype(np.float32))
    for qtype in [T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K]:
        out = f32_path + "." + qtype.name
        subprocess.run([quantizer, "--pure", f32_path, out, qtype.name], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for t in GGUFReader(out).tensors:
            if t.name in names:
                assert t.tensor_type == qtype, (t.name, t.tensor_type)
                w.add_tensor(f"{t.name}.{qtype.name}", np.array(t.data), raw_dtype=qtype)
        os.remove(out)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


CALIBRATION = "\n\n".join(PROMPTS * 4) + """
The quick brown fox jumps over the lazy dog. Pack my box with five dozen liquor jugs.
fn main() { println!("{}", (1..10).map(|i| i * i).sum::<u32>()); }
Une phrase en français, ein deutscher Satz, 一个中文句子。
"""


def write_imatrices(f32_path, prefix):
    """llama-imatrix over CALIBRATION for the model at `f32_path`: `prefix.gguf` and `prefix.dat`."""
    imatrix = os.environ.get("LLAMA_IMATRIX") or os.path.expanduser("~/.cache/llaisys-peer/bin/llama-imatrix")
    text = prefix + ".txt.tmp"
    with open(text, "w") as f:
        f.write(CALIBRATION)
    for fmt in ["gguf", "dat"]:
        subprocess.run([imatrix, "-m", f32_path, "-f", text, "-o", f"{prefix}.{fmt}", "--output-format", fmt,
                        "-c", "64", "-t", "1"], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    os.remove(text)


def write_tokenizer_only(src, dst, pre, drop=()):
    """The metadata of GGUF file `src` without its tensors, `tokenizer.ggml.pre` set to `pre`,
    the keys `drop` left out."""
    r = GGUFReader(src)
    w = GGUFWriter(dst, r.fields["general.architecture"].contents())
    copy_fields(r, w, skip=drop, replace={"tokenizer.ggml.pre": lambda w: w.add_string("tokenizer.ggml.pre", pre)})
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def patch_type(path, name, qtype, arr):
    """Rewrites `path` with tensor `name` stored as raw bytes of `qtype` (random, never decoded)."""
    r = GGUFReader(path)
    w = GGUFWriter(path + ".tmp", "qwen2")
    for field in r.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        w.add_key_value(field.name, field.contents(), field.types[0], field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None)
    rows, k = arr.shape
    block, size = gguf.GGML_QUANT_SIZES[qtype]
    for t in r.tensors:
        if t.name == name:
            raw = np.random.default_rng(3).integers(0, 256, size=(rows, k // block * size), dtype=np.uint8)
            w.add_tensor(name, raw, raw_dtype=qtype)
        elif t.tensor_type == T.F32:
            w.add_tensor(t.name, np.array(t.data))
        else:
            w.add_tensor(t.name, np.array(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(path + ".tmp", path)


if __name__ == "__main__":
    if sys.argv[1:] == ["split-experts"]:
        sys.exit(write_split_experts())
    sys.exit(main())
