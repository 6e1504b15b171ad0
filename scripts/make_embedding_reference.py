"""Writes FIXTURE/embeddings.json: reference sentence embeddings of a tiny fixture, computed by
transformers in float64 from the model's last hidden state (after the final norm), pooled by
the last token and by the mean over tokens, L2-normalised. The tests compare llaisys's
/v1/embeddings against it.

Usage: python scripts/make_embedding_reference.py tests/fixtures/tiny-untied-f32 [...]
(needs torch, transformers and tokenizers; CI uses the committed file.)
"""
import json
import sys
from pathlib import Path

import torch
import transformers
from tokenizers import Tokenizer

TEXTS = [
    "The capital of France is Paris.",
    "A cat sat on the mat",
    "def fib(n): return n if n < 2 else fib(n - 1) + fib(n - 2)",
    "x",
    "Embeddings turn text into vectors; similar texts land close together.",
]

for folder in map(Path, sys.argv[1:]):
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    model = transformers.AutoModel.from_pretrained(folder, torch_dtype=torch.float64).eval()
    out = {"model": folder.name, "torch": torch.__version__, "transformers": transformers.__version__, "inputs": []}
    for text in TEXTS:
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        with torch.no_grad():
            hidden = model(torch.tensor([ids])).last_hidden_state[0]  # [n, hidden], after the final norm
        last = torch.nn.functional.normalize(hidden[-1], dim=0)
        mean = torch.nn.functional.normalize(hidden.mean(dim=0), dim=0)
        out["inputs"].append({"text": text, "ids": ids, "last": last.tolist(), "mean": mean.tolist()})
    (folder / "embeddings.json").write_text(json.dumps(out))
    print(folder / "embeddings.json", len(TEXTS), "inputs")
