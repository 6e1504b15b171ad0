//! The kernels themselves, in CubeCL (compiled per runtime: WGSL/SPIR-V on wgpu, CUDA C on
//! CUDA). Every activation is f32; each kernel reads its inputs through their strides, so Burn's
//! views (a narrowed q/k/v projection, a swapped dimension) need no copy first. Reductions run
//! over one cube per row through shared memory (no subgroup operations, which Mesa's llvmpipe
//! under OpenGL ES lacks).

use burn::cubecl;
use burn::cubecl::prelude::*;

use crate::kernels::{GELU_CUBE, GELU_SCALE};

/// The lowest finite f32 (−f32::MAX): where a running maximum starts.
const LOWEST: f32 = -3.402_823_5e38;

/// The units of a row-reducing cube (a power of two).
pub const ROW_UNITS: usize = 128;

/// Sums (or, with `max`, takes the maximum of) each unit's `value` across the cube; every unit
/// gets the result. Leaves `shared` free for the next reduction. The halving steps are unrolled
/// at compile time: CubeCL 0.11 fails to verify shared-memory accesses inside a runtime loop
/// ("expected operand type cube.ptr, but found cube.index").
#[cube]
fn cube_reduce(mut shared: Shared<[f32]>, value: f32, #[comptime] units: usize, #[comptime] max: bool) -> f32 {
    let unit = UNIT_POS as usize;
    shared[unit] = value;
    sync_cube();
    let steps = comptime!(units.trailing_zeros() as usize);
    #[unroll]
    for k in 0..steps {
        let stride = units >> (k + 1);
        if unit < stride {
            let mine = shared[unit];
            let other = shared[unit + stride];
            if comptime!(max) {
                shared[unit] = select(other > mine, other, mine);
            } else {
                shared[unit] = mine + other;
            }
        }
        sync_cube();
    }
    let total = shared[0];
    sync_cube();
    total
}

/// RMSNorm of row `CUBE_POS` of x: `x / sqrt(mean(x²) + eps) · w`.
///
/// x: [n, h] (any strides), w: \[h\], out: [n, h] contiguous; one cube per row.
#[cube(launch)]
pub fn rms_norm(x: &Tensor<f32>, w: &Tensor<f32>, out: &mut Tensor<f32>, eps: f32, #[comptime] units: usize) {
    let row = CUBE_POS;
    if row >= x.shape(0) {
        terminate!();
    }
    let h = x.shape(1);
    let base = row * x.stride(0);
    let scale = rms_scale(x, base, eps, units);
    let mut i = UNIT_POS as usize;
    while i < h {
        out[row * h + i] = x[base + i * x.stride(1)] * scale * w[i * w.stride(0)];
        i += units;
    }
}

/// RMSNorm's scale `1 / sqrt(mean(x²) + eps)` of the row of x from `base`, reduced by the
/// whole cube of `units` (every unit gets it).
#[cube]
fn rms_scale(x: &Tensor<f32>, base: usize, eps: f32, #[comptime] units: usize) -> f32 {
    let h = x.shape(1);
    let mut sum = 0.0f32;
    let mut i = UNIT_POS as usize;
    while i < h {
        let v = x[base + i * x.stride(1)];
        sum += v * v;
        i += units;
    }
    let shared = Shared::<[f32]>::new_slice(units);
    let total = cube_reduce(shared, sum, units, false);
    1.0f32 / (total / f32::cast_from(h) + eps).sqrt()
}

/// `silu(gate) · up` as `gate · up / (1 + e^−gate)`, or with `gelu` GeGLU's
/// `gelu_tanh(gate) · up` as `gate · up / (1 + e^−t)`, t = 2√(2/π) (gate + 0.044715 gate³); one
/// unit per output value.
///
/// gate_up: [n, 2i] (any strides), gate in the first half of each row; out: [n, i] contiguous.
#[cube(launch)]
pub fn swiglu(gate_up: &Tensor<f32>, out: &mut Tensor<f32>, #[comptime] gelu: bool) {
    let at = ABSOLUTE_POS;
    let i = out.shape(1);
    if at < out.len() {
        let (row, col) = (at / i, at % i);
        let base = row * gate_up.stride(0);
        let gate = gate_up[base + col * gate_up.stride(1)];
        let up = gate_up[base + (col + i) * gate_up.stride(1)];
        let mut t = gate;
        if comptime!(gelu) {
            t = f32::new(GELU_SCALE) * (gate + f32::new(GELU_CUBE) * gate * gate * gate);
        }
        out[at] = gate * up / (1.0f32 + (-t).exp());
    }
}

/// The rotate-half rotary embedding of the first `out.shape(1) / d` heads of each row of x,
/// each token by its own angles: `[x1·cos − x2·sin, x2·cos + x1·sin]`, one unit per pair.
///
/// x: [n, ≥ heads·d] (any strides), tables: [2, n, d/2] (cos, then sin), out: [n, heads·d]
/// contiguous.
#[cube(launch)]
pub fn rope(x: &Tensor<f32>, tables: &Tensor<f32>, out: &mut Tensor<f32>, #[comptime] d: usize) {
    let half = d / 2;
    let width = out.shape(1);
    let pairs_per_row = width / 2;
    let at = ABSOLUTE_POS;
    if at < out.shape(0) * pairs_per_row {
        let row = at / pairs_per_row;
        let pair = at % pairs_per_row;
        let (head, i) = (pair / half, pair % half);
        let lo = head * d + i;
        let base = row * x.stride(0);
        let x1 = x[base + lo * x.stride(1)];
        let x2 = x[base + (lo + half) * x.stride(1)];
        let t = row * tables.stride(1) + i * tables.stride(2);
        let cos = tables[t];
        let sin = tables[t + tables.stride(0)];
        out[row * width + lo] = x1 * cos - x2 * sin;
        out[row * width + lo + half] = x2 * cos + x1 * sin;
    }
}

/// Softmax of `scores · scale` (plus the mask's row, with `masked`) over the last dimension,
/// one cube per row.
///
/// scores: [b, r, e] (any strides), mask: [n, e] additive (0 visible, −∞ hidden; row j of each
/// b reads mask row j mod n; any tensor without `masked`), out: [b, r, e] contiguous.
#[cube(launch)]
pub fn softmax(
    scores: &Tensor<f32>,
    mask: &Tensor<f32>,
    out: &mut Tensor<f32>,
    scale: f32,
    #[comptime] masked: bool,
    #[comptime] units: usize,
) {
    let rows = scores.shape(1);
    let e = scores.shape(2);
    if CUBE_POS >= scores.shape(0) * rows {
        terminate!();
    }
    let (b, r) = (CUBE_POS / rows, CUBE_POS % rows);
    let base = b * scores.stride(0) + r * scores.stride(1);
    let mask_base = (r % mask.shape(0)) * mask.stride(0);
    let unit = UNIT_POS as usize;
    let shared = Shared::<[f32]>::new_slice(units);

    // f32::MIN, not −∞: WGSL has no literal for an infinity.
    let mut top = f32::new(LOWEST);
    let mut j = unit;
    while j < e {
        let mut s = scores[base + j * scores.stride(2)] * scale;
        if comptime!(masked) {
            s += mask[mask_base + j * mask.stride(1)];
        }
        top = select(s > top, s, top);
        j += units;
    }
    let top = cube_reduce(shared.clone(), top, units, true);

    let mut sum = 0.0f32;
    let mut j = unit;
    while j < e {
        let mut s = scores[base + j * scores.stride(2)] * scale;
        if comptime!(masked) {
            s += mask[mask_base + j * mask.stride(1)];
        }
        let p = (s - top).exp();
        out[CUBE_POS * e + j] = p;
        sum += p;
        j += units;
    }
    let sum = cube_reduce(shared.clone(), sum, units, false);
    let inv = 1.0f32 / sum;
    let mut j = unit;
    while j < e {
        out[CUBE_POS * e + j] *= inv;
        j += units;
    }
}

/// The rows of x one cube of [`xwt`] (and the other few-row products) takes: a launch of more
/// rows gives each chunk of this many its own cubes ([`product_cube`]).
pub const XWT_ROWS: usize = crate::kernels::GPU_XWT_ROWS;

/// This cube's place in a few-row product of `n` rows: (its block of [`XWT_OUTS`] columns, the
/// first of its [`XWT_ROWS`] rows). The chunks of rows of one block are adjacent cubes, so the
/// weights a block reads again for each chunk are still in the cache.
#[cube]
fn product_cube(n: usize) -> (usize, usize) {
    let chunks = n.div_ceil(XWT_ROWS);
    (CUBE_POS / chunks, (CUBE_POS % chunks) * XWT_ROWS)
}

/// Row `row` of x, or its last where x has fewer (a launch's last chunk of rows computes the
/// rows it lacks from the last one, and stores nothing for them).
#[cube]
fn row_at(x: &Tensor<f32>, row: usize) -> usize {
    let last = x.shape(0) - 1;
    select(row < last, row, last)
}

/// What [`xwt`] does to x before the product: nothing; RMSNorm it (each row's scale computed
/// by every cube, the norm's weight applied per input); or SwiGLU's gate over a stacked
/// [gate | up] x of twice the weight's inputs.
pub const PRE_PLAIN: u32 = 0;
pub const PRE_NORM: u32 = 1;
pub const PRE_SWIGLU: u32 = 2;
/// GeGLU's `gelu_tanh(gate) · up` as `gate · up / (1 + e^−t)`, t = 2√(2/π) (gate + 0.044715 gate³).
pub const PRE_GEGLU: u32 = 3;

/// Lanes that share one output column of [`xwt`], striding along k together (a power of two).
pub const XWT_LANES: usize = 32;
/// Output columns of one [`xwt`] cube: its units are `XWT_OUTS` groups of [`XWT_LANES`].
pub const XWT_OUTS: usize = 8;
/// The units of an [`xwt`] cube.
pub const XWT_UNITS: usize = XWT_LANES * XWT_OUTS;

/// Sums each of `rows` values over the `span` consecutive units that hold them (all of the
/// cube's `units`, or one group of lanes), every row in the same halving steps (one barrier a
/// step, whatever the row count): row r's sum over the span starting at unit u lands in
/// `shared[r · units + u]`. `shared` holds `XWT_ROWS · units` values; the caller syncs before
/// it writes `shared` again. Unrolled at compile time, as [`cube_reduce`] is.
#[cube]
#[allow(clippy::too_many_arguments)]
fn reduce_rows(
    mut shared: Shared<[f32]>,
    v0: f32,
    v1: f32,
    v2: f32,
    v3: f32,
    #[comptime] rows: usize,
    #[comptime] units: usize,
    #[comptime] span: usize,
) {
    let unit = UNIT_POS as usize;
    shared[unit] = v0;
    if comptime!(rows > 1) {
        shared[units + unit] = v1;
    }
    if comptime!(rows > 2) {
        shared[2 * units + unit] = v2;
    }
    if comptime!(rows > 3) {
        shared[3 * units + unit] = v3;
    }
    sync_cube();
    let lane = unit % span;
    let steps = comptime!(span.trailing_zeros() as usize);
    #[unroll]
    for k in 0..steps {
        let stride = span >> (k + 1);
        if lane < stride {
            shared[unit] += shared[unit + stride];
            if comptime!(rows > 1) {
                shared[units + unit] += shared[units + unit + stride];
            }
            if comptime!(rows > 2) {
                shared[2 * units + unit] += shared[2 * units + unit + stride];
            }
            if comptime!(rows > 3) {
                shared[3 * units + unit] += shared[3 * units + unit + stride];
            }
        }
        sync_cube();
    }
}

/// Input k of row `row` of [`xwt`]'s product, after its `pre`.
#[cube]
#[allow(clippy::too_many_arguments)]
fn xwt_input(
    x: &Tensor<f32>,
    row: usize,
    k: usize,
    k_len: usize,
    norm: &Tensor<f32>,
    scale: f32,
    #[comptime] pre: u32,
) -> f32 {
    let at = row * x.stride(0);
    let mut v = x[at + k * x.stride(1)];
    if comptime!(pre == PRE_NORM) {
        v = v * scale * norm[k * norm.stride(0)];
    }
    if comptime!(pre == PRE_SWIGLU) {
        let up = x[at + (k + k_len) * x.stride(1)];
        v = v * up / (1.0f32 + (-v).exp());
    }
    if comptime!(pre == PRE_GEGLU) {
        let up = x[at + (k + k_len) * x.stride(1)];
        let t = f32::new(GELU_SCALE) * (v + f32::new(GELU_CUBE) * v * v * v);
        v = v * up / (1.0f32 + (-t).exp());
    }
    v
}

/// Each row's inputs k, k + [`XWT_LANES`], k + 2·XWT_LANES, k + 3·XWT_LANES (after `pre`)
/// times the four weights `w0..w3` there, summed.
#[cube]
#[allow(clippy::too_many_arguments)]
fn xwt_four(
    x: &Tensor<f32>,
    row: usize,
    k: usize,
    k_len: usize,
    norm: &Tensor<f32>,
    scale: f32,
    w0: f32,
    w1: f32,
    w2: f32,
    w3: f32,
    #[comptime] pre: u32,
) -> f32 {
    xwt_input(x, row, k, k_len, norm, scale, pre) * w0
        + xwt_input(x, row, k + XWT_LANES, k_len, norm, scale, pre) * w1
        + xwt_input(x, row, k + 2 * XWT_LANES, k_len, norm, scale, pre) * w2
        + xwt_input(x, row, k + 3 * XWT_LANES, k_len, norm, scale, pre) * w3
}

/// Under `PRE_NORM`, each row's RMSNorm scale `1 / sqrt(mean(x²) + eps)` over its first
/// `k_len` inputs, the squares reduced once by the whole cube (`shared` free again after);
/// otherwise ones.
#[cube]
fn norm_scales(
    x: &Tensor<f32>,
    shared: Shared<[f32]>,
    row0: usize,
    k_len: usize,
    eps: f32,
    #[comptime] rows: usize,
    #[comptime] pre: u32,
) -> (f32, f32, f32, f32) {
    let mut s0 = f32::new(1.0);
    let mut s1 = f32::new(1.0);
    let mut s2 = f32::new(1.0);
    let mut s3 = f32::new(1.0);
    if comptime!(pre == PRE_NORM) {
        let mut q0 = 0.0f32;
        let mut q1 = 0.0f32;
        let mut q2 = 0.0f32;
        let mut q3 = 0.0f32;
        let mut k = UNIT_POS as usize;
        let at = row0 * x.stride(0);
        let (at1, at2, at3) =
            (row_at(x, row0 + 1) * x.stride(0), row_at(x, row0 + 2) * x.stride(0), row_at(x, row0 + 3) * x.stride(0));
        while k < k_len {
            let v = x[at + k * x.stride(1)];
            q0 += v * v;
            if comptime!(rows > 1) {
                let v = x[at1 + k * x.stride(1)];
                q1 += v * v;
            }
            if comptime!(rows > 2) {
                let v = x[at2 + k * x.stride(1)];
                q2 += v * v;
            }
            if comptime!(rows > 3) {
                let v = x[at3 + k * x.stride(1)];
                q3 += v * v;
            }
            k += XWT_UNITS;
        }
        reduce_rows(shared.clone(), q0, q1, q2, q3, rows, XWT_UNITS, XWT_UNITS);
        let len = f32::cast_from(k_len);
        s0 = 1.0f32 / (shared[0] / len + eps).sqrt();
        if comptime!(rows > 1) {
            s1 = 1.0f32 / (shared[XWT_UNITS] / len + eps).sqrt();
        }
        if comptime!(rows > 2) {
            s2 = 1.0f32 / (shared[2 * XWT_UNITS] / len + eps).sqrt();
        }
        if comptime!(rows > 3) {
            s3 = 1.0f32 / (shared[3 * XWT_UNITS] / len + eps).sqrt();
        }
        sync_cube();
    }
    (s0, s1, s2, s3)
}

/// Column `o` of `pre(x)·Wᵀ` for rows `row0..row0 + rows` (those past x's rows: its last
/// again, [`row_at`]), by this unit's group of [`XWT_LANES`] lanes (the cube's [`XWT_OUTS`]
/// groups each computing one column; `o` past the weight's rows computes nothing but takes
/// part in the barriers): row r's sum lands in `shared[r · XWT_UNITS + u]`
/// for the group's first unit u. Under `PRE_NORM` the whole cube first reduces each row's
/// squares once for its columns. Every lane keeps four weight reads in flight.
#[cube]
#[allow(clippy::too_many_arguments)]
fn xwt_column<W: Float>(
    x: &Tensor<f32>,
    w: &Tensor<W>,
    norm: &Tensor<f32>,
    shared: Shared<[f32]>,
    row0: usize,
    o: usize,
    eps: f32,
    #[comptime] rows: usize,
    #[comptime] pre: u32,
) {
    let unit = UNIT_POS as usize;
    let lane = unit % XWT_LANES;
    let k_len = w.shape(1);
    let (s0, s1, s2, s3) = norm_scales(x, shared.clone(), row0, k_len, eps, rows, pre);
    let end = select(o < w.shape(0), k_len, 0);
    let w_row = o * w.stride(0);
    let ws = w.stride(1);
    let (r1, r2, r3) = (row_at(x, row0 + 1), row_at(x, row0 + 2), row_at(x, row0 + 3));
    let mut a0 = 0.0f32;
    let mut a1 = 0.0f32;
    let mut a2 = 0.0f32;
    let mut a3 = 0.0f32;
    let mut k = lane;
    // Four weights loaded before any is used.
    while k + 3 * XWT_LANES < end {
        let at = w_row + k * ws;
        let w0 = f32::cast_from(w[at]);
        let w1 = f32::cast_from(w[at + XWT_LANES * ws]);
        let w2 = f32::cast_from(w[at + 2 * XWT_LANES * ws]);
        let w3 = f32::cast_from(w[at + 3 * XWT_LANES * ws]);
        a0 += xwt_four(x, row0, k, k_len, norm, s0, w0, w1, w2, w3, pre);
        if comptime!(rows > 1) {
            a1 += xwt_four(x, r1, k, k_len, norm, s1, w0, w1, w2, w3, pre);
        }
        if comptime!(rows > 2) {
            a2 += xwt_four(x, r2, k, k_len, norm, s2, w0, w1, w2, w3, pre);
        }
        if comptime!(rows > 3) {
            a3 += xwt_four(x, r3, k, k_len, norm, s3, w0, w1, w2, w3, pre);
        }
        k += 4 * XWT_LANES;
    }
    while k < end {
        let wv = f32::cast_from(w[w_row + k * ws]);
        a0 += xwt_input(x, row0, k, k_len, norm, s0, pre) * wv;
        if comptime!(rows > 1) {
            a1 += xwt_input(x, r1, k, k_len, norm, s1, pre) * wv;
        }
        if comptime!(rows > 2) {
            a2 += xwt_input(x, r2, k, k_len, norm, s2, pre) * wv;
        }
        if comptime!(rows > 3) {
            a3 += xwt_input(x, r3, k, k_len, norm, s3, pre) * wv;
        }
        k += XWT_LANES;
    }
    reduce_rows(shared, a0, a1, a2, a3, rows, XWT_UNITS, XWT_LANES);
}

/// `y = pre(x)·Wᵀ + b + residual` for a decode step's rows, [`XWT_OUTS`] output columns of
/// [`XWT_ROWS`] rows a cube ([`xwt_column`], [`product_cube`]; `rows`: the chunks' rows, fewer
/// than [`XWT_ROWS`] only where x has no more). The weight is read in its own type (f32, f16,
/// bf16) and widened: no cast of x or of the product, no separate norm, gate, bias or residual
/// kernel.
///
/// On an H100 (demo shape, bf16) the first version, one column per 128-unit cube with a
/// cube-wide reduction per row and per column, spent its time in barriers; this one took the
/// batch-1 decode from 204-205 to 225-236 tok/s (with the attention below).
///
/// x: [rows, k] (any strides; [rows, 2k] with `PRE_SWIGLU`), w: [out, k] (any strides), norm:
/// \[k\] (read with `PRE_NORM`), bias: \[out\] (read with `has_bias`), residual: [rows, out] (read
/// with `has_residual`), out: [rows, out] contiguous.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn xwt<W: Float>(
    x: &Tensor<f32>,
    w: &Tensor<W>,
    norm: &Tensor<f32>,
    bias: &Tensor<f32>,
    residual: &Tensor<f32>,
    out: &mut Tensor<f32>,
    eps: f32,
    #[comptime] rows: usize,
    #[comptime] pre: u32,
    #[comptime] has_bias: bool,
    #[comptime] has_residual: bool,
) {
    let unit = UNIT_POS as usize;
    let outs = out.shape(1);
    let (group, lane) = (unit / XWT_LANES, unit % XWT_LANES);
    let (block, row0) = product_cube(x.shape(0));
    let o = block * XWT_OUTS + group;
    let shared = Shared::<[f32]>::new_slice(comptime!(XWT_ROWS * XWT_UNITS));
    xwt_column(x, w, norm, shared.clone(), row0, o, eps, rows, pre);
    if lane == 0 && o < outs {
        store_column(shared, bias, residual, out, row0, o, rows, has_bias, has_residual);
    }
}

/// Output column `o` of rows `row0..row0 + rows` (those out has) from the sums
/// [`reduce_rows`] left in `shared` for this unit's group, plus its bias and residual.
#[cube]
#[allow(clippy::too_many_arguments)]
fn store_column(
    shared: Shared<[f32]>,
    bias: &Tensor<f32>,
    residual: &Tensor<f32>,
    out: &mut Tensor<f32>,
    row0: usize,
    o: usize,
    #[comptime] rows: usize,
    #[comptime] has_bias: bool,
    #[comptime] has_residual: bool,
) {
    let unit = UNIT_POS as usize;
    let outs = out.shape(1);
    #[unroll]
    for r in 0..rows {
        let row = row0 + r;
        if row < out.shape(0) {
            let mut y = shared[r * XWT_UNITS + unit];
            if comptime!(has_bias) {
                y += bias[o * bias.stride(0)];
            }
            if comptime!(has_residual) {
                y += residual[row * residual.stride(0) + o * residual.stride(1)];
            }
            out[row * outs + o] = y;
        }
    }
}

/// The stacked q/k/v projection of a decode step's rows with RoPE and the KV write in the
/// same launch ([`XWT_ROWS`] rows a cube, as [`xwt`]): [`xwt_column`]'s product (with the
/// attention norm and the bias), each cube's [`XWT_OUTS`] columns being four rotary pairs (column i of a head and column i + d/2, groups
/// g and g + 4), so the first unit of group g < 4 holds both halves of a pair and writes q's
/// heads rotated into `q_out`, k's rotated and v's as they are into their cells of a layer's
/// cache (`cache[h, slots[t], i]`, in the cache's type), as [`rope_kv`] does after the plain
/// product. One launch where the two took two.
///
/// x: [rows, k] (any strides), w: [(heads + 2 · kv_heads) · d, k] (any strides), norm: \[k\]
/// (read with `PRE_NORM`), bias: [(heads + 2 · kv_heads) · d] (read with `has_bias`), tables:
/// [2, rows, d/2] (cos, sin), q_out: [rows, heads · d] contiguous, k_cache, v_cache:
/// [kv_heads, capacity, d], slots: \[rows\].
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn xwt_rope_kv<W: Float, C: Float>(
    x: &Tensor<f32>,
    w: &Tensor<W>,
    norm: &Tensor<f32>,
    bias: &Tensor<f32>,
    tables: &Tensor<f32>,
    q_out: &mut Tensor<f32>,
    k_cache: &mut Tensor<C>,
    v_cache: &mut Tensor<C>,
    slots: &Tensor<i32>,
    eps: f32,
    #[comptime] rows: usize,
    #[comptime] pre: u32,
    #[comptime] has_bias: bool,
    #[comptime] d: usize,
) {
    let (block, row0) = product_cube(x.shape(0));
    let (head, i, o) = rope_pair(block, d);
    let shared = Shared::<[f32]>::new_slice(comptime!(XWT_ROWS * XWT_UNITS));
    xwt_column(x, w, norm, shared.clone(), row0, o, eps, rows, pre);
    if pair_owner() && head * d + i < w.shape(0) {
        rotate_columns(shared, bias, tables, q_out, k_cache, v_cache, slots, row0, head, i, rows, has_bias, d);
    }
}

/// This unit's rotary pair in [`xwt_rope_kv`]'s layout (each block of [`XWT_OUTS`] columns four
/// pairs: column i of a head in group g < 4, column i + d/2 in group g + 4): its head, i, and
/// the column its group computes.
#[cube]
fn rope_pair(block: usize, #[comptime] d: usize) -> (usize, usize, usize) {
    let half = comptime!(d / 2);
    let pairs_per_cube = comptime!(XWT_OUTS / 2);
    let group = UNIT_POS as usize / XWT_LANES;
    let pair = block * pairs_per_cube + group % pairs_per_cube;
    let (head, i) = (pair / half, pair % half);
    let lo = head * d + i;
    (head, i, select(group < pairs_per_cube, lo, lo + half))
}

/// Whether this unit stores its pair ([`rope_pair`]): the first lane of a group of the first
/// half, which holds column i and reads column i + d/2 from its partner.
#[cube]
fn pair_owner() -> bool {
    let unit = UNIT_POS as usize;
    let (group, lane) = (unit / XWT_LANES, unit % XWT_LANES);
    lane == 0 && group < comptime!(XWT_OUTS / 2)
}

/// The rotary pair (i, i + d/2) of head `head` of rows `row0..row0 + rows` (those slots has)
/// from the sums a product left in `shared` ([`xwt_rope_kv`]'s layout: this unit's group holds
/// column i, the group `XWT_OUTS / 2` further on column i + d/2), plus their bias, stored by
/// [`rotate_store`].
#[cube]
#[allow(clippy::too_many_arguments)]
fn rotate_columns<C: Float>(
    shared: Shared<[f32]>,
    bias: &Tensor<f32>,
    tables: &Tensor<f32>,
    q_out: &mut Tensor<f32>,
    k_cache: &mut Tensor<C>,
    v_cache: &mut Tensor<C>,
    slots: &Tensor<i32>,
    row0: usize,
    head: usize,
    i: usize,
    #[comptime] rows: usize,
    #[comptime] has_bias: bool,
    #[comptime] d: usize,
) {
    let unit = UNIT_POS as usize;
    let partner = unit + comptime!(XWT_OUTS / 2) * XWT_LANES;
    let lo = head * d + i;
    #[unroll]
    for r in 0..rows {
        let row = row0 + r;
        if row < slots.shape(0) {
            let mut x1 = shared[r * XWT_UNITS + unit];
            let mut x2 = shared[r * XWT_UNITS + partner];
            if comptime!(has_bias) {
                x1 += bias[lo * bias.stride(0)];
                x2 += bias[(lo + comptime!(d / 2)) * bias.stride(0)];
            }
            let slot = usize::cast_from(slots[row * slots.stride(0)]);
            rotate_store(x1, x2, row, head, i, slot, tables, q_out, k_cache, v_cache, d);
        }
    }
}

/// The block formats [`xwt_q`] and [`dequantize`] read, by their ggml type ids, in the device
/// layout of `quant::device` (each block padded to whole 32-bit words).
pub const Q4_0: u32 = 2;
pub const Q4_1: u32 = 3;
pub const Q5_0: u32 = 6;
pub const Q5_1: u32 = 7;
pub const Q8_0: u32 = 8;
pub const Q2_K: u32 = 10;
pub const Q3_K: u32 = 11;
pub const Q4_K: u32 = 12;
pub const Q5_K: u32 = 13;
pub const Q6_K: u32 = 14;
pub const IQ4_NL: u32 = 20;
pub const MXFP4: u32 = 39;

/// Not a block format: a kernel that reads weights dense or in blocks reads them dense (ggml's
/// id of f32; f16 and bf16 rows too).
pub const DENSE: u32 = 0;

/// Values a lane decodes at a time: half a 32-value block, a sixteenth of a K-quant's.
pub const CHUNK: usize = 16;

/// 32-bit words of one block of `format` (as `quant::device::block_words`).
const fn block_words(format: u32) -> usize {
    match format {
        Q8_0 => 9,
        Q4_0 | Q4_1 | IQ4_NL | MXFP4 => 5,
        Q5_0 | Q5_1 => 6,
        Q2_K => 21,
        Q3_K => 28,
        Q4_K => 36,
        Q5_K => 44,
        _ => 53,
    }
}

/// Whether `format`'s weights are `a · q − b` with a b of their own (a min or offset), so a
/// product sums its inputs too.
const fn has_min(format: u32) -> bool {
    matches!(format, Q4_1 | Q5_1 | Q2_K | Q4_K | Q5_K)
}

/// [`CHUNK`]s of one block of `format`.
const fn block_chunks(format: u32) -> usize {
    match format {
        Q2_K | Q3_K | Q4_K | Q5_K | Q6_K => 16,
        _ => 2,
    }
}

/// Whether `format`'s nibbles stand for levels (IQ4_NL, MXFP4).
const fn has_levels(format: u32) -> bool {
    matches!(format, IQ4_NL | MXFP4)
}

/// Word `i` (0..4) of `format`'s 16 levels as signed bytes, four to a little-endian word.
const fn level_word(format: u32, i: usize) -> u32 {
    let levels = if format == MXFP4 { crate::quant::MXFP4_LEVELS } else { crate::quant::IQ4_LEVELS };
    let mut word = 0u32;
    let mut b = 0;
    while b < 4 {
        word |= (levels[4 * i + b] as u8 as u32) << (8 * b);
        b += 1;
    }
    word
}

/// The level nibble `v` of `format` stands for.
#[cube]
fn level(v: u32, #[comptime] format: u32) -> f32 {
    let w0 = comptime!(level_word(format, 0));
    let w1 = comptime!(level_word(format, 1));
    let w2 = comptime!(level_word(format, 2));
    let w3 = comptime!(level_word(format, 3));
    let word = select(v < 4, w0, select(v < 8, w1, select(v < 12, w2, w3)));
    let b = (word >> (8 * (v % 4))) & 0xff;
    f32::cast_from(b) - select(b >= 128, 256.0f32, 0.0f32)
}

/// An E8M0 scale (the low byte of `bits`) halved, 2^(e − 128), as ggml computes it (subnormal
/// below e = 2).
#[cube]
fn e8m0_half(bits: u32) -> f32 {
    let e = bits & 0xff;
    let tiny = f32::cast_from(e + 1) * 2.938_736e-39; // 2^-128 (e = 0), 2^-127 (e = 1)
    select(e < 2, tiny, f32::reinterpret((e - 1) << 23))
}

/// The f32 value of the f16 in the low 16 bits of `bits` (subnormals included; WGSL under
/// OpenGL ES has no 16-bit type to convert through). The blocks' scales are never infinite.
#[cube]
fn half_to_f32(bits: u32) -> f32 {
    let magnitude = bits & 0x7fff;
    // Exponent rebased from 15 to 127, mantissa moved up to f32's 23 bits.
    let normal = f32::reinterpret((magnitude << 13) + 0x3800_0000);
    let tiny = f32::cast_from(magnitude) * 5.960_464_5e-8;
    let v = select(magnitude < 0x400, tiny, normal);
    select((bits & 0x8000) != 0, -v, v)
}

/// Byte `i` (0..4) of a little-endian word.
#[cube]
fn byte_of(word: u32, #[comptime] i: usize) -> u32 {
    (word >> comptime!(8 * i as u32)) & 0xff
}

/// Byte `i` of the words of `w` from `at` (little-endian).
#[cube]
fn word_byte(w: &Tensor<u32>, at: usize, i: usize) -> u32 {
    (w[at + i / 4] >> (8 * u32::cast_from(i % 4))) & 0xff
}

/// Chunk `c` (values `CHUNK · c ..`) of row `row` of a quantized matrix `w` ([rows, words a
/// row], the device layout): its 16 values as the integers of the format in `q[0..16]`, and in
/// `q[16]`, `q[17]` the a and b that make them weights, `w_t = a · q_t − b`, with ggml's
/// arithmetic (Q8_0, Q4_0, Q5_0: `d · (q − offset)`; Q4_1, Q5_1: `d · q + m`; Q4_K, Q5_K:
/// `(d · sc) · q − dmin · m` of its 32-value group, Q2_K of its 16-value group; Q6_K:
/// `(d · sc) · (q − 32)` of its 16-value group, Q3_K `(d · sc) · (q − 4)`).
#[cube]
fn chunk(w: &Tensor<u32>, row: usize, c: usize, q: &mut Array<f32>, #[comptime] format: u32) {
    let per_block = comptime!(block_chunks(format));
    let (block, cc) = (c / per_block, c % per_block);
    let base = row * w.stride(0) + block * comptime!(block_words(format));
    if comptime!(format == Q8_0) {
        // [d, pad] then 32 signed bytes: this chunk's 16 from word 1 + 4 · cc.
        let at = base + 1 + 4 * cc;
        #[unroll]
        for j in 0..4 {
            let word = w[at + j];
            #[unroll]
            for i in 0..4 {
                q[4 * j + i] = f32::cast_from(byte_of(word, i) ^ 0x80) - 128.0;
            }
        }
        q[16] = half_to_f32(w[base]);
        q[17] = 0.0;
    }
    if comptime!(format == Q4_0 || format == Q5_0 || format == Q4_1 || format == Q5_1 || has_levels(format)) {
        // [d, pad] (Q4_1, Q5_1: [d, m]; MXFP4: [e, pad]), Q5's fifth bits' word, then 16 bytes:
        // value i's low nibble in byte i, value 16 + i's high one in byte i.
        let five = comptime!(format == Q5_0 || format == Q5_1);
        let nibbles = comptime!(if five { 2 } else { 1 });
        let shift = 4 * u32::cast_from(cc);
        let mut high = 0u32;
        if comptime!(five) {
            high = w[base + 1] >> (16 * u32::cast_from(cc));
        }
        #[unroll]
        for j in 0..4 {
            let word = w[base + nibbles + j];
            #[unroll]
            for i in 0..4 {
                let t = comptime!(4 * j + i);
                let mut v = (byte_of(word, i) >> shift) & 0xf;
                if comptime!(five) {
                    v |= ((high >> comptime!(t as u32)) & 1) << 4;
                }
                if comptime!(has_levels(format)) {
                    q[t] = level(v, format);
                } else {
                    q[t] = f32::cast_from(v);
                }
            }
        }
        if comptime!(format == MXFP4) {
            q[16] = e8m0_half(w[base]);
        } else {
            q[16] = half_to_f32(w[base]);
        }
        if comptime!(has_levels(format)) {
            q[17] = 0.0;
        } else if comptime!(has_min(format)) {
            q[17] = -half_to_f32(w[base] >> 16);
        } else {
            let offset = comptime!(if format == Q4_0 { 8.0f32 } else { 16.0f32 });
            // d · (q − offset) as a · q − b would round differently: the offset goes into q.
            #[unroll]
            for t in 0..16 {
                q[t] -= offset;
            }
            q[17] = 0.0;
        }
    }
    if comptime!(format == Q4_K || format == Q5_K) {
        // [d | dmin], 12 bytes of 6-bit scales and mins, (Q5_K: 32 bytes of fifth bits, bit g
        // of byte i for value 32g + i,) then 128 bytes of nibbles in four 32-byte parts: part
        // j holds values 64j.. in its low nibbles, 64j + 32.. in its high.
        let head = w[base];
        let g = cc / 2;
        // Group g < 4: bytes g and g + 4 hold its scale and min; g ≥ 4: byte g + 4 holds their
        // low four bits, bytes g − 4 and g their top two.
        let scales = base + 1;
        let mut sc = word_byte(w, scales, g) & 0x3f;
        let mut m = word_byte(w, scales, g + 4) & 0x3f;
        if g >= 4 {
            let low = word_byte(w, scales, g + 4);
            sc = (low & 0xf) | ((word_byte(w, scales, g - 4) >> 6) << 4);
            m = (low >> 4) | ((word_byte(w, scales, g) >> 6) << 4);
        }
        let (part, quarter) = (cc / 4, cc % 4);
        let nibbles = comptime!(if format == Q5_K { 12 } else { 4 });
        let at = base + nibbles + 8 * part + 4 * (quarter % 2);
        let shift = select(quarter >= 2, 4u32, 0u32);
        let fifth_at = base + 4 + 4 * (cc % 2);
        let fifth = u32::cast_from(g);
        #[unroll]
        for j in 0..4 {
            let word = w[at + j];
            let mut top = 0u32;
            if comptime!(format == Q5_K) {
                top = w[fifth_at + j];
            }
            #[unroll]
            for i in 0..4 {
                let mut v = (byte_of(word, i) >> shift) & 0xf;
                if comptime!(format == Q5_K) {
                    v |= ((byte_of(top, i) >> fifth) & 1) << 4;
                }
                q[4 * j + i] = f32::cast_from(v);
            }
        }
        q[16] = half_to_f32(head) * f32::cast_from(sc);
        q[17] = half_to_f32(head >> 16) * f32::cast_from(m);
    }
    if comptime!(format == Q2_K || format == Q3_K) {
        // Value 128n + 32j + l has its low two bits at bits 2j of byte 32n + l of qs; chunk cc
        // is values 128n + 32j + 16(cc % 2) ... Q2_K: [16 bytes of scale | min << 4, one per
        // chunk][qs: 64 bytes][d | dmin]. Q3_K: [hmask: 32 bytes, the third bit of value
        // 128n + 32j + l at bit 4n + j of byte l][qs][12 bytes of 6-bit scales][d, pad].
        let (n, j) = (cc / 8, (cc % 8) / 2);
        let l_words = 4 * (cc % 2);
        let three = comptime!(format == Q3_K);
        let qs_at = base + comptime!(if format == Q3_K { 8usize } else { 4usize }) + 8 * n + l_words;
        let shift = 2 * u32::cast_from(j);
        let third = u32::cast_from(4 * n + j);
        #[unroll]
        for i in 0..4 {
            let word = w[qs_at + i];
            let mut high = 0u32;
            if comptime!(three) {
                high = w[base + l_words + i];
            }
            #[unroll]
            for b in 0..4 {
                let mut v = (byte_of(word, b) >> shift) & 3;
                if comptime!(three) {
                    v |= ((byte_of(high, b) >> third) & 1) << 2;
                }
                q[4 * i + b] = f32::cast_from(v);
            }
        }
        if comptime!(three) {
            // Chunk cc's scale (stored + 32): its low four bits in the low (cc < 8) or high
            // nibble of byte cc % 8, its top two at bits 2(cc / 4) of byte 8 + cc % 4.
            let low = (word_byte(w, base + 24, cc % 8) >> select(cc >= 8, 4u32, 0u32)) & 0xf;
            let top = (word_byte(w, base + 24, 8 + cc % 4) >> (2 * u32::cast_from(cc / 4))) & 3;
            #[unroll]
            for t in 0..16 {
                q[t] -= 4.0;
            }
            q[16] = half_to_f32(w[base + 27]) * (f32::cast_from(low | (top << 4)) - 32.0);
            q[17] = 0.0;
        } else {
            let sc = word_byte(w, base, cc);
            let head = w[base + 20];
            q[16] = half_to_f32(head) * f32::cast_from(sc & 0xf);
            q[17] = half_to_f32(head >> 16) * f32::cast_from(sc >> 4);
        }
    }
    if comptime!(format == Q6_K) {
        // 128 bytes of low nibbles (two halves of 64: half h holds values 128h.. low, 128h + 64..
        // high), 64 bytes of top bits (two halves of 32: bits 2s of byte i of half h go to
        // value 128h + 32s + i), 16 signed scales (one per chunk), then [d, pad].
        let (half, r) = (cc / 8, (cc % 8) * 16);
        let low_at = base + 16 * half + (r % 64) / 4;
        let top_at = base + 32 + 8 * half + (r % 32) / 4;
        let low_shift = select(r >= 64, 4u32, 0u32);
        let top_shift = 2 * u32::cast_from(r / 32);
        #[unroll]
        for j in 0..4 {
            let low = w[low_at + j];
            let top = w[top_at + j];
            #[unroll]
            for i in 0..4 {
                let v = ((byte_of(low, i) >> low_shift) & 0xf) | (((byte_of(top, i) >> top_shift) & 3) << 4);
                q[4 * j + i] = f32::cast_from(v) - 32.0;
            }
        }
        let sc = word_byte(w, base + 48, cc);
        let sc = f32::cast_from(sc) - select(sc >= 128, 256.0f32, 0.0f32);
        q[16] = half_to_f32(w[base + 52]) * sc;
        q[17] = 0.0;
    }
}

/// Row `row`'s 16 inputs from `k` (after `pre`) dotted with the chunk [`chunk`] left in `q`.
#[cube]
#[allow(clippy::too_many_arguments)]
fn chunk_dot(
    x: &Tensor<f32>,
    row: usize,
    k: usize,
    k_len: usize,
    norm: &Tensor<f32>,
    scale: f32,
    q: &Array<f32>,
    #[comptime] pre: u32,
    #[comptime] format: u32,
) -> f32 {
    let mut dot = 0.0f32;
    let mut sum = 0.0f32;
    #[unroll]
    for t in 0..16 {
        let v = xwt_input(x, row, k + t, k_len, norm, scale, pre);
        dot += q[t] * v;
        if comptime!(has_min(format)) {
            sum += v;
        }
    }
    let mut y = q[16] * dot;
    if comptime!(has_min(format)) {
        y -= q[17] * sum;
    }
    y
}

/// [`xwt_column`] over a quantized weight read in its blocks ([`chunk`]: each lane decodes 16
/// values at a time, its group's 32 lanes reading adjacent chunks of weight row `o`).
#[cube]
#[allow(clippy::too_many_arguments)]
fn xwt_q_column(
    x: &Tensor<f32>,
    w: &Tensor<u32>,
    norm: &Tensor<f32>,
    shared: Shared<[f32]>,
    row0: usize,
    o: usize,
    eps: f32,
    #[comptime] rows: usize,
    #[comptime] pre: u32,
    #[comptime] format: u32,
) {
    let lane = UNIT_POS as usize % XWT_LANES;
    let k_len = if comptime!(pre == PRE_SWIGLU || pre == PRE_GEGLU) { x.shape(1) / 2 } else { x.shape(1) };
    let (s0, s1, s2, s3) = norm_scales(x, shared.clone(), row0, k_len, eps, rows, pre);
    let chunks = select(o < w.shape(0), k_len / CHUNK, 0);
    let (r1, r2, r3) = (row_at(x, row0 + 1), row_at(x, row0 + 2), row_at(x, row0 + 3));
    let mut q = Array::<f32>::new(18usize);
    let mut a0 = 0.0f32;
    let mut a1 = 0.0f32;
    let mut a2 = 0.0f32;
    let mut a3 = 0.0f32;
    let mut c = lane;
    while c < chunks {
        chunk(w, o, c, &mut q, format);
        let k = c * CHUNK;
        a0 += chunk_dot(x, row0, k, k_len, norm, s0, &q, pre, format);
        if comptime!(rows > 1) {
            a1 += chunk_dot(x, r1, k, k_len, norm, s1, &q, pre, format);
        }
        if comptime!(rows > 2) {
            a2 += chunk_dot(x, r2, k, k_len, norm, s2, &q, pre, format);
        }
        if comptime!(rows > 3) {
            a3 += chunk_dot(x, r3, k, k_len, norm, s3, &q, pre, format);
        }
        c += XWT_LANES;
    }
    reduce_rows(shared, a0, a1, a2, a3, rows, XWT_UNITS, XWT_LANES);
}

/// [`xwt`] over a quantized weight read in its blocks ([`xwt_q_column`]), for one part of a
/// stacked matrix: its columns are the output's from `col0` (the bias's and residual's too).
///
/// x: [rows, k] (any strides; [rows, 2k] with `PRE_SWIGLU`), w: [part rows, words a row],
/// norm, bias, residual, out: as [`xwt`]'s (out: [rows, all outputs]).
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn xwt_q(
    x: &Tensor<f32>,
    w: &Tensor<u32>,
    norm: &Tensor<f32>,
    bias: &Tensor<f32>,
    residual: &Tensor<f32>,
    out: &mut Tensor<f32>,
    eps: f32,
    col0: usize,
    #[comptime] rows: usize,
    #[comptime] pre: u32,
    #[comptime] has_bias: bool,
    #[comptime] has_residual: bool,
    #[comptime] format: u32,
) {
    let unit = UNIT_POS as usize;
    let (group, lane) = (unit / XWT_LANES, unit % XWT_LANES);
    let (block, row0) = product_cube(x.shape(0));
    let o = block * XWT_OUTS + group;
    let shared = Shared::<[f32]>::new_slice(comptime!(XWT_ROWS * XWT_UNITS));
    xwt_q_column(x, w, norm, shared.clone(), row0, o, eps, rows, pre, format);
    if lane == 0 && o < w.shape(0) {
        store_column(shared, bias, residual, out, row0, col0 + o, rows, has_bias, has_residual);
    }
}

/// [`xwt_rope_kv`] over one part of a quantized q/k/v matrix read in its blocks
/// ([`xwt_q_column`]): the part's rows are whole heads, from head `head0` of the stack (a part
/// a launch, each rotating and storing its heads).
///
/// x: [rows, k] (any strides), w: [part rows, words a row], the rest as [`xwt_rope_kv`]'s (bias
/// over the whole stack).
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn xwt_rope_kv_q<C: Float>(
    x: &Tensor<f32>,
    w: &Tensor<u32>,
    norm: &Tensor<f32>,
    bias: &Tensor<f32>,
    tables: &Tensor<f32>,
    q_out: &mut Tensor<f32>,
    k_cache: &mut Tensor<C>,
    v_cache: &mut Tensor<C>,
    slots: &Tensor<i32>,
    eps: f32,
    head0: usize,
    #[comptime] rows: usize,
    #[comptime] pre: u32,
    #[comptime] has_bias: bool,
    #[comptime] d: usize,
    #[comptime] format: u32,
) {
    let (block, row0) = product_cube(x.shape(0));
    let (head, i, o) = rope_pair(block, d);
    let shared = Shared::<[f32]>::new_slice(comptime!(XWT_ROWS * XWT_UNITS));
    xwt_q_column(x, w, norm, shared.clone(), row0, o, eps, rows, pre, format);
    if pair_owner() && head * d + i < w.shape(0) {
        rotate_columns(shared, bias, tables, q_out, k_cache, v_cache, slots, row0, head0 + head, i, rows, has_bias, d);
    }
}

/// A quantized matrix's rows as floats, one unit per [`CHUNK`]: every row of `w` into rows
/// `row0..` of out, or with `gather` row `ids[r]` into row r (an embedding lookup) for the ids
/// this part holds, `w` being the matrix's rows from `row0` (the other rows left to the other
/// parts' launches).
///
/// w: [rows, words a row], ids: \[n\] (read with `gather`), out: [≥ rows, k] contiguous.
#[cube(launch)]
pub fn dequantize<C: Float>(
    w: &Tensor<u32>,
    ids: &Tensor<i32>,
    out: &mut Tensor<C>,
    row0: usize,
    #[comptime] gather: bool,
    #[comptime] format: u32,
) {
    let k = out.shape(1);
    let per_row = k / CHUNK;
    let rows = if comptime!(gather) { ids.shape(0) } else { w.shape(0) };
    let at = ABSOLUTE_POS;
    if at < rows * per_row {
        let (r, c) = (at / per_row, at % per_row);
        let mut source = r;
        let mut target = row0 + r;
        if comptime!(gather) {
            let id = usize::cast_from(ids[r * ids.stride(0)]);
            // Past the part's rows: another part's (the subtraction wraps below row0).
            source = id - row0;
            target = r;
        }
        if source < w.shape(0) {
            let mut q = Array::<f32>::new(18usize);
            chunk(w, source, c, &mut q, format);
            let base = target * k + c * CHUNK;
            #[unroll]
            for t in 0..16 {
                out[base + t] = C::cast_from(q[16] * q[t] - q[17]);
            }
        }
    }
}

/// Cells a split of [`cell_attention`] covers (a row seeing more is split across cubes, and the
/// splits merged by [`merge_splits`]), and the units of its cube: one cell each for the scores.
pub const SPLIT_CELLS: usize = 256;

/// Attention of query head h of row r over only the cells that row sees, read through its row
/// of the cell table (no mask over the cache's extent). Query head h reads KV head
/// h / (heads / kv_heads). Cube `CUBE_POS` is (r · heads + h) · splits + s, of [`SPLIT_CELLS`]
/// units: with `split`, it covers the row's cells [s · SPLIT_CELLS, (s + 1) · SPLIT_CELLS) and
/// writes, unnormalised, its part for [`merge_splits`] (the largest score m, Σ e^(score − m),
/// then Σ e^(score − m) · v); without, the row's cells are one split and `out` gets the attention
/// itself.
///
/// Each unit scores one cell (q staged in shared memory, the d products unrolled so a unit's key
/// reads are all in flight at once); then, for the weighted sum of values, the units are
/// `SPLIT_CELLS / d` parts of d (one output dimension each, adjacent units reading adjacent
/// values), each part over every `parts`-th cell, the parts summed through shared memory. On an
/// H100 the first version (128 units, the scores' d reads and the values' cells one after
/// another per unit) took 91 µs a launch at 128 to 256 cells.
///
/// q: [n, heads, d] (any strides), k, v: [kv_heads, capacity, d] (a layer's cache, any float
/// type, keys rotated), cells: [n, 1 + width] (the row's count, then its cells), scratch:
/// [n·heads·splits, ≥ the cells a split covers], out: [n, heads·d] contiguous, or with `split`
/// [n·heads·splits, 2 + d]. With `softcap` > 0 each score s is `softcap · tanh(s / softcap)`.
/// With `has_sinks`, `sinks` [heads] holds each head's sink logit, added to an unsplit row's
/// denominator as e^(sink − max) (a split row's: `merge_splits`).
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn cell_attention<K: Float>(
    q: &Tensor<f32>,
    k: &Tensor<K>,
    v: &Tensor<K>,
    cells: &Tensor<i32>,
    scratch: &mut Tensor<f32>,
    out: &mut Tensor<f32>,
    sinks: &Tensor<f32>,
    scale: f32,
    softcap: f32,
    splits: usize,
    #[comptime] split: bool,
    #[comptime] has_sinks: bool,
    #[comptime] d: usize,
) {
    let units = comptime!(SPLIT_CELLS);
    let heads = q.shape(1);
    if CUBE_POS >= q.shape(0) * heads * splits {
        terminate!();
    }
    let (row_head, part) = (CUBE_POS / splits, CUBE_POS % splits);
    let (row, head) = (row_head / heads, row_head % heads);
    let kv_head = head / (heads / k.shape(0));
    let table = row * cells.stride(0);
    let count = usize::cast_from(cells[table]);
    // Without `split` there is one split and the row sees at most SPLIT_CELLS cells: all of them.
    let first = part * SPLIT_CELLS;
    let end = select(first + SPLIT_CELLS < count, first + SPLIT_CELLS, count);
    let s_base = CUBE_POS * scratch.stride(0);
    let q_base = row * q.stride(0) + head * q.stride(1);
    let unit = UNIT_POS as usize;

    // The host declines heads wider than a cube (d ≤ SPLIT_CELLS).
    let mut q_shared = Shared::<[f32]>::new_slice(d);
    if unit < d {
        q_shared[unit] = q[q_base + unit * q.stride(2)];
    }
    sync_cube();

    let j = first + unit;
    let mut score = f32::new(LOWEST);
    if j < end {
        let cell = usize::cast_from(cells[table + (1 + j) * cells.stride(1)]);
        let key = kv_head * k.stride(0) + cell * k.stride(1);
        let mut dot = 0.0f32;
        #[unroll]
        for i in 0..d {
            dot += q_shared[i] * f32::cast_from(k[key + i * k.stride(2)]);
        }
        score = dot * scale;
        // Gemma 2's soft-capped scores (0: none).
        if softcap > 0.0 {
            score = (score / softcap).tanh() * softcap;
        }
    }
    let mut shared = Shared::<[f32]>::new_slice(units);
    let top = cube_reduce(shared.clone(), score, units, true);
    let mut p = 0.0f32;
    if j < end {
        p = (score - top).exp();
        scratch[s_base + unit] = p;
    }
    let mut sum = cube_reduce(shared.clone(), p, units, false);
    if comptime!(has_sinks && !split) {
        sum += (sinks[head] - top).exp();
    }
    // Every unit reads every probability from here on.
    sync_storage();
    let part_row = CUBE_POS * out.stride(0);
    if comptime!(split) && unit == 0 {
        out[part_row] = top;
        out[part_row + 1] = sum;
    }
    // The units as `parts` slices of d: slice s sums the cells first + s, first + s + parts, ...
    let parts = comptime!(SPLIT_CELLS / d);
    let (i, slice) = (unit % d, unit / d);
    let mut acc = 0.0f32;
    if slice < parts {
        let at = kv_head * v.stride(0) + i * v.stride(2);
        let mut j = first + slice;
        while j < end {
            let cell = usize::cast_from(cells[table + (1 + j) * cells.stride(1)]);
            acc += scratch[s_base + j - first] * f32::cast_from(v[at + cell * v.stride(1)]);
            j += parts;
        }
    }
    shared[unit] = acc;
    sync_cube();
    if slice == 0 {
        let mut total = 0.0f32;
        #[unroll]
        for p in 0..parts {
            total += shared[p * d + i];
        }
        if comptime!(split) {
            out[part_row + 2 + i] = total;
        } else {
            out[row_head * d + i] = total / sum;
        }
    }
}

/// Merges the splits [`cell_attention`] wrote for (row, head) `CUBE_POS`: with M the largest of
/// their maxima, `Σ e^(m − M) · acc / Σ e^(m − M) · sum` (plus e^(sink − M) in the denominator
/// with `has_sinks`: the head's sink logit, `sinks` [heads]); one unit per output dimension.
///
/// parts: [n·heads·splits, 2 + d], out: [n, heads·d] contiguous.
#[cube(launch)]
pub fn merge_splits(
    parts: &Tensor<f32>,
    out: &mut Tensor<f32>,
    sinks: &Tensor<f32>,
    splits: usize,
    #[comptime] has_sinks: bool,
    #[comptime] units: usize,
) {
    let d = parts.shape(1) - 2;
    if CUBE_POS * d >= out.len() {
        terminate!();
    }
    let first = CUBE_POS * splits;
    let mut top = f32::new(LOWEST);
    let mut s = 0;
    while s < splits {
        let m = parts[(first + s) * parts.stride(0)];
        top = select(m > top, m, top);
        s += 1;
    }
    let mut total = 0.0f32;
    let mut s = 0;
    while s < splits {
        let row = (first + s) * parts.stride(0);
        total += parts[row + 1] * (parts[row] - top).exp();
        s += 1;
    }
    if comptime!(has_sinks) {
        let heads = out.shape(1) / d;
        total += (sinks[CUBE_POS % heads] - top).exp();
    }
    let mut i = UNIT_POS as usize;
    while i < d {
        let mut acc = 0.0f32;
        let mut s = 0;
        while s < splits {
            let row = (first + s) * parts.stride(0);
            acc += parts[row + 2 + i] * (parts[row] - top).exp();
            s += 1;
        }
        out[CUBE_POS * d + i] = acc / total;
        i += units;
    }
}

/// Writes a batch's keys and values into their cells of a layer's cache, in the cache's type:
/// `cache[h, slots[t], i] = new[h, t, i]` for keys and values at once, one unit per value.
///
/// k_new, v_new: [kv_heads, n, d] (any strides), k_cache, v_cache: [kv_heads, capacity, d],
/// slots: \[n\] the cell of each token.
#[cube(launch)]
pub fn kv_write<C: Float>(
    k_new: &Tensor<f32>,
    v_new: &Tensor<f32>,
    k_cache: &mut Tensor<C>,
    v_cache: &mut Tensor<C>,
    slots: &Tensor<i32>,
) {
    let (n, d) = (k_new.shape(1), k_new.shape(2));
    let at = ABSOLUTE_POS;
    if at < k_new.shape(0) * n * d {
        let (h, rest) = (at / (n * d), at % (n * d));
        let (t, i) = (rest / d, rest % d);
        let cell = usize::cast_from(slots[t * slots.stride(0)]);
        let kc = h * k_cache.stride(0) + cell * k_cache.stride(1) + i * k_cache.stride(2);
        let vc = h * v_cache.stride(0) + cell * v_cache.stride(1) + i * v_cache.stride(2);
        k_cache[kc] = C::cast_from(k_new[h * k_new.stride(0) + t * k_new.stride(1) + i * k_new.stride(2)]);
        v_cache[vc] = C::cast_from(v_new[h * v_new.stride(0) + t * v_new.stride(1) + i * v_new.stride(2)]);
    }
}

/// The rotary embedding of q's heads into `q_out` and of k's heads into their cells of a layer's
/// cache, and v's heads copied into theirs, from the stacked q/k/v projection: one cube per head
/// of a row, unit i of its `units` (d/2 rounded up to a power of two) the pair (i, i + d/2).
/// With `normed`, q's and k's heads are first normalised by RMSNorm over the head (weights
/// `q_norm`, `k_norm`: Qwen3's per-head norms), the cube reducing each head's squares.
/// `cache[h, slots[t], i]`, in the cache's type.
///
/// qkv: [n, (heads + 2 · kv_heads) · d] (any strides; q's heads, k's, v's), tables: [2, n, d/2]
/// (cos, sin), q_norm, k_norm: \[d\] (read with `normed`), q_out: [n, heads · d] contiguous,
/// k_cache, v_cache: [kv_heads, capacity, d], slots: \[n\].
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn rope_kv<C: Float>(
    qkv: &Tensor<f32>,
    tables: &Tensor<f32>,
    q_norm: &Tensor<f32>,
    k_norm: &Tensor<f32>,
    q_out: &mut Tensor<f32>,
    k_cache: &mut Tensor<C>,
    v_cache: &mut Tensor<C>,
    slots: &Tensor<i32>,
    eps: f32,
    #[comptime] d: usize,
    #[comptime] units: usize,
    #[comptime] normed: bool,
) {
    let half = comptime!(d / 2);
    let heads = q_out.shape(1) / d;
    let kv_heads = k_cache.shape(0);
    let per_row = heads + 2 * kv_heads;
    if CUBE_POS >= qkv.shape(0) * per_row {
        terminate!();
    }
    let (row, head) = (CUBE_POS / per_row, CUBE_POS % per_row);
    let i = UNIT_POS as usize;
    let live = i < half;
    let base = row * qkv.stride(0);
    let lo = head * d + i;
    let mut x1 = 0.0f32;
    let mut x2 = 0.0f32;
    if live {
        x1 = qkv[base + lo * qkv.stride(1)];
        x2 = qkv[base + (lo + half) * qkv.stride(1)];
    }
    if comptime!(normed) {
        let shared = Shared::<[f32]>::new_slice(units);
        let total = cube_reduce(shared, x1 * x1 + x2 * x2, units, false);
        if live && head < heads + kv_heads {
            let scale = 1.0f32 / (total / f32::cast_from(d) + eps).sqrt();
            if head < heads {
                x1 = x1 * scale * q_norm[i * q_norm.stride(0)];
                x2 = x2 * scale * q_norm[(i + half) * q_norm.stride(0)];
            } else {
                x1 = x1 * scale * k_norm[i * k_norm.stride(0)];
                x2 = x2 * scale * k_norm[(i + half) * k_norm.stride(0)];
            }
        }
    }
    if live {
        let slot = usize::cast_from(slots[row * slots.stride(0)]);
        rotate_store(x1, x2, row, head, i, slot, tables, q_out, k_cache, v_cache, d);
    }
}

/// Stores pair i of head `head` of row `row`'s stacked q/k/v projection (x1 at i, x2 at
/// i + d/2): q's heads rotated into `q_out`, k's rotated into cell `slot` of the key cache, v's
/// as they are into that cell of the value cache (in the cache's type).
#[cube]
#[allow(clippy::too_many_arguments)]
fn rotate_store<C: Float>(
    x1: f32,
    x2: f32,
    row: usize,
    head: usize,
    i: usize,
    slot: usize,
    tables: &Tensor<f32>,
    q_out: &mut Tensor<f32>,
    k_cache: &mut Tensor<C>,
    v_cache: &mut Tensor<C>,
    #[comptime] d: usize,
) {
    let half = d / 2;
    let heads = q_out.shape(1) / d;
    let kv_heads = k_cache.shape(0);
    let lo = head * d + i;
    if head < heads + kv_heads {
        let t = row * tables.stride(1) + i * tables.stride(2);
        let cos = tables[t];
        let sin = tables[t + tables.stride(0)];
        let (y1, y2) = (x1 * cos - x2 * sin, x2 * cos + x1 * sin);
        if head < heads {
            q_out[row * heads * d + lo] = y1;
            q_out[row * heads * d + lo + half] = y2;
        } else {
            let c = (head - heads) * k_cache.stride(0) + slot * k_cache.stride(1);
            let step = k_cache.stride(2);
            k_cache[c + i * step] = C::cast_from(y1);
            k_cache[c + (i + half) * step] = C::cast_from(y2);
        }
    } else {
        let c = (head - heads - kv_heads) * v_cache.stride(0) + slot * v_cache.stride(1);
        let step = v_cache.stride(2);
        v_cache[c + i * step] = C::cast_from(x1);
        v_cache[c + (i + half) * step] = C::cast_from(x2);
    }
}

/// Logits a cube of [`argmax_chunks`] scans.
pub const ARGMAX_CHUNK: usize = 1024;

/// Logits a cube of [`top_k`]'s first launch scans.
pub const TOP_K_CHUNK: usize = 4096;

/// Stands for "no index" in the selections' (value, index) pairs, where indices are f32 (exact
/// up to 2^24).
const NO_INDEX: f32 = 1.0e30;

/// Whether (v, i) comes before (best, best_i) in an argmax: a larger value, or the same value
/// at a smaller index (so the first maximum wins). NaN never does.
#[cube]
fn argmax_before(v: f32, i: f32, best: f32, best_i: f32) -> bool {
    v > best || (v == best && i < best_i)
}

/// Whether (v, i) is still to come once (prev, prev_i) is taken in a top-k's order: a smaller
/// value, or the same value at a larger index.
#[cube]
fn comes_after(v: f32, i: f32, prev: f32, prev_i: f32) -> bool {
    v < prev || (v == prev && i > prev_i)
}

/// One pass of a selection, to every unit of the cube: the first largest of `count` candidates
/// (argmax order) among those that come after (prev, prev_i), or all of them on the `first`
/// pass; (−f32::MAX, NO_INDEX) where none is left. Candidate c is, with `pairs`, the (value,
/// index) pair `input[2 (start + c)]`, `input[2 (start + c) + 1]`; else the value
/// `input[base + (start + c) · stride]` at index start + c. Leaves `shared` free.
#[cube]
#[allow(clippy::too_many_arguments)]
fn best_after(
    input: &Tensor<f32>,
    base: usize,
    stride: usize,
    start: usize,
    count: usize,
    prev: f32,
    prev_i: f32,
    first: bool,
    shared: Shared<[f32]>,
    #[comptime] pairs: bool,
    #[comptime] units: usize,
) -> (f32, f32) {
    let mut best = f32::new(LOWEST);
    let mut best_i = f32::new(NO_INDEX);
    let mut c = UNIT_POS as usize;
    while c < count {
        let (v, i) = if comptime!(pairs) {
            (input[(start + c) * 2], input[(start + c) * 2 + 1])
        } else {
            (input[base + (start + c) * stride], f32::cast_from(start + c))
        };
        let take = (first || comes_after(v, i, prev, prev_i)) && argmax_before(v, i, best, best_i);
        best = select(take, v, best);
        best_i = select(take, i, best_i);
        c += units;
    }
    // The cube's largest, then the smallest index of the units holding it (their first
    // maxima), the smallest as the largest negated.
    let top = cube_reduce(shared.clone(), best, units, true);
    let mine = select(best == top, best_i, f32::new(NO_INDEX));
    (top, -cube_reduce(shared, -mine, units, true))
}

/// Greedy decoding's first step: the largest value of each [`ARGMAX_CHUNK`] logits of a row
/// and the index of its first occurrence, one cube a (row, chunk). NaN is never picked; values
/// at or below −f32::MAX only where nothing else is.
///
/// x: [n, vocab] (any strides), parts: [n · chunks, 2] contiguous (value, index as f32), with
/// `chunks` vocab / ARGMAX_CHUNK rounded up.
#[cube(launch)]
pub fn argmax_chunks(x: &Tensor<f32>, parts: &mut Tensor<f32>, chunks: usize, #[comptime] units: usize) {
    let at = CUBE_POS;
    if at >= x.shape(0) * chunks {
        terminate!();
    }
    let (row, start) = (at / chunks, (at % chunks) * ARGMAX_CHUNK);
    let count = select(start + ARGMAX_CHUNK < x.shape(1), ARGMAX_CHUNK, x.shape(1) - start);
    let shared = Shared::<[f32]>::new_slice(units);
    let (top, first) =
        best_after(x, row * x.stride(0), x.stride(1), start, count, 0.0, 0.0, true, shared, false, units);
    if UNIT_POS == 0 {
        parts[at * 2] = top;
        parts[at * 2 + 1] = first;
    }
}

/// Greedy decoding's second step: each row's first largest value among its chunks'
/// ([`argmax_chunks`]), its index into `out` (0 where the row had no value above −f32::MAX);
/// one cube a row.
///
/// parts: [n · chunks, 2] (value, index), out: \[n\] i32.
#[cube(launch)]
pub fn argmax_merge(parts: &Tensor<f32>, out: &mut Tensor<i32>, chunks: usize, #[comptime] units: usize) {
    let row = CUBE_POS;
    if row >= out.len() {
        terminate!();
    }
    let shared = Shared::<[f32]>::new_slice(units);
    let (_, first) = best_after(parts, 0, 0, row * chunks, chunks, 0.0, 0.0, true, shared, true, units);
    if UNIT_POS == 0 {
        out[row] = select(first < f32::new(NO_INDEX), i32::cast_from(first), 0i32);
    }
}

/// The `k` largest values of each part of a row, best first (the smaller index first among
/// equal ones), with their indices; one cube a part, one pass over the part a value taken,
/// each pass taking the best of what comes after the last. NaN and −∞ are never taken; past a
/// part's values the pairs are (−f32::MAX, NO_INDEX). Sampling's candidates in two launches:
/// - the logits (`pairs` false), x: [n, vocab] (any strides), a part each [`TOP_K_CHUNK`] of a
///   row: out [n · chunks · k, 2] contiguous (value, index as f32), with `chunks` vocab /
///   TOP_K_CHUNK rounded up;
/// - those (`pairs`), a part each row's `chunks · k` pairs: out [n, k, 2].
///
/// With `mass`, each row's probability mass at its temperature `temps[row]` comes too, Σ
/// exp((l − max) / t) over its values (NaN left out; 0 where t ≤ 0): the first launch writes
/// each part's, about the part's largest value, to `masses` [n · chunks]; the second adds them
/// up about the row's largest into a last pair (mass, 0) of each row, out [n, k + 1, 2].
/// Without it `masses` and `temps` are not read.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn top_k(
    input: &Tensor<f32>,
    out: &mut Tensor<f32>,
    masses: &mut Tensor<f32>,
    temps: &Tensor<f32>,
    chunks: usize,
    k: usize,
    #[comptime] pairs: bool,
    #[comptime] mass: bool,
    #[comptime] units: usize,
) {
    let at = CUBE_POS;
    let mut width = k;
    if comptime!(mass && pairs) {
        width = k + 1;
    }
    if at * width * 2 >= out.len() {
        terminate!();
    }
    let mut base = 0;
    let mut stride = 0;
    let mut start = at * chunks * k;
    let mut count = chunks * k;
    let mut row = at;
    if comptime!(!pairs) {
        row = at / chunks;
        base = row * input.stride(0);
        stride = input.stride(1);
        start = (at % chunks) * TOP_K_CHUNK;
        count = select(start + TOP_K_CHUNK < input.shape(1), TOP_K_CHUNK, input.shape(1) - start);
    }
    let shared = Shared::<[f32]>::new_slice(units);
    let mut prev = f32::new(LOWEST);
    let mut prev_i = f32::new(NO_INDEX);
    let mut head = f32::new(LOWEST);
    for t in 0..k {
        let (top, first) =
            best_after(input, base, stride, start, count, prev, prev_i, t == 0, shared.clone(), pairs, units);
        if UNIT_POS == 0 {
            out[(at * width + t) * 2] = top;
            out[(at * width + t) * 2 + 1] = first;
        }
        head = select(t == 0, top, head);
        prev = top;
        prev_i = first;
    }
    if comptime!(mass) {
        let temp = temps[row];
        let mut sum = 0.0f32;
        let mut c = UNIT_POS as usize;
        let mut terms = count;
        if comptime!(pairs) {
            terms = chunks;
        }
        if temp > 0.0 {
            while c < terms {
                // Each part's mass about its own largest value, then those about the row's.
                let (v, w) = if comptime!(pairs) {
                    (input[(at * chunks + c) * k * 2], masses[at * chunks + c])
                } else {
                    (input[base + (start + c) * stride], 1.0f32)
                };
                sum += select(v <= head, w * ((v - head) / temp).exp(), 0.0f32);
                c += units;
            }
        }
        let total = cube_reduce(shared, sum, units, false);
        if UNIT_POS == 0 {
            if comptime!(pairs) {
                out[(at * width + k) * 2] = total;
                out[(at * width + k) * 2 + 1] = 0.0f32;
            } else {
                masses[at] = total;
            }
        }
    }
}

/// A mixture-of-experts router's choice for each row of its logits (the first `experts` of
/// each row of `logits`), one cube a row: the `top_k` largest logits (the smaller index first
/// among equal ones, as `torch.topk`), their experts' indices into `ids` and their softmax
/// probabilities into `weights` (over all the row's logits; renormalised to sum to 1 with
/// `norm`). The choice the host makes from the same logits (`Moe::route`), without bringing
/// them back.
///
/// logits: [n, ≥ experts] (any strides), ids: [n, top_k] i32 contiguous, weights: [n, top_k]
/// f32 contiguous.
#[cube(launch)]
pub fn moe_route(
    logits: &Tensor<f32>,
    ids: &mut Tensor<i32>,
    weights: &mut Tensor<f32>,
    experts: usize,
    #[comptime] top_k: usize,
    #[comptime] norm: bool,
    #[comptime] units: usize,
) {
    let row = CUBE_POS;
    if row >= logits.shape(0) {
        terminate!();
    }
    let (base, stride) = (row * logits.stride(0), logits.stride(1));
    let shared = Shared::<[f32]>::new_slice(units);
    let mut top = f32::new(LOWEST);
    let mut e = UNIT_POS as usize;
    while e < experts {
        let v = logits[base + e * stride];
        top = select(v > top, v, top);
        e += units;
    }
    let top = cube_reduce(shared.clone(), top, units, true);
    let mut sum = 0.0f32;
    let mut e = UNIT_POS as usize;
    while e < experts {
        sum += (logits[base + e * stride] - top).exp();
        e += units;
    }
    let sum = cube_reduce(shared.clone(), sum, units, false);
    let mut prev = f32::new(LOWEST);
    let mut prev_i = f32::new(NO_INDEX);
    let mut picked = 0.0f32;
    for t in 0..top_k {
        let (v, i) = best_after(logits, base, stride, 0, experts, prev, prev_i, t == 0, shared.clone(), false, units);
        let found = i < f32::new(NO_INDEX);
        let p = select(found, (v - top).exp() / sum, 0.0f32);
        if UNIT_POS == 0 {
            ids[row * top_k + t] = select(found, i32::cast_from(i), 0i32);
            weights[row * top_k + t] = p;
        }
        picked += p;
        prev = v;
        prev_i = i;
    }
    if comptime!(norm) {
        let writes = UNIT_POS == 0 && picked > 0.0;
        if writes {
            for t in 0..top_k {
                weights[row * top_k + t] /= picked;
            }
        }
    }
}

/// Each (row, slot) pair's product with the expert [`moe_route`] chose for it, over all the
/// experts' matrices stacked (expert e's rows from `e · outs`, outs the output's width), as
/// [`xwt`]'s product of one row: one cube a pair and [`XWT_OUTS`] columns (cube c: pair
/// c / blocks, its block of columns c mod blocks, `blocks` the output's width over XWT_OUTS
/// rounded up). The pair reads row `pair / x_div` of x (for the gate/up product, the layer's
/// input, `x_div` its top-k, under `PRE_NORM` the layer's norm; the down products run in
/// [`xwt_experts_sum`]).
///
/// x: [rows, k] (any strides; [rows, 2k] with `PRE_SWIGLU`), w: [experts · outs, k] (any
/// strides), norm: \[k\] (read with `PRE_NORM`), ids: [pairs] contiguous, out: [pairs, outs]
/// contiguous.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn xwt_experts<W: Float>(
    x: &Tensor<f32>,
    w: &Tensor<W>,
    norm: &Tensor<f32>,
    ids: &Tensor<i32>,
    out: &mut Tensor<f32>,
    x_div: usize,
    blocks: usize,
    eps: f32,
    #[comptime] pre: u32,
) {
    if CUBE_POS / blocks >= ids.len() {
        terminate!();
    }
    let (pair, o, w_row) = table_column(ids, out.shape(1), blocks);
    let shared = Shared::<[f32]>::new_slice(comptime!(XWT_ROWS * XWT_UNITS));
    xwt_column(x, w, norm, shared.clone(), pair / x_div, w_row, eps, 1usize, pre);
    store_rows(shared, out, pair, o, 1usize);
}

/// [`xwt_experts`] over experts' matrices in quantized blocks of one format ([`xwt_q_column`]).
///
/// x, norm, ids, out: as [`xwt_experts`]'s; w: [experts · outs, words a row].
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn xwt_q_experts(
    x: &Tensor<f32>,
    w: &Tensor<u32>,
    norm: &Tensor<f32>,
    ids: &Tensor<i32>,
    out: &mut Tensor<f32>,
    x_div: usize,
    blocks: usize,
    eps: f32,
    #[comptime] pre: u32,
    #[comptime] format: u32,
) {
    if CUBE_POS / blocks >= ids.len() {
        terminate!();
    }
    let (pair, o, w_row) = table_column(ids, out.shape(1), blocks);
    let shared = Shared::<[f32]>::new_slice(comptime!(XWT_ROWS * XWT_UNITS));
    xwt_q_column(x, w, norm, shared.clone(), pair / x_div, w_row, eps, 1usize, pre, format);
    store_rows(shared, out, pair, o, 1usize);
}

/// The down products of [`xwt_experts`]' pair route with their weighted sum in the same launch,
/// in place of the pairs' outputs and [`moe_combine`]: a cube's [`XWT_OUTS`] groups are `slots`
/// of a row's pairs (its top-k, up to XWT_OUTS) for each of `XWT_OUTS / slots` output columns,
/// so the group of slot 0 sums its column's pairs in slot order, as `moe_combine` does, then
/// adds the shared expert's and the residual ([`moe_finish`]). Past XWT_OUTS pairs a row, a
/// cube takes one column and its pairs in passes of XWT_OUTS. Cube c: row c / blocks, its
/// block of columns c mod blocks (`blocks` the output's width over the columns a cube rounded
/// up). Each pair reads its own row of x under `PRE_SWIGLU`, and the weights dense (`w`, with
/// `format` [`DENSE`]) or in quantized blocks of one format (`words`, [`xwt_q_column`]).
///
/// x: [n · top_k, 2 · width] (any strides), w: [experts · h, width] (any strides), words:
/// [experts · h, words a row], ids, weights: [n · top_k] contiguous, shared_y, gate, residual:
/// as [`moe_combine`]'s, out: [n, h] contiguous.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn xwt_experts_sum<W: Float>(
    x: &Tensor<f32>,
    w: &Tensor<W>,
    words: &Tensor<u32>,
    ids: &Tensor<i32>,
    weights: &Tensor<f32>,
    shared_y: &Tensor<f32>,
    gate: &Tensor<f32>,
    gate_col: usize,
    residual: &Tensor<f32>,
    out: &mut Tensor<f32>,
    blocks: usize,
    #[comptime] top_k: usize,
    #[comptime] has_shared: bool,
    #[comptime] has_residual: bool,
    #[comptime] format: u32,
) {
    let slots = comptime!(top_k.min(XWT_OUTS));
    if CUBE_POS / blocks >= out.shape(0) {
        terminate!();
    }
    let h = out.shape(1);
    let cols = comptime!(XWT_OUTS / slots);
    // This unit's group: slot `slot` of row `row`'s pairs in each pass, for output column `o`
    // (`has`: a column of the output).
    let (row, block, group) = (CUBE_POS / blocks, CUBE_POS % blocks, UNIT_POS as usize / XWT_LANES);
    let (slot, col) = (group % slots, group / slots);
    let o = block * cols + col;
    let has = col < cols && o < h;
    // The group that sums its column: slot 0's, by its first unit.
    let lane = UNIT_POS as usize % XWT_LANES;
    let sums = has && slot == 0 && lane == 0;
    let shared = Shared::<[f32]>::new_slice(comptime!(XWT_ROWS * XWT_UNITS));
    let mut sum = 0.0f32;
    #[unroll]
    for pass in 0..comptime!(top_k.div_ceil(slots)) {
        let t = pass * slots + slot;
        let reads = has && t < top_k;
        let pair = row * top_k + select(reads, t, 0usize);
        let expert = usize::cast_from(ids[pair]);
        // A group without a pair or a column reads past the weight's rows: it computes nothing
        // but takes part in the barriers.
        if comptime!(format == DENSE) {
            let w_row = select(reads, expert * h + o, w.shape(0));
            xwt_column(x, w, x, shared.clone(), pair, w_row, 0.0f32, 1usize, PRE_SWIGLU);
        } else {
            let w_row = select(reads, expert * h + o, words.shape(0));
            xwt_q_column(x, words, x, shared.clone(), pair, w_row, 0.0f32, 1usize, PRE_SWIGLU, format);
        }
        // This pass's pairs of the column, weighed by the router, in slot order (the sums
        // `reduce_rows` left at each group's first unit); then a barrier, so the next pass may
        // write `shared`.
        if sums {
            #[unroll]
            for s in 0..slots {
                let t = comptime!(pass * slots + s);
                if comptime!(t < top_k) {
                    sum += weights[row * top_k + t] * shared[UNIT_POS as usize + s * XWT_LANES];
                }
            }
        }
        sync_cube();
    }
    if sums {
        out[row * h + o] = moe_finish(sum, row, o, shared_y, gate, gate_col, residual, has_shared, has_residual);
    }
}

/// The rows of a chunk of [`xwt_grouped`]: each expert's (row, slot) pairs take whole chunks
/// of this many rows in the grouped layout ([`moe_group`]), the last one padded.
pub const MOE_CHUNK: usize = XWT_ROWS;

/// The (row, slot) pairs of [`moe_route`]'s choice grouped by expert, for products that read
/// each chosen expert's matrices once a chunk of [`MOE_CHUNK`] of its pairs rather than once a
/// pair ([`xwt_grouped`]): expert e's pairs, in pair order, take chunks `starts[e]` to
/// `starts[e + 1]` of the grouped layout, its last chunk padded. One cube of `units`:
/// each unit counts its experts' pairs (unit u: experts u, u + units, ...), one sums their
/// chunks, then each writes its experts' pairs.
///
/// Writes `slots[pair]` (the pair's row of the layout), `rows[r]` (row r's row of x: pair /
/// `top_k`; −1 for padding), `chunks[c]` (chunk c's expert, −1 past the last chunk used) and
/// `starts` ([experts + 1]: each expert's first chunk).
///
/// ids: [pairs] i32 (each pair's expert, row-major [n, top_k]), slots: [pairs], rows: [chunks ·
/// MOE_CHUNK], chunks, starts: i32 contiguous.
#[cube(launch)]
pub fn moe_group(
    ids: &Tensor<i32>,
    slots: &mut Tensor<i32>,
    rows: &mut Tensor<i32>,
    chunks: &mut Tensor<i32>,
    starts: &mut Tensor<i32>,
    top_k: usize,
    #[comptime] units: usize,
) {
    let (pairs, experts) = (ids.len(), starts.len() - 1);
    let mut e = UNIT_POS as usize;
    while e < experts {
        let mut count = 0usize;
        for p in 0..pairs {
            count += select(usize::cast_from(ids[p]) == e, 1usize, 0usize);
        }
        starts[e + 1] = i32::cast_from(count.div_ceil(MOE_CHUNK));
        e += units;
    }
    sync_storage();
    if UNIT_POS == 0 {
        starts[0] = 0i32;
        for e in 0..experts {
            starts[e + 1] += starts[e];
        }
    }
    sync_storage();
    let mut e = UNIT_POS as usize;
    while e < experts {
        let (first, end) = (usize::cast_from(starts[e]), usize::cast_from(starts[e + 1]));
        let mut at = first * MOE_CHUNK;
        for p in 0..pairs {
            if usize::cast_from(ids[p]) == e {
                slots[p] = i32::cast_from(at);
                rows[at] = i32::cast_from(p / top_k);
                at += 1;
            }
        }
        while at < end * MOE_CHUNK {
            rows[at] = -1i32;
            at += 1;
        }
        for c in first..end {
            chunks[c] = i32::cast_from(e);
        }
        e += units;
    }
    let mut c = usize::cast_from(starts[experts]) + UNIT_POS as usize;
    while c < chunks.len() {
        chunks[c] = -1i32;
        c += units;
    }
}

/// Row r of x for [`moe_group`]'s layout (`rows[r]` of x; zeros for padding; chunks past the
/// last used left unset), normed with `norm`: `x / sqrt(mean(x²) + eps) · w`. One cube a row.
///
/// x: [n, h] (any strides), w: \[h\] (read with `norm`), rows: [out rows] i32, chunks: [out rows
/// / MOE_CHUNK] i32, out: [out rows, h] contiguous.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn moe_gather(
    x: &Tensor<f32>,
    w: &Tensor<f32>,
    rows: &Tensor<i32>,
    chunks: &Tensor<i32>,
    out: &mut Tensor<f32>,
    eps: f32,
    #[comptime] norm: bool,
    #[comptime] units: usize,
) {
    let r = CUBE_POS;
    if r >= out.shape(0) || chunks[r / MOE_CHUNK] < 0 {
        terminate!();
    }
    let (h, unit) = (out.shape(1), UNIT_POS as usize);
    let from = rows[r];
    if from < 0 {
        let mut i = unit;
        while i < h {
            out[r * h + i] = 0.0f32;
            i += units;
        }
        terminate!();
    }
    let base = usize::cast_from(from) * x.stride(0);
    let mut scale = f32::new(1.0);
    if comptime!(norm) {
        scale = rms_scale(x, base, eps, units);
    }
    let mut i = unit;
    while i < h {
        let mut v = x[base + i * x.stride(1)];
        if comptime!(norm) {
            v = v * scale * w[i * w.stride(0)];
        }
        out[r * h + i] = v;
        i += units;
    }
}

/// Each chunk of [`moe_group`]'s layout through its expert's matrix, read once for the chunk's
/// [`MOE_CHUNK`] rows (padding rows too): as [`xwt`] over rows `chunk · MOE_CHUNK` on, one cube
/// a chunk and [`XWT_OUTS`] columns (cube c: chunk c / blocks, its block of columns c mod
/// blocks), the weight's rows from `expert · outs`. Chunks without an expert are skipped.
///
/// x: [chunks · MOE_CHUNK, k] (any strides; [.., 2k] with `PRE_SWIGLU`), w: [experts · outs, k]
/// (any strides), norm: read with `PRE_NORM` (unused here), chunks: [chunks] i32, out: [chunks ·
/// MOE_CHUNK, outs] contiguous.
#[cube(launch)]
pub fn xwt_grouped<W: Float>(
    x: &Tensor<f32>,
    w: &Tensor<W>,
    norm: &Tensor<f32>,
    chunks: &Tensor<i32>,
    out: &mut Tensor<f32>,
    blocks: usize,
    #[comptime] pre: u32,
) {
    let chunk = CUBE_POS / blocks;
    if chunk >= chunks.len() || chunks[chunk] < 0 {
        terminate!();
    }
    let (_, o, w_row) = table_column(chunks, out.shape(1), blocks);
    let shared = Shared::<[f32]>::new_slice(comptime!(XWT_ROWS * XWT_UNITS));
    xwt_column(x, w, norm, shared.clone(), chunk * MOE_CHUNK, w_row, 0.0f32, MOE_CHUNK, pre);
    store_rows(shared, out, chunk * MOE_CHUNK, o, MOE_CHUNK);
}

/// [`xwt_grouped`] over experts' matrices in quantized blocks of one format ([`xwt_q_column`]).
///
/// x, norm, chunks, out: as [`xwt_grouped`]'s; w: [experts · outs, words a row].
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn xwt_q_grouped(
    x: &Tensor<f32>,
    w: &Tensor<u32>,
    norm: &Tensor<f32>,
    chunks: &Tensor<i32>,
    out: &mut Tensor<f32>,
    blocks: usize,
    #[comptime] pre: u32,
    #[comptime] format: u32,
) {
    let chunk = CUBE_POS / blocks;
    if chunk >= chunks.len() || chunks[chunk] < 0 {
        terminate!();
    }
    let (_, o, w_row) = table_column(chunks, out.shape(1), blocks);
    let shared = Shared::<[f32]>::new_slice(comptime!(XWT_ROWS * XWT_UNITS));
    xwt_q_column(x, w, norm, shared.clone(), chunk * MOE_CHUNK, w_row, 0.0f32, MOE_CHUNK, pre, format);
    store_rows(shared, out, chunk * MOE_CHUNK, o, MOE_CHUNK);
}

/// This unit's entry and output column in [`xwt_experts`]' layout (cube c: entry c / blocks of
/// `table`, a pair or a chunk of [`xwt_grouped`]; its group's column of the block c mod
/// blocks), and the column's row of the stacked weight (the entry's expert's rows from
/// `expert · outs`).
#[cube]
fn table_column(table: &Tensor<i32>, outs: usize, blocks: usize) -> (usize, usize, usize) {
    let (entry, block) = (CUBE_POS / blocks, CUBE_POS % blocks);
    let o = block * XWT_OUTS + UNIT_POS as usize / XWT_LANES;
    let expert = usize::cast_from(table[entry]);
    (entry, o, expert * outs + o)
}

/// Column `o` of rows `row0..row0 + rows` from the sums [`reduce_rows`] left in `shared` for
/// this unit's group, by the group's first unit.
#[cube]
fn store_rows(shared: Shared<[f32]>, out: &mut Tensor<f32>, row0: usize, o: usize, #[comptime] rows: usize) {
    let (unit, outs) = (UNIT_POS as usize, out.shape(1));
    if unit % XWT_LANES == 0 && o < outs {
        #[unroll]
        for r in 0..rows {
            out[(row0 + r) * outs + o] = shared[r * XWT_UNITS + unit];
        }
    }
}

/// The grouped experts' outputs of each row ([`moe_group`]'s layout: pair p's is row
/// `slots[p]` of y) weighed by the router and summed, in the order of its slots, with
/// [`moe_finish`]'s terms; one unit a value. (The pair route sums in its down product,
/// [`xwt_experts_sum`].)
///
/// y: [the grouped layout's rows, h] contiguous, weights: [n, top_k] contiguous, slots: [n ·
/// top_k] i32, shared_y, residual: [n, h] (any strides), gate: [n, > gate_col] (any strides;
/// its column `gate_col` read), out: [n, h] contiguous.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub fn moe_combine(
    y: &Tensor<f32>,
    weights: &Tensor<f32>,
    slots: &Tensor<i32>,
    shared_y: &Tensor<f32>,
    gate: &Tensor<f32>,
    gate_col: usize,
    residual: &Tensor<f32>,
    out: &mut Tensor<f32>,
    #[comptime] top_k: usize,
    #[comptime] shared: bool,
    #[comptime] has_residual: bool,
) {
    let at = ABSOLUTE_POS;
    if at >= out.len() {
        terminate!();
    }
    let h = out.shape(1);
    let (row, c) = (at / h, at % h);
    let mut sum = 0.0f32;
    #[unroll]
    for t in 0..top_k {
        let pair = row * top_k + t;
        sum += weights[pair] * y[usize::cast_from(slots[pair]) * h + c];
    }
    out[at] = moe_finish(sum, row, c, shared_y, gate, gate_col, residual, shared, has_residual);
}

/// Column `c` of row `row` of a mixture's output from its experts' weighed `sum`: plus (with
/// `shared`) the shared expert's output scaled by `sigmoid` of the row's `gate_col` of `gate`,
/// and (with `has_residual`) the residual.
#[cube]
#[allow(clippy::too_many_arguments)]
fn moe_finish(
    sum: f32,
    row: usize,
    c: usize,
    shared_y: &Tensor<f32>,
    gate: &Tensor<f32>,
    gate_col: usize,
    residual: &Tensor<f32>,
    #[comptime] shared: bool,
    #[comptime] has_residual: bool,
) -> f32 {
    let mut sum = sum;
    if comptime!(shared) {
        let g = gate[row * gate.stride(0) + gate_col * gate.stride(1)];
        sum += shared_y[row * shared_y.stride(0) + c * shared_y.stride(1)] / (1.0f32 + (-g).exp());
    }
    if comptime!(has_residual) {
        sum += residual[row * residual.stride(0) + c * residual.stride(1)];
    }
    sum
}
