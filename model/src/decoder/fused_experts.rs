//! A checkpoint whose experts are kept in 3-D tensors, one per layer and matrix, read as one
//! tensor per expert under the decoder's names (`mlp.experts.{e}.gate_proj.weight`, [width,
//! hidden], ...), so its experts load as any other family's. Three layouts (`arch::Fused3d`):
//! gpt-oss's `mlp.experts.gate_up_proj` [experts, hidden, 2 · width] with each expert's gate and
//! up columns interleaved, `down_proj` [experts, width, hidden], their biases [experts,
//! outputs]; Qwen3-VL-MoE's, the same but the gate's columns before the up's; and transformers'
//! own (Mistral 4's), [experts, outputs, inputs], `gate_up_proj`'s gate rows before its up rows.
//!
//! OpenAI's released checkpoints hold the matrices in MXFP4 instead: `*_blocks` [experts,
//! outputs, inputs / 32, 16] and `*_scales` [experts, outputs, inputs / 32], bytes, rows already
//! [out, in]. Those are read as ggml's MXFP4 blocks (the same values, another nibble order), so
//! the experts stay in their 4.25 bits on the CPU and on a GPU.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use burn::tensor::{DType, TensorData};

use super::weights::{Slot, expert_name};
use crate::arch::Fused3d;
use crate::checkpoint::Checkpoint;
use crate::config::ModelConfig;
use crate::error::LoadError;
use crate::quant::{self, QuantType, mxfp4_from_pairs};
use crate::tensors::{self, Naming, Stored, TensorSource};

/// Where one expert's tensor lies in the stored ones.
#[derive(Debug, Clone)]
struct Part {
    /// The stored tensor's name without its suffix (`model.layers.0.mlp.experts.gate_up_proj`).
    stem: String,
    expert: usize,
    /// The expert's outputs are the stored ones `first`, `first + step`, ... (interleaved gate:
    /// even, up: odd; in halves, up's first is the width).
    first: usize,
    step: usize,
    /// The stored tensor is [experts, outputs, inputs] (transformers' layout), not [experts,
    /// inputs, outputs] (gpt-oss's).
    rows_first: bool,
    /// The expert's tensor: [outputs, inputs], or [outputs] for a bias (`inputs` 0).
    outputs: usize,
    inputs: usize,
    /// The matrix is in MXFP4 (`{stem}_blocks`, `{stem}_scales`).
    mxfp4: bool,
}

/// A stored tensor read once for all the experts in it.
enum Read {
    Values(Vec<f32>),
    Bytes(Vec<u8>),
}

/// The checkpoint with its fused experts as one tensor each (see the module's note).
pub struct FusedExperts {
    inner: Checkpoint,
    /// The decoder's name of each expert's tensor.
    parts: BTreeMap<String, Part>,
    /// The stored names the parts replace.
    fused: BTreeSet<String>,
    /// The stored tensors read last (a layer's experts are loaded one after another: each is read
    /// once, not once an expert); at most two, an MXFP4 matrix's blocks and scales.
    last: Mutex<Vec<(String, Arc<Read>)>>,
}

impl FusedExperts {
    /// `inner` read as config `c`'s experts, where it fuses them; `Err(inner)` where it has no
    /// fused experts.
    pub fn new(inner: Checkpoint, c: &ModelConfig) -> Result<Self, Checkpoint> {
        let Some(m) = c.moe.as_ref() else { return Err(inner) };
        let (h, w) = (c.hidden_size, m.intermediate_size);
        let layout = c.arch.experts.as_ref().and_then(|e| e.fused_3d).unwrap_or(Fused3d::Interleaved);
        let gate_up = match layout {
            Fused3d::Interleaved => [(Slot::ExpertGate, 0, 2), (Slot::ExpertUp, 1, 2)],
            Fused3d::Halves | Fused3d::RowHalves => [(Slot::ExpertGate, 0, 1), (Slot::ExpertUp, w, 1)],
        };
        let names = inner.names();
        let mut parts = BTreeMap::new();
        let mut fused = BTreeSet::new();
        for l in 0..c.num_hidden_layers {
            let stem = |m: &str| format!("model.layers.{l}.mlp.experts.{m}");
            // (the stored matrix, the decoder's slots with their first output and step, inputs)
            let matrices = [
                ("gate_up_proj", gate_up.as_slice(), h, w),
                ("down_proj", [(Slot::ExpertDown, 0, 1)].as_slice(), w, h),
            ];
            for (matrix, slots, inputs, outputs) in matrices {
                let stem = stem(matrix);
                let mxfp4 = names.contains(format!("{stem}_blocks").as_str());
                if !mxfp4 && !names.contains(stem.as_str()) {
                    continue;
                }
                fused.extend(if mxfp4 {
                    vec![format!("{stem}_blocks"), format!("{stem}_scales")]
                } else {
                    vec![stem.clone()]
                });
                let bias = names.contains(format!("{stem}_bias").as_str());
                if bias {
                    fused.insert(format!("{stem}_bias"));
                }
                for &(slot, first, step) in slots {
                    let bias_slot = match slot {
                        Slot::ExpertGate => Slot::ExpertGateBias,
                        Slot::ExpertUp => Slot::ExpertUpBias,
                        _ => Slot::ExpertDownBias,
                    };
                    for e in 0..m.experts {
                        let rows_first = layout == Fused3d::RowHalves;
                        let part =
                            Part { stem: stem.clone(), expert: e, first, step, rows_first, outputs, inputs, mxfp4 };
                        if bias {
                            parts
                                .insert(expert_name(bias_slot, l, e), Part { inputs: 0, mxfp4: false, ..part.clone() });
                        }
                        parts.insert(expert_name(slot, l, e), part);
                    }
                }
            }
        }
        if parts.is_empty() {
            return Err(inner);
        }
        Ok(Self { inner, parts, fused, last: Mutex::new(Vec::new()) })
    }

    /// Stored tensor `name`, read once for the experts in it.
    fn read(&self, name: &str, bytes: bool) -> Result<Arc<Read>, LoadError> {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, read)) = last.iter().find(|(n, _)| n == name) {
            return Ok(read.clone());
        }
        let read = Arc::new(if bytes {
            Read::Bytes(self.inner.bytes(name)?)
        } else {
            let values = self.inner.data(name, DType::F32)?.try_into_vec::<f32>();
            Read::Values(values.map_err(|e| LoadError::Tensor { name: name.into(), reason: format!("{e:?}") })?)
        });
        if last.len() >= 2 {
            last.remove(0);
        }
        last.push((name.into(), read.clone()));
        Ok(read)
    }

    /// An expert's tensor's values, [outputs, inputs] or [outputs].
    fn values(&self, name: &str, p: &Part) -> Result<Vec<f32>, LoadError> {
        let bad = |reason: String| LoadError::Tensor { name: name.into(), reason };
        if p.mxfp4 && p.inputs > 0 {
            let blocks = self.mxfp4(name, p)?;
            let mut out = vec![0.0f32; p.outputs * p.inputs];
            quant::dequantize(QuantType::Mxfp4, &blocks, &mut out);
            return Ok(out);
        }
        let (stored, inputs) = if p.inputs == 0 { (format!("{}_bias", p.stem), 1) } else { (p.stem.clone(), p.inputs) };
        let read = self.read(&stored, false)?;
        let Read::Values(all) = &*read else { return Err(bad("not values".into())) };
        // [experts, inputs, stored outputs] ([experts, stored outputs] for a bias): stored output
        // o of input i at (e · inputs + i) · total + o; or [experts, stored outputs, inputs]:
        // at (e · total + o) · inputs + i.
        let shape = self.inner.shape(&stored).unwrap_or_default();
        let rows_first = p.rows_first && p.inputs > 0;
        let total = match rows_first {
            true => shape.get(1).copied().unwrap_or(0),
            false => shape.last().copied().unwrap_or(0),
        };
        let at = |i: usize, j: usize| match rows_first {
            true => (p.expert * total + p.first + p.step * j) * inputs + i,
            false => (p.expert * inputs + i) * total + p.first + p.step * j,
        };
        let laid_out = p.inputs == 0 || shape.len() == 3 && shape[if rows_first { 2 } else { 1 }] == inputs;
        if !laid_out || (p.expert + 1) * inputs * total > all.len() || p.first + p.step * (p.outputs - 1) >= total {
            return Err(bad(format!("{stored} does not hold expert {}'s {} outputs", p.expert, p.outputs)));
        }
        Ok((0..p.outputs).flat_map(|j| (0..inputs).map(move |i| all[at(i, j)])).collect())
    }

    /// An MXFP4 matrix's rows as ggml's MXFP4 blocks.
    fn mxfp4(&self, name: &str, p: &Part) -> Result<Vec<u8>, LoadError> {
        let bad = |reason: String| LoadError::Tensor { name: name.into(), reason };
        let (blocks, scales) =
            (self.read(&format!("{}_blocks", p.stem), true)?, self.read(&format!("{}_scales", p.stem), true)?);
        let (Read::Bytes(blocks), Read::Bytes(scales)) = (&*blocks, &*scales) else {
            return Err(bad("not bytes".into()));
        };
        let groups = p.inputs / 32;
        let total = self.inner.shape(&format!("{}_scales", p.stem)).and_then(|s| s.get(1).copied()).unwrap_or(0);
        let fits = p.inputs.is_multiple_of(32)
            && scales.len() == blocks.len() / 16
            && scales.len() >= (p.expert + 1) * total * groups
            && p.first + p.step * (p.outputs - 1) < total;
        if !fits {
            return Err(bad(format!(
                "{}_blocks does not hold expert {}'s {} rows of {}",
                p.stem, p.expert, p.outputs, p.inputs
            )));
        }
        let mut mxfp4 = Vec::with_capacity(p.outputs * groups * 17);
        for j in 0..p.outputs {
            let row = (p.expert * total + p.first + p.step * j) * groups;
            for g in row..row + groups {
                let pairs: &[u8; 16] =
                    blocks[16 * g..16 * g + 16].try_into().map_err(|_| bad("a short block".into()))?;
                mxfp4.extend_from_slice(&mxfp4_from_pairs(scales[g], pairs));
            }
        }
        Ok(mxfp4)
    }
}

impl TensorSource for FusedExperts {
    fn naming(&self) -> Naming {
        Naming::Hf
    }

    fn names(&self) -> BTreeSet<&str> {
        let mut names = self.inner.names();
        names.retain(|n| !self.fused.contains(*n));
        names.extend(self.parts.keys().map(String::as_str));
        names
    }

    fn shape(&self, name: &str) -> Option<Vec<usize>> {
        match self.parts.get(name) {
            Some(p) if p.inputs == 0 => Some(vec![p.outputs]),
            Some(p) => Some(vec![p.outputs, p.inputs]),
            None => self.inner.shape(name),
        }
    }

    fn stored(&self, name: &str) -> Option<Result<Stored, String>> {
        match self.parts.get(name) {
            Some(p) if p.mxfp4 => Some(Ok(Stored::Quant(QuantType::Mxfp4))),
            Some(p) if p.inputs == 0 => self.inner.stored(&format!("{}_bias", p.stem)),
            Some(p) => self.inner.stored(&p.stem),
            None => self.inner.stored(name),
        }
    }

    fn data(&self, name: &str, dtype: DType) -> Result<TensorData, LoadError> {
        let Some(p) = self.parts.get(name) else { return self.inner.data(name, dtype) };
        let shape = if p.inputs == 0 { vec![p.outputs] } else { vec![p.outputs, p.inputs] };
        Ok(tensors::convert(self.values(name, p)?, shape, dtype))
    }

    fn blocks(&self, name: &str) -> Option<(QuantType, Cow<'_, [u8]>)> {
        let p = self.parts.get(name).filter(|p| p.mxfp4 && p.inputs > 0)?;
        Some((QuantType::Mxfp4, Cow::Owned(self.mxfp4(name, p).ok()?)))
    }

    fn done(&self, name: &str) {
        if !self.parts.contains_key(name) {
            self.inner.done(name);
        }
    }
}
