//! The layout the quantized kernels stream (Q3): a weight matrix [n, k] in panels of 16 rows.
//!
//! Within a panel the values of each 32-value group of the 16 rows are interleaved so that one
//! 64-byte vector holds 4 consecutive values of every row, 4 bytes per 32-bit lane: exactly the
//! operand of `vpdpbusd`, which multiplies them by 4 activation bytes broadcast to every lane and
//! adds the 4 products into each row's lane. 4-bit values are stored two per byte (a vector of
//! nibbles holds 8 values per row: values 8v.. in the low nibbles, 8v + 4.. in the high ones);
//! 2- and 3-bit values keep their low two bits four per byte (vector c holds value vectors
//! 4c + j at bits 2j). The high bits are fields in vectors laid out like the 8-bit values': byte
//! j of a field vector holds the high bits of byte j of several value vectors, so a shift and a
//! bitwise select put them in place. 5-bit (and 3-bit) values have one field vector per group,
//! bit u holding the fifth (third) bit of value vector u; 6-bit values have two, with the fifth
//! and sixth bits of value vector 4h + f at bits 2f..2f + 2 of field vector h.
//! IQ4_NL's and MXFP4's nibbles are stored as Q4_0's and stand for their levels (the kernels look
//! them up with `vpshufb`).
//! Scales stay as the file has them (f16 scales; MXFP4's E8M0 bytes; 6-bit K-quant scales
//! widened to bytes, which makes Q4_K 2.8% and Q5_K 2.3% larger than in the file; Q2_K's nibble
//! pairs as they are), interleaved over the 16 rows.
//!
//! A panel is a run of records, one per chunk of the row: two 32-value groups for the 32-value
//! formats, one 256-value super-block for the K-quants. A record is [values of every group]
//! [high-bit fields of every group][scales of every group][super-block scales], padded to 64 bytes
//! (Q6_K: 3360 → 3392 bytes, +1%; Q3_K: 1824 → 1856, which with its widened scales makes it
//! 5.5% larger than in the file). Rows past the end of the matrix and groups past the end of the
//! row are zero (scale 0).

use std::sync::Arc;

use half::f16;
use rayon::prelude::*;

use super::QuantType;
use super::ggml::{self, LevelScale, Params};
use crate::kernels::prefetch::{AHEAD, prefetch};

/// Weight rows per panel.
pub(crate) const PANEL: usize = 16;
/// Values per group (one activation block).
pub(crate) const GROUP: usize = 32;

/// Byte layout of one record (one chunk of a panel).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Layout {
    pub ty: QuantType,
    /// Groups per record.
    pub groups: usize,
    /// Bytes of one group's values: 512 (8-bit), 256 (nibbles) or 128 (the low two bits).
    pub values: usize,
    /// 64-byte vectors of high-bit fields per group: one of 1-bit fields (Q5, Q3_K), two of 2-bit
    /// (Q6_K).
    pub planes: usize,
    /// Bytes of one group's scales over the 16 rows.
    pub scales: usize,
    /// Bytes of the super-block scales (K-quants).
    pub sup: usize,
    /// Record bytes, a multiple of 64.
    pub bytes: usize,
}

impl Layout {
    #[inline]
    pub fn of(ty: QuantType) -> Self {
        let groups: usize = if ty.is_k() { 8 } else { 2 };
        let values = match ty.bits() {
            8 => 512,
            2 | 3 => 128,
            _ => 256,
        };
        let planes = match ty.bits() {
            3 | 5 => 1,
            6 => 2,
            _ => 0,
        };
        let scales = match ty {
            QuantType::Q4_1 | QuantType::Q5_1 => 64,
            QuantType::Mxfp4 => 16,
            _ => 32,
        };
        let sup = match ty {
            QuantType::Q2K | QuantType::Q4K | QuantType::Q5K => 64,
            QuantType::Q3K | QuantType::Q6K => 32,
            _ => 0,
        };
        let bytes = (groups * (values + planes * 64 + scales) + sup).next_multiple_of(64);
        Self { ty, groups, values, planes, scales, sup, bytes }
    }
    /// Values per record.
    pub fn chunk(&self) -> usize {
        self.groups * GROUP
    }
    pub fn values_at(&self, g: usize) -> usize {
        g * self.values
    }
    pub fn plane_at(&self, g: usize, p: usize) -> usize {
        self.groups * self.values + (g * self.planes + p) * 64
    }
    pub fn scales_at(&self, g: usize) -> usize {
        self.groups * (self.values + self.planes * 64) + g * self.scales
    }
    pub fn sup_at(&self) -> usize {
        self.groups * (self.values + self.planes * 64 + self.scales)
    }
}

/// A byte buffer whose start is 64-byte aligned (a cache line: vector loads never straddle two).
/// Buffers of a huge page or more are anonymous maps asked to be backed by transparent huge
/// pages (`MADV_HUGEPAGE`; the kernel's default `madvise` mode gives them only when asked): a
/// decode step streams every weight once, and with 4 KiB pages it takes a TLB miss every 4 KiB
/// and the hardware prefetchers stop at every page's end.
pub(crate) struct Aligned {
    storage: Storage,
    len: usize,
}

enum Storage {
    Heap { buf: Vec<u8>, start: usize },
    Map(memmap2::MmapMut),
}

/// Buffers from this size on are mapped (a huge page).
const MAP_FROM: usize = 2 << 20;

impl Aligned {
    fn zeroed(len: usize) -> Self {
        if len >= MAP_FROM
            && let Ok(map) = memmap2::MmapMut::map_anon(len)
        {
            // Only a hint: where the kernel has no transparent huge pages the map keeps 4 KiB ones.
            #[cfg(target_os = "linux")]
            let _ = map.advise(memmap2::Advice::HugePage);
            return Self { storage: Storage::Map(map), len };
        }
        let buf = vec![0u8; len + 63];
        let start = buf.as_ptr().align_offset(64).min(63);
        Self { storage: Storage::Heap { buf, start }, len }
    }
    pub fn bytes(&self) -> &[u8] {
        match &self.storage {
            Storage::Heap { buf, start } => &buf[*start..*start + self.len],
            Storage::Map(map) => &map[..self.len],
        }
    }
    fn bytes_mut(&mut self) -> &mut [u8] {
        match &mut self.storage {
            Storage::Heap { buf, start } => &mut buf[*start..*start + self.len],
            Storage::Map(map) => &mut map[..self.len],
        }
    }
}

/// One run of rows in one format (a stacked matrix has one part per stacked weight).
#[derive(Clone)]
pub(crate) struct Part {
    pub layout: Layout,
    /// Rows of the part; its output columns are `[col0, col0 + rows)`.
    pub rows: usize,
    pub col0: usize,
    /// Records per panel.
    pub chunks: usize,
    /// [panels, chunks] records, shared by the part's clones: a stacked matrix (q, k and v; gate
    /// and up) takes its weights' parts without copying their bytes (the copy was 5% of a load).
    pub data: Arc<Aligned>,
}

impl Part {
    pub fn panels(&self) -> usize {
        self.rows.div_ceil(PANEL)
    }
    /// The record of chunk `c` of panel `p`.
    pub fn record(&self, p: usize, c: usize) -> &[u8] {
        let at = (p * self.chunks + c) * self.layout.bytes;
        &self.data.bytes()[at..at + self.layout.bytes]
    }
    /// Values of the row, padded to whole records (the activation must be this long, zeros past k).
    pub fn padded_k(&self) -> usize {
        self.chunks * self.layout.chunk()
    }
}

/// A quantized weight matrix [n, k] (the checkpoint's [out, in]) in the kernels' layout; a
/// stacked matrix (q, k, v) keeps each stacked weight as its own part, in its own format.
#[derive(Clone)]
pub struct PackedMatrix {
    pub(crate) parts: Vec<Part>,
    k: usize,
}

impl std::fmt::Debug for PackedMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parts: Vec<String> = self.parts.iter().map(|p| format!("{}×{}", p.rows, p.layout.ty)).collect();
        write!(f, "PackedMatrix [{}, {}] ({})", self.rows(), self.k, parts.join(" + "))
    }
}

/// Why a matrix cannot be packed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PackError {
    #[error("{ty} stores rows in blocks of {block} values; a row here has {k}")]
    RowLength { ty: QuantType, block: usize, k: usize },
    #[error("{ty}: {rows} rows of {k} values need {expected} bytes, found {found}")]
    Size { ty: QuantType, rows: usize, k: usize, expected: usize, found: usize },
    #[error("stacked matrices must have the same row length: {0} and {1}")]
    Width(usize, usize),
}

impl PackedMatrix {
    /// Packs `rows` rows of `k` values stored in ggml's layout of `ty` (a GGUF tensor's bytes).
    pub fn from_ggml(ty: QuantType, rows: usize, k: usize, bytes: &[u8]) -> Result<Self, PackError> {
        if !ty.fits_row(k) {
            return Err(PackError::RowLength { ty, block: ty.block_values(), k });
        }
        let row_bytes = ggml::row_bytes(ty, k);
        if bytes.len() != rows * row_bytes {
            return Err(PackError::Size { ty, rows, k, expected: rows * row_bytes, found: bytes.len() });
        }
        let part = pack(ty, rows, k, |r| &bytes[r * row_bytes..(r + 1) * row_bytes]);
        Ok(Self { parts: vec![part], k })
    }

    /// Quantizes `rows` rows of `k` f32 values to `ty` and packs them.
    pub fn quantize(ty: QuantType, rows: usize, k: usize, values: &[f32]) -> Result<Self, PackError> {
        Self::quantize_weighted(ty, rows, k, values, None)
    }

    /// [`PackedMatrix::quantize`] with each column's error weighted by `importance` (`k` values;
    /// see [`super::quantize_weighted`]).
    pub fn quantize_weighted(
        ty: QuantType,
        rows: usize,
        k: usize,
        values: &[f32],
        importance: Option<&[f32]>,
    ) -> Result<Self, PackError> {
        if !ty.fits_row(k) {
            return Err(PackError::RowLength { ty, block: ty.block_values(), k });
        }
        assert_eq!(values.len(), rows * k, "quantize: {} values for [{rows}, {k}]", values.len());
        assert!(importance.is_none_or(|i| i.len() == k), "quantize: importance of another row length");
        let mut bytes = Vec::with_capacity(ggml::row_bytes(ty, k) * rows);
        super::quantize_weighted(ty, values, importance, &mut bytes).expect("rows of whole blocks quantize");
        Self::from_ggml(ty, rows, k, &bytes)
    }

    /// The matrices stacked row-wise, each keeping its own format.
    pub fn stack(matrices: Vec<PackedMatrix>) -> Result<Self, PackError> {
        let k = matrices.first().map_or(0, |m| m.k);
        let mut parts = Vec::new();
        let mut col0 = 0;
        for m in matrices {
            if m.k != k {
                return Err(PackError::Width(k, m.k));
            }
            for mut part in m.parts {
                part.col0 = col0;
                col0 += part.rows;
                parts.push(part);
            }
        }
        Ok(Self { parts, k })
    }

    /// Replaces the part that holds exactly rows `[start, start + other.rows())` by `other`.
    /// Returns false (and changes nothing) when no part spans exactly those rows.
    pub fn replace_rows(&mut self, start: usize, other: PackedMatrix) -> bool {
        let Some(i) = self.parts.iter().position(|p| p.col0 == start && p.rows == other.rows()) else {
            return false;
        };
        if other.k != self.k || other.parts.len() != 1 {
            return false;
        }
        let mut part = other.parts.into_iter().next().expect("one part");
        part.col0 = start;
        self.parts[i] = part;
        true
    }

    pub fn rows(&self) -> usize {
        self.parts.iter().map(|p| p.rows).sum()
    }
    pub fn k(&self) -> usize {
        self.k
    }
    /// The format of each part, with its rows.
    pub fn formats(&self) -> Vec<(QuantType, usize)> {
        self.parts.iter().map(|p| (p.layout.ty, p.rows)).collect()
    }
    /// Bytes held.
    pub fn size_bytes(&self) -> usize {
        self.parts.iter().map(|p| p.data.len).sum()
    }
    /// The longest padded row of any part: how long a quantized activation row must be.
    pub(crate) fn padded_k(&self) -> usize {
        self.parts.iter().map(Part::padded_k).max().unwrap_or(0)
    }

    /// Row `j` dequantized into `out` (`k` values), bit-exact to ggml's dequantization.
    pub fn dequantize_row(&self, j: usize, out: &mut [f32]) {
        assert!(j < self.rows() && out.len() == self.k, "dequantize_row {j} of {self:?}");
        let part = self.parts.iter().find(|p| j >= p.col0 && j < p.col0 + p.rows).expect("row in a part");
        let (panel, r) = ((j - part.col0) / PANEL, (j - part.col0) % PANEL);
        let l = &part.layout;
        for c in 0..part.chunks {
            let rec = part.record(panel, c);
            for g in 0..l.groups {
                let at = c * l.chunk() + g * GROUP;
                if at >= self.k {
                    return;
                }
                let q = group_values(l, rec, r, g);
                let params = params(l, rec, r, g);
                // K-quant parameters index the whole super-block.
                let base = if l.ty.is_k() { g * GROUP } else { 0 };
                for (i, o) in out[at..at + GROUP].iter_mut().enumerate() {
                    *o = ggml::weight(q[i], &params, base + i);
                }
            }
        }
    }
}

/// Packs `rows` rows (ggml bytes of row r from `row`) into panels.
fn pack<'a>(ty: QuantType, rows: usize, k: usize, row: impl Fn(usize) -> &'a [u8] + Sync) -> Part {
    let layout = Layout::of(ty);
    let chunks = k.div_ceil(layout.chunk());
    let mut data = Aligned::zeroed(rows.div_ceil(PANEL) * chunks * layout.bytes);
    let (bv, bb) = (ty.block_values(), ty.block_bytes());
    // Panels are independent: a task of the rayon pool each.
    data.bytes_mut().par_chunks_mut(chunks * layout.bytes).enumerate().for_each(|(p, panel)| {
        for r in 0..PANEL.min(rows - p * PANEL) {
            let src = row(p * PANEL + r);
            for c in 0..chunks {
                let rec = &mut panel[c * layout.bytes..][..layout.bytes];
                let mut block = None;
                for g in 0..layout.groups {
                    let at = c * layout.chunk() + g * GROUP; // value index in the row
                    if at >= k {
                        break;
                    }
                    let i0 = at % bv; // the group's first value within its block
                    if i0 == 0 {
                        block = Some(ggml::decode(ty, &src[at / bv * bb..][..bb]));
                    }
                    let block = block.as_ref().expect("a group's block starts at or before it");
                    write_group(&layout, rec, r, g, &block.q[i0..i0 + GROUP]);
                    write_params(&layout, rec, r, g, &block.params);
                }
            }
        }
    });
    Part { layout, rows, col0: 0, chunks, data: Arc::new(data) }
}

/// Stores row r's 32 unsigned values of group g.
fn write_group(l: &Layout, rec: &mut [u8], r: usize, g: usize, q: &[u8]) {
    let at = l.values_at(g);
    match l.ty.bits() {
        8 => {
            for (i, &v) in q.iter().enumerate() {
                rec[at + (i / 4) * 64 + r * 4 + i % 4] = v;
            }
        }
        2 | 3 => {
            for (i, &v) in q.iter().enumerate() {
                let (at, shift) = low_crumb(l, g, r, i);
                rec[at] |= (v & 3) << shift;
            }
        }
        _ => {
            for v in 0..4 {
                for b in 0..4 {
                    rec[at + v * 64 + r * 4 + b] = (q[8 * v + b] & 0x0f) | ((q[8 * v + 4 + b] & 0x0f) << 4);
                }
            }
        }
    }
    if l.ty.bits() == 6 {
        for (i, &v) in q.iter().enumerate() {
            let (at, shift) = high_field(l, g, r, i);
            rec[at] |= (v >> 4) << shift;
        }
    } else if l.planes == 1 {
        // The top bit (the fifth, or Q3_K's third).
        let (fields, top) = (l.plane_at(g, 0), l.ty.bits() - 1);
        for (i, &v) in q.iter().enumerate() {
            // Value i sits in byte r·4 + i % 4 of value vector i / 4.
            rec[fields + r * 4 + i % 4] |= ((v >> top) & 1) << (i / 4);
        }
    }
}

/// Where a 2- or 3-bit value's low two bits lie: the byte and the bit of row r's value i of
/// group g. Value i sits in byte `r·4 + i % 4` of value vector u = i / 4, so its bits sit in
/// the same byte of vector u / 4, at bit 2·(u % 4).
fn low_crumb(l: &Layout, g: usize, r: usize, i: usize) -> (usize, usize) {
    let u = i / 4;
    (l.values_at(g) + (u / 4) * 64 + r * 4 + i % 4, 2 * (u % 4))
}

/// Where a 6-bit value's two high bits lie: the byte and the bit of row r's value i of group g.
/// Value i sits in byte `r·4 + i % 4` of value vector u = i / 4, so its field sits in the same
/// byte of field vector u / 4, at bit 2·(u % 4).
fn high_field(l: &Layout, g: usize, r: usize, i: usize) -> (usize, usize) {
    let u = i / 4;
    (l.plane_at(g, u / 4) + r * 4 + i % 4, 2 * (u % 4))
}

/// Stores row r's scales for group g (and its super-block's, once per record).
fn write_params(l: &Layout, rec: &mut [u8], r: usize, g: usize, params: &Params) {
    let (s, sup) = (l.scales_at(g), l.sup_at());
    let put16 = |rec: &mut [u8], at: usize, v: f16| rec[at..at + 2].copy_from_slice(&v.to_le_bytes());
    match *params {
        Params::Offset { d, .. } => put16(rec, s + 2 * r, d),
        Params::Min { d, m } => {
            put16(rec, s + 2 * r, d);
            put16(rec, s + 32 + 2 * r, m);
        }
        Params::KMin { d, dmin, sc, m } => {
            rec[s + r] = sc[g];
            rec[s + 16 + r] = m[g];
            put16(rec, sup + 2 * r, d);
            put16(rec, sup + 32 + 2 * r, dmin);
        }
        Params::KMin16 { d, dmin, sc, m } => {
            rec[s + r] = sc[2 * g] | (m[2 * g] << 4);
            rec[s + 16 + r] = sc[2 * g + 1] | (m[2 * g + 1] << 4);
            put16(rec, sup + 2 * r, d);
            put16(rec, sup + 32 + 2 * r, dmin);
        }
        Params::KSigned { d, sc, .. } => {
            rec[s + r] = sc[2 * g] as u8;
            rec[s + 16 + r] = sc[2 * g + 1] as u8;
            put16(rec, sup + 2 * r, d);
        }
        Params::Levels { d: LevelScale::F16(d), .. } => put16(rec, s + 2 * r, d),
        Params::Levels { d: LevelScale::E8m0(e), .. } => rec[s + r] = e,
    }
}

/// Row r's 32 unsigned values of group g of a record.
pub(crate) fn group_values(l: &Layout, rec: &[u8], r: usize, g: usize) -> [u8; GROUP] {
    let at = l.values_at(g);
    let mut q = [0u8; GROUP];
    match l.ty.bits() {
        8 => {
            for (i, v) in q.iter_mut().enumerate() {
                *v = rec[at + (i / 4) * 64 + r * 4 + i % 4];
            }
        }
        2 | 3 => {
            for (i, v) in q.iter_mut().enumerate() {
                let (at, shift) = low_crumb(l, g, r, i);
                *v = (rec[at] >> shift) & 3;
            }
        }
        _ => {
            for v in 0..4 {
                for b in 0..4 {
                    let byte = rec[at + v * 64 + r * 4 + b];
                    q[8 * v + b] = byte & 0x0f;
                    q[8 * v + 4 + b] = byte >> 4;
                }
            }
        }
    }
    if l.ty.bits() == 6 {
        for (i, v) in q.iter_mut().enumerate() {
            let (at, shift) = high_field(l, g, r, i);
            *v |= ((rec[at] >> shift) & 3) << 4;
        }
    } else if l.planes == 1 {
        let (fields, top) = (l.plane_at(g, 0), l.ty.bits() - 1);
        for (i, v) in q.iter_mut().enumerate() {
            *v |= ((rec[fields + r * 4 + i % 4] >> (i / 4)) & 1) << top;
        }
    }
    q
}

/// Row r's parameters for group g of a record (for K-quants, those of the whole super-block
/// with only group g's scales filled in).
pub(crate) fn params(l: &Layout, rec: &[u8], r: usize, g: usize) -> Params {
    let (s, sup) = (l.scales_at(g), l.sup_at());
    let get16 = |at: usize| f16::from_le_bytes([rec[at], rec[at + 1]]);
    match l.ty {
        QuantType::Q8_0 => Params::Offset { d: get16(s + 2 * r), offset: 128 },
        QuantType::Q4_0 => Params::Offset { d: get16(s + 2 * r), offset: 8 },
        QuantType::Q5_0 => Params::Offset { d: get16(s + 2 * r), offset: 16 },
        QuantType::Q4_1 | QuantType::Q5_1 => Params::Min { d: get16(s + 2 * r), m: get16(s + 32 + 2 * r) },
        QuantType::Q4K | QuantType::Q5K => {
            let (mut sc, mut m) = ([0u8; 8], [0u8; 8]);
            sc[g] = rec[s + r];
            m[g] = rec[s + 16 + r];
            Params::KMin { d: get16(sup + 2 * r), dmin: get16(sup + 32 + 2 * r), sc, m }
        }
        QuantType::Q2K => {
            let (mut sc, mut m) = ([0u8; 16], [0u8; 16]);
            for (h, at) in [(2 * g, s + r), (2 * g + 1, s + 16 + r)] {
                (sc[h], m[h]) = (rec[at] & 0x0f, rec[at] >> 4);
            }
            Params::KMin16 { d: get16(sup + 2 * r), dmin: get16(sup + 32 + 2 * r), sc, m }
        }
        QuantType::Q3K | QuantType::Q6K => {
            let mut sc = [0i8; 16];
            sc[2 * g] = rec[s + r] as i8;
            sc[2 * g + 1] = rec[s + 16 + r] as i8;
            let offset = if l.ty == QuantType::Q3K { 4 } else { 32 };
            Params::KSigned { d: get16(sup + 2 * r), sc, offset }
        }
        QuantType::Iq4Nl => Params::Levels { d: LevelScale::F16(get16(s + 2 * r)), levels: &ggml::IQ4_LEVELS },
        QuantType::Mxfp4 => Params::Levels { d: LevelScale::E8m0(rec[s + r]), levels: &ggml::MXFP4_LEVELS },
    }
}

/// Bytes of a record prefetched with each half of each of its groups: whole cache lines that
/// cover the record.
pub(crate) fn prefetch_piece(l: &Layout) -> usize {
    (l.bytes / (2 * l.groups)).next_multiple_of(64)
}

/// Asks for the piece of the record `AHEAD` bytes on from `rec` that goes with value vectors
/// u..u + 4 of group g (see `avx2::panel`).
#[inline(always)]
pub(crate) fn prefetch_ahead(rec: &[u8], piece: usize, g: usize, u: usize) {
    prefetch(rec.as_ptr().wrapping_add(AHEAD + (2 * g + u / 4) * piece), piece);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_whole_cache_lines_and_little_larger_than_ggml() {
        for ty in QuantType::ALL {
            let l = Layout::of(ty);
            assert_eq!(l.bytes % 64, 0, "{ty}");
            assert!(l.sup_at() + l.sup <= l.bytes, "{ty}");
            let ggml_bytes = l.chunk() / ty.block_values() * ty.block_bytes() * PANEL;
            // Q3_K's 16 scales a row take 16 bytes for the file's 12, and the record pads by 32;
            // MXFP4's 17 bytes a block pad to 18.
            let most = match ty {
                QuantType::Q3K => 1.055,
                QuantType::Mxfp4 => 1.06,
                _ => 1.03,
            };
            assert!(l.bytes as f64 <= ggml_bytes as f64 * most, "{ty}: {} bytes for {} in ggml", l.bytes, ggml_bytes);
        }
    }
}
