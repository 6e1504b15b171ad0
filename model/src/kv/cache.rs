//! C6: the KV cache of one model instance: per-layer key and value tensors over a fixed pool of
//! cells, plus the cell metadata. The cache never evicts by itself; capacity is set at creation.
//! Keys and values are stored in a [`KvDtype`] (16-bit on the CPU by default, or q8_0 blocks)
//! and computed with in f32: written narrowed, read widened.

use burn::tensor::{DType, Device, FloatDType, Tensor, TensorData};
use half::f16;

use super::cells::{KvCells, Pos, PosRange, SeqId, SeqSet};
use super::recurrent::{Recurrent, RecurrentLayout};
use crate::error::KvError;
use crate::kernels::{self, CellTable, GpuWeight, Pre, QkNorms, kv_q8};

/// The shape of what a model caches per token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvLayout {
    /// Layers with keys and values (a hybrid model's full-attention layers).
    pub layers: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    /// The linear-attention layers' per-sequence state, for a model that has them.
    pub recurrent: Option<RecurrentLayout>,
    /// The values are the keys' rows (latent attention's cached latent): no value tensors are
    /// kept, and attention reads the keys as both.
    pub values_are_keys: bool,
}

/// The element type of the cached keys and values (llama.cpp's `--cache-type-k/v`). Attention
/// always accumulates in f32; 16 bits halve the cache's memory and the bytes each step reads,
/// q8_0 (blocks of 32 bytes and an f16 scale, the CPU only) takes 53% of 16 bits'.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KvDtype {
    F32,
    F16,
    BF16,
    Q8_0,
}

impl KvDtype {
    pub const ALL: [KvDtype; 4] = [Self::F32, Self::F16, Self::BF16, Self::Q8_0];

    /// The default on `device`: f16 (as llama.cpp's) where the device computes in it: the CPU,
    /// whose attention kernel widens it as it loads, and a GPU with 16-bit floats, whose KV
    /// write stores it and cell attention widens it (half the bytes a step reads from the
    /// cache; on an H200 the greedy tokens of 640 positions were those of an f32 cache); f32
    /// on a GPU without (Mesa's llvmpipe through GL).
    pub fn default_for(device: &Device) -> Self {
        let f16 = *device == Device::flex() || device.supports_dtype(DType::F16);
        if f16 { Self::F16 } else { Self::F32 }
    }
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::F16 => "f16",
            Self::BF16 => "bf16",
            Self::Q8_0 => "q8_0",
        }
    }
    /// A setting's value: a dtype's name, or `auto` (`None`: the device's default).
    pub fn parse_setting(s: &str) -> Result<Option<Self>, String> {
        if s == "auto" { Ok(None) } else { s.parse().map(Some) }
    }
    /// Stored elements of a cell's row of `d` values (q8_0: its blocks' 16-bit words).
    fn width(self, d: usize) -> usize {
        match self {
            Self::Q8_0 => kv_q8::row_words(d),
            _ => d,
        }
    }
    /// The element type of the cache's tensors (q8_0 keeps its blocks in f16 words).
    pub fn dtype(self) -> DType {
        self.float().into()
    }
    fn float(self) -> FloatDType {
        match self {
            Self::F32 => FloatDType::F32,
            Self::F16 | Self::Q8_0 => FloatDType::F16,
            Self::BF16 => FloatDType::BF16,
        }
    }
}

impl std::fmt::Display for KvDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl serde::Serialize for KvDtype {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> serde::Deserialize<'de> for KvDtype {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?.parse().map_err(serde::de::Error::custom)
    }
}

impl std::str::FromStr for KvDtype {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|t| t.name().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| format!("unknown KV cache dtype '{s}' (f32, f16, bf16, q8_0)"))
    }
}

/// Keys and values of every layer for `capacity` cells.
#[derive(Debug)]
pub struct KvCache {
    cells: KvCells,
    layout: KvLayout,
    dtype: KvDtype,
    /// [layers] each [kv_heads, capacity, head_dim] in `dtype` (q8_0: [kv_heads, capacity,
    /// kv_q8::row_words(head_dim)] f16 words holding each row through `kv_q8`'s rotation); keys
    /// are stored with RoPE applied.
    keys: Vec<Tensor<3>>,
    /// [layers] each as `keys`.
    values: Vec<Tensor<3>>,
    device: Device,
    /// Which buffers `keys` and `values` are: this cache's own number, and how many times a
    /// write may have put a new buffer in their place (a replayed step records them).
    buffers: (u64, u64),
    /// The linear-attention layers' states, for a model that has them.
    recurrent: Option<Recurrent>,
}

/// The next cache's number.
static CACHES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl KvCache {
    /// A cache of `capacity` cells for sequences whose positions stay below `n_pos`, in the
    /// device's default dtype.
    pub fn new(layout: KvLayout, capacity: usize, n_pos: usize, device: &Device) -> Self {
        Self::with_dtype(layout, capacity, n_pos, device, KvDtype::default_for(device))
    }

    /// A cache that stores its keys and values in `dtype`.
    pub fn with_dtype(layout: KvLayout, capacity: usize, n_pos: usize, device: &Device, dtype: KvDtype) -> Self {
        let shape = [layout.kv_heads, capacity, dtype.width(layout.head_dim)];
        let d: DType = dtype.float().into();
        let zeros = |layers: usize| (0..layers).map(|_| Tensor::<3>::zeros(shape, (device, d))).collect();
        Self {
            cells: KvCells::new(capacity, n_pos),
            layout,
            dtype,
            keys: zeros(layout.layers),
            values: zeros(if layout.values_are_keys { 0 } else { layout.layers }),
            device: device.clone(),
            buffers: (CACHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed), 0),
            recurrent: layout.recurrent.map(Recurrent::new),
        }
    }

    /// Which buffers the cache's layers are in: equal between two calls only if no write
    /// between them may have replaced one (what a recorded step relies on).
    pub(crate) fn buffers(&self) -> (u64, u64) {
        self.buffers
    }

    pub fn cells(&self) -> &KvCells {
        &self.cells
    }
    pub(crate) fn cells_mut(&mut self) -> &mut KvCells {
        &mut self.cells
    }
    pub fn layout(&self) -> KvLayout {
        self.layout
    }
    pub fn dtype(&self) -> KvDtype {
        self.dtype
    }
    pub fn capacity(&self) -> usize {
        self.cells.capacity()
    }
    pub fn used(&self) -> usize {
        self.cells.used()
    }
    /// Bytes held by the key and value tensors, and by the linear-attention states of the
    /// sequences now held (with their checkpoints).
    pub fn size_bytes(&self) -> usize {
        let row = self.dtype.width(self.layout.head_dim) * self.dtype.dtype().size();
        let states = self.recurrent.as_ref().map_or(0, Recurrent::size_bytes);
        let tensors = if self.layout.values_are_keys { 1 } else { 2 };
        tensors * self.layout.layers * self.layout.kv_heads * self.capacity() * row + states
    }

    /// The linear-attention layers' states, for a model that has them.
    pub fn recurrent(&mut self) -> Option<&mut Recurrent> {
        self.recurrent.as_mut()
    }

    // Sequence operations (C6); see `KvCells` for their contracts, and `Recurrent` for what
    // a model with linear attention refuses (then nothing changes).
    pub fn seq_rm(&mut self, seq: SeqId, range: impl Into<PosRange>) -> Result<(), KvError> {
        let range = range.into();
        let cut = self.recurrent.as_ref().map(|r| r.check_rm(seq, range)).transpose()?;
        self.cells.seq_rm(seq, range)?;
        if let (Some(cut), Some(r)) = (cut, &mut self.recurrent) {
            r.cut(seq, cut);
        }
        Ok(())
    }
    pub fn seq_cp(&mut self, src: SeqId, dst: SeqId, range: impl Into<PosRange>) -> Result<(), KvError> {
        let range = range.into();
        let state = self.recurrent.as_ref().map(|r| r.check_cp(src, range)).transpose()?.flatten();
        self.cells.seq_cp(src, dst, range)?;
        if let (Some(len), Some(r)) = (state, &mut self.recurrent) {
            r.copy(src, dst, len);
        }
        Ok(())
    }
    /// Keeps a copy of `seq`'s linear-attention state once it holds `len` tokens (now, or in
    /// the pass that gets it there), for `seq_rm` and `seq_cp` to go back to
    /// (`Recurrent::checkpoint`); nothing for a model without one.
    pub fn seq_checkpoint(&mut self, seq: SeqId, len: Pos) {
        if let Some(r) = &mut self.recurrent {
            r.checkpoint(seq, len);
        }
    }
    pub fn seq_keep(&mut self, seq: SeqId) -> Result<(), KvError> {
        self.cells.seq_keep(seq)?;
        if let Some(r) = &mut self.recurrent {
            r.keep(seq);
        }
        Ok(())
    }
    pub fn seq_add(&mut self, seq: SeqId, range: impl Into<PosRange>, delta: Pos) -> Result<(), KvError> {
        if let Some(r) = &self.recurrent {
            r.check_add(seq)?;
        }
        self.cells.seq_add(seq, range, delta)
    }
    pub fn seq_pos_max(&self, seq: SeqId) -> Option<Pos> {
        self.cells.seq_pos_max(seq)
    }
    pub fn seq_pos_min(&self, seq: SeqId) -> Option<Pos> {
        self.cells.seq_pos_min(seq)
    }
    pub fn clear(&mut self) {
        self.cells.clear();
        if let Some(r) = &mut self.recurrent {
            r.clear();
        }
    }
    /// One line per used cell: `cell → (seq ids, pos)`.
    pub fn dump(&self) -> String {
        self.cells.dump()
    }

    /// Writes a batch's keys and values of `layer` into the cells `cells` places them in: one
    /// kernel on a GPU, else a slice assignment per run of consecutive cells.
    /// `k`, `v`: [kv_heads, n_tokens, head_dim].
    /// Where the values are the keys (`KvLayout::values_are_keys`), `v` is not written.
    pub(crate) fn write(&mut self, layer: usize, cells: &CellTable, k: Tensor<3>, v: Tensor<3>) {
        let shared = self.layout.values_are_keys;
        if cells.on_gpu() && self.dtype != KvDtype::Q8_0 && !shared {
            let mut caches = [self.keys[layer].extract(), self.values[layer].extract()];
            let written = kernels::kv_write(&mut caches, [&k, &v], cells);
            [self.keys[layer], self.values[layer]] = caches;
            if written {
                return;
            }
        }
        // Slice assignments copy a buffer another tensor shares.
        self.buffers.1 += 1;
        let placement = &cells.placement;
        let (k, v) = (self.stored(k), (!shared).then(|| self.stored(v)));
        let [h, _, w] = k.dims();
        let part = |x: &Tensor<3>, t0: usize, len: usize| match len == placement.cells.len() {
            true => x.clone(),
            false => x.clone().slice([0..h, t0..t0 + len, 0..w]),
        };
        for (c0, t0, len) in placement.runs() {
            let ks = part(&k, t0, len);
            self.keys[layer].inplace(|t| t.slice_assign([0..h, c0..c0 + len, 0..w], ks));
            if let Some(v) = &v {
                let vs = part(v, t0, len);
                self.values[layer].inplace(|t| t.slice_assign([0..h, c0..c0 + len, 0..w], vs));
            }
        }
    }

    /// RoPE and the write of `layer`'s keys and values in one GPU launch, from the stacked q/k/v
    /// projection `qkv` ([n, (heads + 2 · kv_heads) · head_dim]; `tables` [2, n, head_dim/2] cos
    /// and sin), with `norms` q's and k's heads normalised first: q's heads rotated, [n, heads ·
    /// head_dim]; `None`, nothing written, where the kernel declines (the caller rotates and
    /// calls [`Self::write`]).
    pub(crate) fn write_rotated(
        &mut self,
        layer: usize,
        cells: &CellTable,
        qkv: &Tensor<2>,
        heads: usize,
        tables: &Tensor<3>,
        norms: Option<QkNorms<'_>>,
    ) -> Option<Tensor<2>> {
        if self.dtype == KvDtype::Q8_0 || self.layout.values_are_keys {
            return None;
        }
        let mut caches = [self.keys[layer].extract(), self.values[layer].extract()];
        let q = kernels::rope_kv_write(qkv, heads, self.layout.head_dim, tables, norms, &mut caches, cells);
        [self.keys[layer], self.values[layer]] = caches;
        q
    }

    /// The q/k/v projection of `x` by the weight `w` (after `pre`, plus `bias`), RoPE and
    /// the write of `layer`'s keys and values in one GPU launch: q's heads rotated, [n, heads ·
    /// head_dim]; `None`, nothing written, where the kernel declines (more rows than a decode
    /// step's: the caller projects, then [`Self::write_rotated`]).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn project_rotated(
        &mut self,
        layer: usize,
        cells: &CellTable,
        x: &Tensor<2>,
        pre: Pre<'_>,
        w: GpuWeight<'_>,
        bias: Option<&Tensor<1>>,
        heads: usize,
        tables: &Tensor<3>,
    ) -> Option<Tensor<2>> {
        if self.dtype == KvDtype::Q8_0 || self.layout.values_are_keys {
            return None;
        }
        let mut caches = [self.keys[layer].extract(), self.values[layer].extract()];
        let d = self.layout.head_dim;
        let q = kernels::project_rope_kv_write(x, pre, w, bias, heads, d, tables, &mut caches, cells);
        [self.keys[layer], self.values[layer]] = caches;
        q
    }

    /// Keys and values of `layer` for cells `[0, extent)`, widened to f32: [kv_heads, extent,
    /// head_dim] each.
    pub(crate) fn read(&self, layer: usize, extent: usize) -> (Tensor<3>, Tensor<3>) {
        let [h, _, w] = self.keys[layer].dims();
        let d = self.layout.head_dim;
        let read = |t: &Tensor<3>| {
            let stored = t.clone().slice([0..h, 0..extent, 0..w]);
            if self.dtype != KvDtype::Q8_0 {
                return stored.cast(FloatDType::F32);
            }
            let words = stored.into_data().try_into_vec::<f16>().expect("a q8_0 cache holds f16 words");
            Tensor::from_data(TensorData::new(kv_q8::dequantize_rows(&words, d), [h, extent, d]), &self.device)
        };
        let keys = read(&self.keys[layer]);
        match self.layout.values_are_keys {
            true => (keys.clone(), keys),
            false => (keys, read(&self.values[layer])),
        }
    }

    /// f32 keys or values [kv_heads, n, head_dim] as the cache stores them.
    fn stored(&self, x: Tensor<3>) -> Tensor<3> {
        if self.dtype != KvDtype::Q8_0 {
            return x.cast(self.dtype.float());
        }
        let [h, n, d] = x.dims();
        let values = x.into_data().convert::<f32>().try_into_vec::<f32>().expect("converted to f32");
        let words = kv_q8::quantize_rows(&values, d);
        Tensor::from_data(TensorData::new(words, [h, n, kv_q8::row_words(d)]), (&self.device, DType::F16))
    }

    /// Attention of `q` ([n, heads, head_dim], RoPE applied) over the cells of `layer` each row
    /// of `cells` sees, by the device's kernel reading the cache as stored: [n, heads ·
    /// head_dim]; `None` where no kernel takes it (the caller reads the cache widened). Scores
    /// soft-capped at `softcap`, each head's softmax with its sink where given (`sinks`:
    /// \[heads\]).
    pub(crate) fn attention(
        &self,
        layer: usize,
        q: &Tensor<3>,
        cells: &CellTable,
        softcap: Option<f64>,
        sinks: Option<&kernels::Sinks>,
    ) -> Option<Tensor<2>> {
        let q8 = self.dtype == KvDtype::Q8_0;
        let values = if self.layout.values_are_keys { &self.keys[layer] } else { &self.values[layer] };
        kernels::attention(q, &self.keys[layer], values, q8, cells, softcap, sinks)
    }

    /// Replaces the keys of `layer` for cells `[0, extent)` (used to re-rotate shifted keys).
    pub(crate) fn set_keys(&mut self, layer: usize, keys: Tensor<3>) {
        self.buffers.1 += 1;
        let keys = self.stored(keys);
        let [h, extent, w] = keys.dims();
        self.keys[layer].inplace(|t| t.slice_assign([0..h, 0..extent, 0..w], keys));
    }

    /// [n_tokens] the cells below `extent` each token sees, in cell order.
    pub(crate) fn visible(&self, seqs: &[SeqSet], pos: &[Pos], extent: usize) -> Vec<Vec<u32>> {
        let sees = |set, p| (0..extent).filter(move |&c| self.cells.is_visible(c, set, p)).map(|c| c as u32);
        seqs.iter().zip(pos).map(|(set, &p)| sees(set, p).collect()).collect()
    }

    /// `visible` ([`Self::visible`]: each token's cells) narrowed to those of each token's last
    /// `window` positions (a local layer's).
    pub(crate) fn within_window(&self, visible: &[Vec<u32>], pos: &[Pos], window: usize) -> Vec<Vec<u32>> {
        let near = |cells: &[u32], p: Pos| -> Vec<u32> {
            cells.iter().copied().filter(|&c| self.cells.in_window(c as usize, p, window)).collect()
        };
        visible.iter().zip(pos).map(|(cells, &p)| near(cells, p)).collect()
    }

    /// Additive attention mask [n_tokens, extent] from [`Self::visible`]: 0 where a token sees
    /// a cell, −∞ elsewhere.
    pub(crate) fn mask(&self, visible: &[Vec<u32>], extent: usize) -> Tensor<2> {
        let mut mask = vec![f32::NEG_INFINITY; visible.len() * extent];
        for (t, cells) in visible.iter().enumerate() {
            for &c in cells {
                mask[t * extent + c as usize] = 0.0;
            }
        }
        crate::transfers::upload(TensorData::new(mask, [visible.len(), extent]), &self.device)
    }
}
