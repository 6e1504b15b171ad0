//! x·Wᵀ over the packed layout in plain Rust, for CPUs without AVX-512 VNNI: the same integer
//! block dot products and the same per-block f32 arithmetic as `vnni.rs`, one row at a time.

use std::ops::Range;

use super::activation::Activations;
use super::ggml::Params;
use super::packed::{self, GROUP, PANEL, Part};

/// Same contract as `vnni::run`.
pub(crate) fn run(
    part: &Part,
    panels: Range<usize>,
    acts: &Activations,
    x_rows: Range<usize>,
    out: &mut [&mut [f32]],
    bias: Option<&[f32]>,
) {
    let l = &part.layout;
    let first = panels.start;
    let halves = l.ty.sub_blocks(); // two 16-value sub-blocks per group, each with its scale
    let mut acc = vec![[0.0f32; PANEL]; x_rows.len()];
    for p in panels {
        let col = (p - first) * PANEL;
        let width = PANEL.min(part.rows - p * PANEL);
        acc.iter_mut().for_each(|a| *a = [0.0; PANEL]);
        for c in 0..part.chunks {
            let rec = part.record(p, c);
            for g in 0..l.groups {
                let gi = c * l.groups + g;
                let mut q: [[u8; GROUP]; PANEL] = std::array::from_fn(|r| packed::group_values(l, rec, r, g));
                if let Some(lookup) = l.ty.lookup() {
                    // IQ4_NL, MXFP4: each nibble's level + 128, taken as Q8_0's values.
                    q.iter_mut().flatten().for_each(|v| *v = lookup[*v as usize]);
                }
                // Per row and 16-value half: w = S · q + B.
                let sb: [[(f32, f32); 2]; PANEL] =
                    std::array::from_fn(|r| scale_offset(&packed::params(l, rec, r, g), g));
                for (i, acc) in acc.iter_mut().enumerate() {
                    let a = (x_rows.start + i) * acts.groups + gi;
                    let (x, dx, [h0, h1]) = (&acts.q[a], acts.d[a], acts.dsh[a]);
                    for r in 0..PANEL {
                        let half =
                            |h: usize| -> i32 { (16 * h..16 * h + 16).map(|t| q[r][t] as i32 * x[t] as i32).sum() };
                        let (d0, d1) = (half(0), half(1));
                        let [(s0, b0), (s1, b1)] = sb[r];
                        acc[r] += if halves {
                            d0 as f32 * (s0 * dx) + d1 as f32 * (s1 * dx) + b0 * h0 + b1 * h1
                        } else {
                            (d0 + d1) as f32 * (s0 * dx) + b0 * acts.ds[a]
                        };
                    }
                }
            }
        }
        for (row, acc) in out.iter_mut().zip(&acc) {
            for j in 0..width {
                row[col + j] = acc[j] + bias.map_or(0.0, |b| b[col + j]);
            }
        }
    }
}

/// Group g's `(S, B)` per 16-value half, from ggml's parameters: `w = S · q + B`.
fn scale_offset(params: &Params, g: usize) -> [(f32, f32); 2] {
    match *params {
        Params::Offset { d, offset } => {
            let s = d.to_f32();
            [(s, -(offset as f32) * s); 2]
        }
        Params::Min { d, m } => [(d.to_f32(), m.to_f32()); 2],
        Params::KMin { d, dmin, sc, m } => [(d.to_f32() * sc[g] as f32, -(dmin.to_f32() * m[g] as f32)); 2],
        Params::KMin16 { d, dmin, sc, m } => std::array::from_fn(|h| {
            let h = 2 * g + h;
            (d.to_f32() * sc[h] as f32, -(dmin.to_f32() * m[h] as f32))
        }),
        Params::KSigned { d, sc, offset } => std::array::from_fn(|h| {
            let s = d.to_f32() * sc[2 * g + h] as f32;
            (s, -(offset as f32) * s)
        }),
        Params::Levels { d, .. } => {
            let s = d.to_f32();
            [(s, -128.0 * s); 2]
        }
    }
}
