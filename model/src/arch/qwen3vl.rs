//! Qwen3-VL dense (the language model of `Qwen3VLForConditionalGeneration` checkpoints, its
//! `text_config` `qwen3_vl_text`; GGUF `qwen3vl`): Qwen3's layers. Its rotary embedding is
//! interleaved M-RoPE (`mrope_section`), which for text, whose three position streams are one,
//! turns each pair as Qwen3's does (its GGUF files' `rope.dimension_sections` are interleaved
//! too). Its vision tower and the deepstack features it adds to the first layers' outputs are
//! `crate::vision`'s, from the checkpoint or a GGUF file's projector file (`mmproj`).

use super::Architecture;
use super::qwen3::QWEN3;

pub const QWEN3_VL: Architecture = Architecture {
    name: "qwen3_vl",
    gguf: "qwen3vl",
    hf_class: "Qwen3VLForConditionalGeneration",
    gguf_mrope_interleaved: true,
    ..QWEN3
};
