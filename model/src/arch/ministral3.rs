//! Ministral 3 (`Ministral3ForCausalLM`, the language model of `Mistral3ForConditionalGeneration`
//! checkpoints; GGUF `mistral3`): Mistral's layers with YaRN scaling whose attention factor comes
//! from `mscale` and `mscale_all_dim`, and each query, after the rotary embedding, multiplied by
//! 1 + β · ln(1 + ⌊position / original context⌋) (`llama_4_scaling_beta`: 1 below the original
//! context, so only long contexts feel it). Its GGUF files are written as Llama's (q and k
//! interleaved), with `rope.scaling.yarn_log_multiplier` and `attention.temperature_scale`.

use super::Architecture;
use super::mistral::MISTRAL;

pub const MINISTRAL3: Architecture = Architecture {
    name: "ministral3",
    gguf: "mistral3",
    hf_class: "Ministral3ForCausalLM",
    gguf_qk_interleaved: true,
    gguf_pre: &["tekken"],
    ..MISTRAL
};
