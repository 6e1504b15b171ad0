"""Makes the LoRA adapter fixtures in tests/fixtures/lora/: random PEFT adapters of two family
fixtures, each with transformers + PEFT's logits and greedy tokens of the adapted model
(`reference.json`, the family fixtures' format), and one adapter through llama.cpp's own
convert_lora_to_gguf.py (the llama.cpp that PyPI's llama-cpp-python 0.3.36 vendors, fetched
as scripts/convert_fixtures_with_llamacpp.sh fetches it).

- `tiny-llama-lora`: over tiny-llama-f32 (its q and k rows interleaved in GGUF files), every
  projection, the embeddings and the output head adapted, rank 4 (`o_proj` rank 2 through
  `rank_pattern`), alpha 8; `tiny-llama-lora-f32.gguf` is its conversion.
- `tiny-qwen3-lora-rs`: over tiny-qwen3-f32 (tied embeddings, q/k norms), rank-stabilised
  scaling (`use_rslora`: alpha / √r) and `alpha_pattern` (`v_proj`'s alpha 24), the attention
  and the MLP adapted. llama.cpp's converter reads neither option (it writes `lora_alpha`
  alone), so this one has no GGUF.

Needs python3 with torch, transformers, peft, safetensors, numpy (and gguf for the conversion).
Usage: scripts/make_lora_fixtures.py
"""

import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile

import torch
from peft import LoraConfig, get_peft_model
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import make_fixtures as base  # noqa: E402

ROOT = os.path.join(HERE, "..")
FIXTURES = os.path.join(ROOT, "tests", "fixtures")
OUT = os.path.join(FIXTURES, "lora")
LLAMA_CPP = "0.3.36"

ADAPTERS = [
    {
        "name": "tiny-llama-lora",
        "base": "tiny-llama-f32",
        "config": dict(r=4, lora_alpha=8, rank_pattern={"o_proj": 2},
                       target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                       "down_proj", "embed_tokens", "lm_head"]),
        "gguf": "tiny-llama-lora-f32.gguf",
    },
    {
        "name": "tiny-qwen3-lora-rs",
        "base": "tiny-qwen3-f32",
        "config": dict(r=4, lora_alpha=6, use_rslora=True, alpha_pattern={"v_proj": 24},
                       target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                                       "down_proj"]),
    },
]

# Each low-rank factor's values: normal with this standard deviation over the square root of
# its inner dimension, so that the adapted logits move clearly (other greedy tokens) without
# leaving the range the references' margins are checked in.
FACTOR_STD = 0.6


# The top two logits of every prompt position at least this far apart: a merged adapter rounds
# apart from PEFT's unmerged products (PEFT's own merged model moves the Llama fixture's logits
# 1e-5 of their range), which must not change any position's first choice.
MIN_PROMPT_MARGIN = 0.1


def prompt_margin(r):
    return min(t["logits"][0] - t["logits"][1] for t in r["topk"])


def adapted(spec, seed):
    model = AutoModelForCausalLM.from_pretrained(os.path.join(FIXTURES, spec["base"]), dtype=torch.float32)
    peft = get_peft_model(model, LoraConfig(init_lora_weights=False, **spec["config"]))
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_" in name:
                inner = min(p.shape)
                p.copy_(torch.randn(p.shape, generator=gen) * FACTOR_STD / inner ** 0.5)
    return model, peft.eval()


def fetch_converter(work):
    """llama.cpp's convert_lora_to_gguf.py and what it imports, under `work`/llama.cpp."""
    sdist = os.path.join(ROOT, "models", ".download", f"llama_cpp_python-{LLAMA_CPP}.tar.gz")
    if not os.path.exists(sdist):
        os.makedirs(os.path.dirname(sdist), exist_ok=True)
        subprocess.check_call([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary",
                               "llama-cpp-python", "-d", os.path.dirname(sdist), f"llama-cpp-python=={LLAMA_CPP}"])
    prefix = f"llama_cpp_python-{LLAMA_CPP}/vendor/llama.cpp/"
    wanted = ("convert_lora_to_gguf.py", "convert_hf_to_gguf.py", "conversion/", "gguf-py/")
    with tarfile.open(sdist) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix)
                   and m.name[len(prefix):].startswith(wanted)]
        for m in members:
            m.name = "llama.cpp/" + m.name[len(prefix):]
        tar.extractall(work, members=members, filter="data")
    return os.path.join(work, "llama.cpp")


def main():
    shutil.rmtree(OUT, ignore_errors=True)
    os.makedirs(OUT)
    for spec in ADAPTERS:
        tok = Tokenizer.from_file(os.path.join(FIXTURES, spec["base"], "tokenizer.json"))
        base_ref = json.load(open(os.path.join(FIXTURES, spec["base"], "reference.json")))
        prompts = [{"text": p["text"], "ids": p["ids"]} for p in base_ref["prompts"]]
        for seed in range(1000):
            _, model = adapted(spec, seed)
            refs = [dict(p, **base.reference(model, p["ids"])) for p in prompts]
            moved = sum(r["greedy"] != b["greedy"] for r, b in zip(refs, base_ref["prompts"]))
            if moved == len(refs) and all(r["min_margin"] >= base.MIN_MARGIN and len(set(r["greedy"])) >= base.MIN_DISTINCT
                                          and prompt_margin(r) >= MIN_PROMPT_MARGIN for r in refs):
                break
        else:
            sys.exit(f"{spec['name']}: no seed gives clear greedy margins")
        for r in refs:
            r["greedy_text"] = tok.decode(r["greedy"], skip_special_tokens=False)
        out = os.path.join(OUT, spec["name"])
        model.save_pretrained(out, safe_serialization=True)
        os.remove(os.path.join(out, "README.md"))
        # The base as a path within the fixtures, not this machine's.
        cfg_path = os.path.join(out, "adapter_config.json")
        cfg = json.load(open(cfg_path))
        cfg["base_model_name_or_path"] = spec["base"]
        with open(cfg_path, "w") as f:
            json.dump(cfg, f, indent=2, sort_keys=True)
        meta = {"model": f"lora/{spec['name']}", "base": spec["base"], "seed": seed, "top_k": base.TOP_K,
                "torch": torch.__version__, "transformers": __import__("transformers").__version__,
                "peft": __import__("peft").__version__, "prompts": refs}
        with open(os.path.join(out, "reference.json"), "w", encoding="utf-8") as f:
            json.dump(meta, f)
        margins = [round(r["min_margin"], 3) for r in refs]
        print(f"{spec['name']}: seed {seed}, greedy margins {margins}, files {sorted(os.listdir(out))}")
        if "gguf" in spec:
            with tempfile.TemporaryDirectory() as work:
                converter = fetch_converter(work)
                env = dict(os.environ, PYTHONPATH=os.path.join(converter, "gguf-py"))
                subprocess.check_call([sys.executable, os.path.join(converter, "convert_lora_to_gguf.py"),
                                       "--base", os.path.join(FIXTURES, spec["base"]), "--outtype", "f32",
                                       "--outfile", os.path.join(OUT, spec["gguf"]), out], env=env)


if __name__ == "__main__":
    main()
