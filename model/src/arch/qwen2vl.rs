//! Qwen2-VL and Qwen2.5-VL (the language model of `Qwen2VLForConditionalGeneration` and
//! `Qwen2_5_VLForConditionalGeneration` checkpoints, `qwen2_vl` and `qwen2_5_vl`, their text
//! configs `*_text`; GGUF `qwen2vl`): Qwen2's layers. Its rotary embedding is M-RoPE
//! (`mrope_section`: the first pairs turned by the temporal position, the next by the height's,
//! the last by the width's), which for text, whose three position streams are one, turns each
//! pair as Qwen2's does. The released checkpoints keep the language model under `model.` with a
//! flat config; transformers 5 saves it under `model.language_model.` with a nested one; both
//! load. Its vision tower is `crate::vision`'s: the checkpoint's (`visual.`, `model.visual.`), or a
//! GGUF file's projector file (`mmproj`), whose M-RoPE sections are `rope.dimension_sections`.

use super::Architecture;
use super::qwen2::QWEN2;

pub const QWEN2_VL: Architecture =
    Architecture { name: "qwen2_vl", gguf: "qwen2vl", hf_class: "Qwen2VLForConditionalGeneration", ..QWEN2 };
