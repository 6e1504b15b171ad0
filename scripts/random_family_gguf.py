#!/usr/bin/env python3
"""Write an F16 GGUF of a real model's shape with random weights, for speed side by side with
llama.cpp on the families beyond Qwen2 (weights' values do not change speed; quantize it with the
peer's llama-quantize for Q4_K_M or Q8_0). The tokenizer, chat template and eos are copied from a
donor GGUF (the demo model's), so both engines load it; Llama's file gets Qwen's tokenizer too,
which changes nothing in the products measured.

Shapes (from the models' config.json):
  qwen2.5-0.5b   the demo model's shape (Qwen2.5-0.5B): hidden 896, 24 layers, 14 heads / 2 KV of
                 64, SwiGLU 4864, tied, q/k/v biases; for the GPU runs, which cannot carry the
                 real file
  qwen3-0.6b     Qwen3-0.6B: hidden 1024, 28 layers, 16 heads / 8 KV of 128, SwiGLU 3072, tied
  llama-3.2-1b   Llama-3.2-1B: hidden 2048, 16 layers, 32 heads / 8 KV of 64, SwiGLU 8192, tied,
                 llama3 rope scaling (rope_freqs.weight)
  qwen3-moe-mini Qwen3-30B-A3B's block shape scaled to fit: hidden 2048, 32 heads / 4 KV of
                 128, top-8 of experts of width 768 as in the real model (so each token's work
                 per layer is the real one), but 32 experts (not 128) and 12 layers (not 48)
  gemma3-1b      Gemma 3 1B: hidden 1152, 26 layers, 4 heads / 1 KV of 256, GeGLU 6912, tied,
                 q/k norms and post-attention / post-feed-forward norms, five local layers over a
                 window of 512 for each global one (the donor's vocabulary, not Gemma's 262,144)
  gptoss-mini    gpt-oss-20b's block: hidden 2880, 64 heads / 8 KV of 64 with sinks and biases,
                 32 experts of width 2880, top-4, with biases, in MXFP4 as released (whatever
                 the file's type: the other matrices take it), local layers over a window of 128
                 alternating with global ones, YaRN (factor 32 over 4,096); 8 layers, not 24
                 (the donor's vocabulary, not o200k's 201,088)

Usage: python scripts/random_family_gguf.py DONOR.gguf OUT.gguf SHAPE [f16|bf16|q8_0|q4_k_m]
q8_0 and q4_k_m write ggml blocks of random quants directly (no peer's llama-quantize, for a
machine that has none, like the lent GPU one): each matrix's scales are set so its values have
the spread the 16-bit files' have. q4_k_m follows llama-quantize's mix: Q4_K, with Q6_K for the
embedding and for attn_v and ffn_down in a third of the layers and the first and last eighth,
and Q5_0 / Q8_0 where a row's length is not a multiple of 256 (the demo shape's 896).
The donor only lends its tokenizer.* fields: `--donor-only` writes a GGUF of just those (a few
MB), which can travel where the demo model cannot:
  python scripts/random_family_gguf.py --donor-only DEMO.gguf tokenizer.gguf
"""
import sys

import numpy as np
import gguf

SHAPES = {
    "qwen2.5-0.5b": dict(arch="qwen2", hidden=896, layers=24, heads=14, kv=2, head_dim=64, inter=4864, tied=True),
    "qwen3-0.6b": dict(arch="qwen3", hidden=1024, layers=28, heads=16, kv=8, head_dim=128, inter=3072, tied=True),
    "llama-3.2-1b": dict(arch="llama", hidden=2048, layers=16, heads=32, kv=8, head_dim=64, inter=8192, tied=True),
    "qwen3-moe-mini": dict(arch="qwen3moe", hidden=2048, layers=12, heads=32, kv=4, head_dim=128, inter=6144,
                           tied=False, experts=32, used=8, expert_inter=768),
    "gemma3-1b": dict(arch="gemma3", hidden=1152, layers=26, heads=4, kv=1, head_dim=256, inter=6912, tied=True,
                      window=512),
    "gptoss-mini": dict(arch="gpt-oss", hidden=2880, layers=8, heads=64, kv=8, head_dim=64, inter=2880, tied=False,
                        window=128, experts=32, used=4, expert_inter=2880),
}
def copy_tokenizer(r, w):
    for key, f in r.fields.items():
        if not key.startswith("tokenizer."):
            continue
        vt, val = f.types[0], f.contents()
        {gguf.GGUFValueType.ARRAY: w.add_array, gguf.GGUFValueType.STRING: w.add_string,
         gguf.GGUFValueType.UINT32: w.add_uint32, gguf.GGUFValueType.INT32: w.add_int32,
         gguf.GGUFValueType.BOOL: w.add_bool}[vt](key, val)


if sys.argv[1] == "--donor-only":
    w = gguf.GGUFWriter(sys.argv[3], "qwen2")
    copy_tokenizer(gguf.GGUFReader(sys.argv[2]), w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    sys.exit(0)
donor, out, name = sys.argv[1], sys.argv[2], sys.argv[3]
dtype = sys.argv[4] if len(sys.argv) > 4 else "f16"
s = SHAPES[name]
arch, hidden, layers, heads, kv, hd = s["arch"], s["hidden"], s["layers"], s["heads"], s["kv"], s["head_dim"]
vocab = 151936
r = gguf.GGUFReader(donor)
w = gguf.GGUFWriter(out, arch)
w.add_name(f"random {name} shape")
w.add_context_length(32768)
w.add_embedding_length(hidden)
w.add_block_count(layers)
w.add_feed_forward_length(s["inter"])
w.add_head_count(heads)
w.add_head_count_kv(kv)
w.add_key_length(hd)
w.add_value_length(hd)
w.add_rope_dimension_count(hd)
w.add_rope_freq_base({"llama": 500000.0, "gpt-oss": 150000.0}.get(arch, 1e6))
if arch == "gpt-oss":
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(32.0)
    w.add_rope_scaling_orig_ctx_len(4096)
w.add_layer_norm_rms_eps(1e-6)
w.add_file_type({"bf16": gguf.LlamaFileType.MOSTLY_BF16, "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
                 "q4_k_m": gguf.LlamaFileType.MOSTLY_Q4_K_M}.get(dtype, gguf.LlamaFileType.MOSTLY_F16))
if "window" in s:
    w.add_sliding_window(s["window"])
if "experts" in s:
    w.add_expert_count(s["experts"])
    w.add_expert_used_count(s["used"])
    w.add_expert_feed_forward_length(s["expert_inter"])
copy_tokenizer(r, w)

rng = np.random.default_rng(7)


Q = gguf.GGMLQuantizationType
# Per block: (the f16 scale's byte offset, the f16 min's offset or None, min / scale to centre
# the values on zero) for the formats random blocks are written in.
SCALES = {Q.Q8_0: (0, None, 0), Q.Q5_0: (0, None, 0), Q.Q6_K: (208, None, 0), Q.Q4_K: (0, 2, 7.5)}


def block_type(key, cols):
    """The type llama-quantize's Q4_K_M (or Q8_0) mix gives this matrix."""
    if dtype == "q8_0":
        return Q.Q8_0
    layer = int(key.split(".")[1]) if key.startswith("blk.") else -1
    more = layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2
    six = key == "token_embd.weight" or key == "output.weight" or (
        more and key.endswith(("attn_v.weight", "ffn_down.weight", "ffn_down_exps.weight")))
    if cols % 256:
        return Q.Q8_0 if six else Q.Q5_0
    return Q.Q6_K if six else Q.Q4_K


def random_blocks(key, x):
    """x's shape in random blocks whose values spread as x's do (the values themselves unused)."""
    qt = block_type(key, x.shape[-1])
    block, size = gguf.GGML_QUANT_SIZES[qt]
    rows = int(np.prod(x.shape[:-1]))
    raw = rng.integers(0, 256, (rows, x.shape[-1] // block * size), dtype=np.uint8)
    blocks = raw.reshape(rows, -1, size)
    at, min_at, ratio = SCALES[qt]

    def set_scales(d):
        blocks[:, :, at:at + 2] = np.frombuffer(np.float16(d).tobytes(), np.uint8)
        if min_at is not None:
            blocks[:, :, min_at:min_at + 2] = np.frombuffer(np.float16(d * ratio).tobytes(), np.uint8)

    set_scales(1e-3)
    probe = gguf.quants.dequantize(raw[:64], qt)
    set_scales(1e-3 * float(x.std()) / float(probe.std()))
    w.add_tensor(key, raw.reshape(*x.shape[:-1], -1), raw_dtype=qt)


def mxfp4_blocks(key, shape):
    """A 3-D expert tensor in MXFP4 with random values (gpt-oss's experts, as released): E8M0
    scales near 2^-8, so values spread about as a 16-bit file's."""
    *outer, cols = shape
    rows = int(np.prod(outer))
    raw = rng.integers(0, 256, (rows, cols // 32, 17), dtype=np.uint8)
    raw[:, :, 0] = rng.integers(118, 122, (rows, cols // 32), dtype=np.uint8)
    w.add_tensor(key, raw.reshape(*outer, -1), raw_dtype=Q.MXFP4)


def add(key, x):
    """A matrix in the file's type (f32 for vectors and the router, as llama.cpp writes)."""
    if x.dtype == np.float32 and x.ndim > 1 and dtype in ("q8_0", "q4_k_m"):
        random_blocks(key, x)
    elif x.dtype == np.float32 and x.ndim > 1 and dtype == "bf16":
        w.add_tensor(key, gguf.quants.quantize(x, gguf.GGMLQuantizationType.BF16),
                     raw_dtype=gguf.GGMLQuantizationType.BF16)
    elif x.dtype == np.float32 and x.ndim > 1:
        w.add_tensor(key, x.astype(np.float16))
    else:
        w.add_tensor(key, x.astype(np.float32))


class Spread:
    """A matrix's shape and spread with no values: all random blocks need (a 16-bit file's
    values would take minutes and gigabytes for the MoE shape)."""
    dtype, ndim = np.float32, 2

    def __init__(self, shape, std):
        self.shape, self._std = shape, std

    def std(self):
        return self._std


def normal(shape, std):
    if dtype in ("q8_0", "q4_k_m"):
        return Spread(shape, std)
    return rng.standard_normal(shape, dtype=np.float32) * np.float32(std)


lin = lambda *shape, scale=1.0: normal(shape, scale / np.sqrt(shape[-1]))
router = lambda *shape: rng.standard_normal(shape, dtype=np.float32) / np.float32(np.sqrt(shape[-1]))
norm = lambda n: rng.uniform(0.5, 1.5, n).astype(np.float32)
bias = lambda n: (rng.standard_normal(n, dtype=np.float32) * 0.25).astype(np.float32)

add("token_embd.weight", normal((vocab, hidden), 1.0))
if arch == "llama":  # Llama 3.2's llama3 scaling (factor 32, 1 / 4, 8192), as llama.cpp writes it
    freqs = 1.0 / (500000.0 ** (np.arange(0, hd, 2, dtype=np.float32) / hd))
    wavelen = 2 * np.pi / freqs
    smooth = (8192 / wavelen - 1.0) / (4.0 - 1.0)
    factors = np.where(wavelen < 8192 / 4.0, 1.0, np.where(wavelen > 8192 / 1.0, 32.0, 1 / ((1 - smooth) / 32.0 + smooth)))
    add("rope_freqs.weight", factors.astype(np.float32))
for l in range(layers):
    p = f"blk.{l}."
    add(p + "attn_norm.weight", norm(hidden))
    for part, rows in (("q", heads * hd), ("k", kv * hd), ("v", kv * hd)):
        add(p + f"attn_{part}.weight", lin(rows, hidden))
        if arch in ("qwen2", "gpt-oss"):
            add(p + f"attn_{part}.bias", bias(rows))
    if arch in ("qwen3", "qwen3moe", "gemma3"):
        add(p + "attn_q_norm.weight", norm(hd))
        add(p + "attn_k_norm.weight", norm(hd))
    add(p + "attn_output.weight", lin(hidden, heads * hd, scale=4.0))
    if arch == "gpt-oss":
        add(p + "attn_output.bias", bias(hidden))
        add(p + "attn_sinks.weight", bias(heads))
    # gpt-oss's converter names the feed-forward's input norm after Hugging Face's.
    add(p + ("post_attention_norm.weight" if arch == "gpt-oss" else "ffn_norm.weight"), norm(hidden))
    if arch == "gemma3":
        add(p + "post_attention_norm.weight", norm(hidden))
        add(p + "post_ffw_norm.weight", norm(hidden))
    if arch == "gpt-oss":
        e, i = s["experts"], s["expert_inter"]
        w.add_tensor(p + "ffn_gate_inp.weight", router(e, hidden))
        add(p + "ffn_gate_inp.bias", bias(e))
        for part, shape in (("gate", (e, i, hidden)), ("up", (e, i, hidden)), ("down", (e, hidden, i))):
            mxfp4_blocks(p + f"ffn_{part}_exps.weight", shape)
            w.add_tensor(p + f"ffn_{part}_exps.bias", bias(shape[0] * shape[1]).reshape(shape[:2]))
    elif "experts" in s:
        e, i = s["experts"], s["expert_inter"]
        w.add_tensor(p + "ffn_gate_inp.weight", router(e, hidden))
        add(p + "ffn_gate_exps.weight", lin(e, i, hidden))
        add(p + "ffn_up_exps.weight", lin(e, i, hidden))
        add(p + "ffn_down_exps.weight", lin(e, hidden, i, scale=4.0))
    else:
        add(p + "ffn_gate.weight", lin(s["inter"], hidden))
        add(p + "ffn_up.weight", lin(s["inter"], hidden))
        add(p + "ffn_down.weight", lin(hidden, s["inter"], scale=4.0))
add("output_norm.weight", norm(hidden))
if not s["tied"]:
    add("output.weight", lin(vocab, hidden, scale=4.0))
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
print(f"wrote {out}: {arch}, {name} shape, random weights")
