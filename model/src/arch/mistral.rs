//! Mistral (`MistralForCausalLM`: Mistral 7B, Mistral Nemo, and models fine-tuned from them):
//! Llama's layers (no biases, grouped-query attention, SwiGLU), its own end-of-turn token, and
//! attention over a sliding window of `sliding_window` tokens where the config sets one. Within
//! the window that is full attention, so such a model is served with its context capped at the
//! window (`Architecture::window_caps_context`), exact; v0.2 and later set none. Its GGUF files
//! say `llama` and are served as Llama (their SentencePiece or Tekken tokenizers: `gguf::tokenizer`).
//! Its tool calls are `[TOOL_CALLS]` and a JSON array (`CallSyntax::JsonArray`).

use super::Architecture;
use super::llama::LLAMA;

pub const MISTRAL: Architecture = Architecture {
    name: "mistral",
    gguf: "mistral",
    hf_class: "MistralForCausalLM",
    gguf_qk_interleaved: false,
    end_of_generation: &["</s>"],
    window_caps_context: true,
    gguf_mrope_interleaved: false,
    ..LLAMA
};
