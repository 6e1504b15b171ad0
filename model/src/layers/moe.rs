use std::ops::Range;
use std::sync::Mutex;

use crate::{kernels, transfers};
use burn::tensor::{Device, IndexingUpdateOp, Int, Tensor, TensorData, activation::sigmoid};

use super::linear::{self, Pre};
use super::{Linear, Weight};
use crate::config::Activation;

/// One expert, or a dense layer's feed-forward: a gated feed-forward (SwiGLU; a dense one's may
/// be Gemma's GeGLU, gpt-oss's experts clamp theirs and have biases).
#[derive(Debug, Clone)]
pub struct Expert {
    /// gate, up stacked: [2 · width, hidden].
    pub gate_up: Linear,
    /// [hidden, width]
    pub down: Linear,
    /// The gate (an expert's: SwiGLU, or gpt-oss's clamped one, which only the host's routes
    /// run).
    pub activation: Activation,
}

impl Expert {
    /// # Shapes
    /// x: [m, hidden] → [m, hidden]
    pub fn forward(&self, x: Tensor<2>) -> Tensor<2> {
        self.forward_with(x, Pre::Plain, None)
    }

    /// `residual + self(pre(x))`: the input's norm in the gate/up product and the gate and the
    /// residual sum in the down product, where their kernels take them (a GPU's decode step).
    ///
    /// # Shapes
    /// x: [m, hidden], residual: [m, hidden] → [m, hidden]
    pub fn forward_with(&self, x: Tensor<2>, pre: Pre<'_>, residual: Option<Tensor<2>>) -> Tensor<2> {
        self.down.forward_with(self.gate_up.forward_with(x, pre, None), Pre::Gated(self.activation), residual)
    }
}

/// How a router chooses each token's experts from its logits.
#[derive(Debug, Clone, PartialEq)]
pub enum Choice {
    /// The top-k of a softmax, weighed by their probabilities.
    Softmax,
    /// The top-k by sigmoid score plus `bias` (one per expert), among the experts of the best
    /// `groups_used` of `groups` equal groups (each ranked by the sum of its two best biased
    /// scores), weighed by their sigmoid scores (DeepSeek V3's routing, GLM-4.5's).
    Sigmoid { bias: Vec<f32>, groups: usize, groups_used: usize },
}

/// A mixture-of-experts feed-forward: a router picks each token's top-k experts, whose outputs
/// are summed with the router's weights (renormalised to 1 where `norm_topk_prob`, then times
/// `routed_scale`).
///
/// Two routes. On the host, tokens are grouped by expert, so each expert's weights are read once
/// per pass for all the tokens that chose it, not once per token; the grouping needs the router's
/// scores on the host, on a GPU a read back (a wait for the device) every layer. On a GPU with
/// the experts' matrices [`stacked`](ExpertStacks), a decode step's rows are routed there
/// instead (`kernels::gpu_moe`): each (row, expert) pair reads its expert's matrices, or past
/// one pair an expert the pairs are grouped by expert there; nothing comes back, and the step
/// runs to its logits without waiting.
#[derive(Debug, Clone)]
pub struct Moe {
    /// The router's rows, [experts, hidden], then where there is a shared expert its gate's row
    /// ([1, hidden]): one product for both.
    pub router: Linear,
    /// Each expert's matrices: on a GPU with `stacks`, views of its rows of them.
    pub experts: Vec<Expert>,
    pub top_k: usize,
    pub norm_topk_prob: bool,
    pub choice: Choice,
    /// The chosen experts' weights are multiplied by this (GLM-4.5's `routed_scaling_factor`).
    pub routed_scale: f32,
    /// A shared expert every token goes through: scaled by `sigmoid(gate · x)` where
    /// `shared_gated` (Qwen2-MoE), its gate the router's last row; else added as it is
    /// (GLM-4.5).
    pub shared: Option<Expert>,
    pub shared_gated: bool,
    /// The experts' matrices in one buffer each, where the device routes on its own.
    pub stacks: Option<ExpertStacks>,
}

/// All experts' matrices of a layer stacked, one buffer each (on a GPU, for routing there):
/// expert e's gate/up rows from `e · 2 · width`, its down rows from `e · hidden`.
#[derive(Debug, Clone)]
pub struct ExpertStacks {
    /// [experts · 2 · width, hidden]: each expert's gate rows, then its up rows.
    pub gate_up: Weight,
    /// [experts · hidden, width]
    pub down: Weight,
}

impl ExpertStacks {
    /// On a GPU whose kernels route experts, `experts`' matrices stacked, and the experts as views
    /// of their rows (no second copy where the device's buffer offsets allow one; at the
    /// experts' sizes of real models they do); elsewhere, or where the stacks cannot be one
    /// buffer each of one format (quantized parts of several formats, a stack over the device's
    /// largest buffer), or the kernels do not compute the experts (biases, a gate other than
    /// SwiGLU: gpt-oss's), the experts as they are and no stacks.
    pub fn build(experts: Vec<Expert>) -> (Vec<Expert>, Option<Self>) {
        let plain = |e: &Expert| e.activation == Activation::Silu && e.gate_up.bias.is_none() && e.down.bias.is_none();
        if !experts.iter().all(plain) {
            return (experts, None);
        }
        let gate_up: Vec<Weight> = experts.iter().map(|e| e.gate_up.weight.clone()).collect();
        let down: Vec<Weight> = experts.iter().map(|e| e.down.weight.clone()).collect();
        let (Some(gate_up), Some(down)) = (linear::stack_rows(&gate_up), linear::stack_rows(&down)) else {
            return (experts, None);
        };
        let stacks = Self { gate_up, down };
        (stacks.views(experts.len()), Some(stacks))
    }

    /// The `experts` experts as views of their rows of the stacks.
    pub fn views(&self, experts: usize) -> Vec<Expert> {
        let ([gu_rows, _], [d_rows, _]) = (self.gate_up.dims(), self.down.dims());
        let (gu, d) = (gu_rows / experts.max(1), d_rows / experts.max(1));
        (0..experts)
            .map(|e| Expert {
                gate_up: Linear { weight: linear::row_view(&self.gate_up, e * gu..(e + 1) * gu), bias: None },
                down: Linear { weight: linear::row_view(&self.down, e * d..(e + 1) * d), bias: None },
                activation: Activation::Silu,
            })
            .collect()
    }

    /// The stacks with `rows` of the gate/up stack (or with `down`, of the down stack) replaced
    /// by `data` ([`linear::write_rows`]: in place where the experts' views have let go of the
    /// stack); `Err(self)` unchanged where the stack cannot take them.
    pub fn with_rows(self, down: bool, rows: Range<usize>, data: TensorData, device: &Device) -> Result<Self, Self> {
        let Self { gate_up, down: down_stack } = self;
        if down {
            match linear::write_rows(down_stack, rows, data, device) {
                Ok(down_stack) => Ok(Self { gate_up, down: down_stack }),
                Err(down_stack) => Err(Self { gate_up, down: down_stack }),
            }
        } else {
            match linear::write_rows(gate_up, rows, data, device) {
                Ok(gate_up) => Ok(Self { gate_up, down: down_stack }),
                Err(gate_up) => Err(Self { gate_up, down: down_stack }),
            }
        }
    }
}

/// Tokens routed to each expert index since the process started (all MoE layers summed), and
/// expert products run: how well a pass groups its tokens. Host-routed passes only: a pass
/// routed on a GPU never brings its choice back (its products count as `cube_experts` among
/// `kernels::calls`).
static ROUTED: Mutex<(Vec<u64>, u64)> = Mutex::new((Vec::new(), 0));

/// Tokens routed to each expert index so far, and the expert products run for them.
pub fn expert_stats() -> (Vec<u64>, u64) {
    ROUTED.lock().map(|r| r.clone()).unwrap_or_default()
}

impl Moe {
    /// # Shapes
    /// x: [n, hidden] (normed) → [n, hidden]
    pub fn forward(&self, x: Tensor<2>) -> Tensor<2> {
        self.forward_with(x, Pre::Plain, None)
    }

    /// `residual + self(pre(x))`. Routed on a GPU ([`Self::routes_on_device`]), the residual is
    /// added in the experts' last kernel, and a few rows (as many as the few-row products take
    /// with their norm) are normed inside each product that reads them (the router's, the shared
    /// expert's, the routed experts' gate/up or their gathered rows); otherwise x is normed once
    /// first.
    ///
    /// # Shapes
    /// x: [n, hidden], residual: [n, hidden] → [n, hidden]
    pub fn forward_with(&self, x: Tensor<2>, pre: Pre<'_>, residual: Option<Tensor<2>>) -> Tensor<2> {
        let n = x.dims()[0];
        let on_device = self.routes_on_device(n);
        // The few-row products take the norm inside; the device's routing, its gathered rows'.
        let inside = on_device && n <= kernels::gpu_fused_rows();
        let (x, pre) = if inside { (x, pre) } else { (pre.apply(x), Pre::Plain) };
        // The router's scores and the shared expert's gate, in one product.
        let experts = self.experts.len();
        let scores = self.router.forward_with(x.clone(), pre, None);
        let shared = self.shared.as_ref().map(|s| s.forward_with(x.clone(), pre, None));
        if let Some(stacks) = self.stacks.as_ref().filter(|_| on_device) {
            let stacks = [stacks.gate_up.matrix().gpu(), stacks.down.matrix().gpu()];
            if let [Some(gate_up), Some(down)] = stacks
                && let Some(y) = kernels::gpu_moe(
                    &x,
                    pre,
                    &scores,
                    self.top_k,
                    self.norm_topk_prob,
                    [gate_up, down],
                    shared.as_ref(),
                    residual.as_ref(),
                )
            {
                return y;
            }
        }
        let x = pre.apply(x);
        // The router's scores come to the host to group the tokens by expert: on a GPU, the
        // layer's one read back (the shared expert's gate with them). A failed read fails the
        // pass (its panic is the pass's error), rather than routing nothing.
        let read: Vec<f32> = transfers::read(scores.clone()).expect("reading the router's scores");
        let groups = self.route(&read, n);
        self.count(&groups);
        let routed = match Self::packed_on_host(&self.experts, &groups, &x) {
            Some(routed) => routed,
            None if n == 1 => Self::one_row(&self.experts, &groups, x),
            None => Self::grouped(&self.experts, &groups, x),
        };
        let y = match shared {
            None => routed,
            Some(y) if self.shared_gated => routed + y * sigmoid(scores.narrow(1, experts, 1)),
            Some(y) => routed + y,
        };
        match residual {
            Some(r) => r + y,
            None => y,
        }
    }

    /// Whether a pass of `n` rows is routed on the GPU (`kernels::gpu_moe`): where the experts
    /// are stacked there and the rows are a decode step's, at most
    /// [`kernels::gpu_moe_pairs_per_expert`] (row, expert) pairs an expert on average. The
    /// device reads a chosen expert's matrices once a pair (one pair an expert or fewer) or
    /// once a chunk of four of its pairs; a prompt's many rows read them once on the host's
    /// grouping, for the wait on the router's scores.
    /// The device's router takes a softmax's top-k, unscaled, with a gated shared expert or none.
    pub fn routes_on_device(&self, n: usize) -> bool {
        let routable =
            self.choice == Choice::Softmax && self.routed_scale == 1.0 && (self.shared.is_none() || self.shared_gated);
        routable
            && self.stacks.is_some()
            && n * self.top_k <= self.experts.len().saturating_mul(kernels::gpu_moe_pairs_per_expert())
    }

    /// On the CPU with packed (quantized) experts, a decode step's rows (at most
    /// [`kernels::XWT_MAX_ROWS`]): the chosen experts' gate/up products in one parallel loop,
    /// then their down products in another (`linear::packed_products`), rather than two loops an
    /// expert; each expert's rows gathered (a single row taken as it is), and the outputs weighed
    /// and added on the host in the experts' order, as [`Self::grouped`] and [`Self::one_row`]
    /// add them (their biases too, gpt-oss's). `None` elsewhere: another device, an expert's
    /// matrix dense, or a prompt's rows, whose experts take many rows each and ran 5-15% slower
    /// this way (`qwen3-moe-mini`, prefill 512, Zen 4).
    fn packed_on_host(experts: &[Expert], groups: &[Vec<(usize, f32)>], x: &Tensor<2>) -> Option<Tensor<2>> {
        let packed = |l: &Linear| matches!(l.weight.matrix(), linear::Matrix::Packed(_));
        let chosen: Vec<(&Expert, &[(usize, f32)])> = experts
            .iter()
            .zip(groups)
            .filter(|(_, rows)| !rows.is_empty())
            .map(|(e, rows)| (e, rows.as_slice()))
            .collect();
        let [n, hidden] = x.dims();
        let decode = n <= kernels::XWT_MAX_ROWS;
        if !decode || x.device() != Device::flex() || !chosen.iter().all(|(e, _)| packed(&e.gate_up) && packed(&e.down))
        {
            return None;
        }
        let x: Vec<f32> = transfers::read(x.clone()).ok()?;
        let inputs: Vec<Vec<f32>> = match n {
            1 => Vec::new(),
            _ => chosen
                .iter()
                .map(|(_, rows)| {
                    let mut input = Vec::with_capacity(rows.len() * hidden);
                    for &(row, _) in *rows {
                        input.extend_from_slice(&x[row * hidden..(row + 1) * hidden]);
                    }
                    input
                })
                .collect(),
        };
        let input = |i: usize| inputs.get(i).map_or(x.as_slice(), Vec::as_slice);
        let products: Vec<(&Linear, &[f32])> =
            chosen.iter().enumerate().map(|(i, (e, _))| (&e.gate_up, input(i))).collect();
        let gate_up = linear::packed_products(&products)?;
        let gated: Vec<Vec<f32>> = chosen
            .iter()
            .zip(&gate_up)
            .map(|((e, _), g)| kernels::swiglu_host(g, e.down.weight.dims()[1], e.activation))
            .collect();
        let products: Vec<(&Linear, &[f32])> =
            chosen.iter().zip(&gated).map(|((e, _), g)| (&e.down, g.as_slice())).collect();
        let down = linear::packed_products(&products)?;
        let mut out = vec![0.0f32; n * hidden];
        for ((_, rows), y) in chosen.iter().zip(&down) {
            for (&(row, weight), y) in rows.iter().zip(y.chunks_exact(hidden)) {
                for (o, v) in out[row * hidden..(row + 1) * hidden].iter_mut().zip(y) {
                    *o += weight * v;
                }
            }
        }
        Some(Tensor::from_data(TensorData::new(out, [n, hidden]), &Device::flex()))
    }

    /// One row (a batch-1 decode step): each chosen expert takes it whole, so it runs on x itself
    /// and its output is weighed by a scalar: no row ids or weights to upload, no gather or
    /// scatter (on a GPU, a launch and two uploads fewer an expert than the grouped pass).
    /// The sum runs in the experts' order, as the grouped pass's does.
    fn one_row(experts: &[Expert], groups: &[Vec<(usize, f32)>], x: Tensor<2>) -> Tensor<2> {
        let mut sum: Option<Tensor<2>> = None;
        for (expert, rows) in experts.iter().zip(groups) {
            let Some(&(_, weight)) = rows.first() else { continue };
            let y = expert.forward(x.clone()).mul_scalar(weight);
            sum = Some(match sum {
                None => y,
                Some(sum) => sum + y,
            });
        }
        sum.unwrap_or_else(|| x.zeros_like())
    }

    /// Rows grouped by expert: each expert's weights are read once for all the rows that chose it.
    fn grouped(experts: &[Expert], groups: &[Vec<(usize, f32)>], x: Tensor<2>) -> Tensor<2> {
        let [n, hidden] = x.dims();
        let device = x.device();
        let mut on_host = (device == Device::flex()).then(|| vec![0.0f32; n * hidden]);
        let mut on_device = None;
        for (expert, rows) in experts.iter().zip(groups) {
            if rows.is_empty() {
                continue;
            }
            let ids: Vec<i64> = rows.iter().map(|&(row, _)| row as i64).collect();
            let len = ids.len();
            let ids: Tensor<1, Int> = transfers::upload(TensorData::new(ids, [len]), &device);
            let y = expert.forward(x.clone().select(0, ids.clone()));
            match &mut on_host {
                // On the CPU the outputs are in memory: weigh and add them there.
                Some(out) => {
                    let y: Vec<f32> = transfers::read(y).expect("reading an expert's output");
                    for (&(row, weight), y) in rows.iter().zip(y.chunks_exact(hidden)) {
                        for (o, v) in out[row * hidden..(row + 1) * hidden].iter_mut().zip(y) {
                            *o += weight * v;
                        }
                    }
                }
                // On a GPU they stay there: weighed and added into their rows on the device,
                // so an expert costs two small uploads and no read back.
                None => {
                    let weights: Vec<f32> = rows.iter().map(|&(_, w)| w).collect();
                    let weights: Tensor<2> = transfers::upload(TensorData::new(weights, [len, 1]), &device);
                    let sum = on_device.take().unwrap_or_else(|| Tensor::<2>::zeros([n, hidden], &device));
                    on_device = Some(sum.select_assign(0, ids, y * weights, IndexingUpdateOp::Add));
                }
            }
        }
        match on_host {
            Some(out) => transfers::upload(TensorData::new(out, [n, hidden]), &device),
            None => on_device.unwrap_or_else(|| Tensor::zeros([n, hidden], &device)),
        }
    }

    /// Adds a pass's routing to the process's [`expert_stats`].
    fn count(&self, groups: &[Vec<(usize, f32)>]) {
        if let Ok(mut routed) = ROUTED.lock() {
            let (tokens, products) = &mut *routed;
            tokens.resize(tokens.len().max(groups.len()), 0);
            for (count, rows) in tokens.iter_mut().zip(groups) {
                *count += rows.len() as u64;
            }
            *products += groups.iter().filter(|rows| !rows.is_empty()).count() as u64;
        }
    }

    /// Each expert's tokens (row, weight): each row's top-k experts by the router's [`Choice`]
    /// over its logits (the first of each row of `scores`, the router's [n, experts (+ 1 with a
    /// shared expert's gate)] row-major), their weights renormalised where the config says, then
    /// scaled.
    fn route(&self, scores: &[f32], n: usize) -> Vec<Vec<(usize, f32)>> {
        let experts = self.experts.len();
        let width = experts + usize::from(self.shared.is_some() && self.shared_gated);
        let mut groups: Vec<Vec<(usize, f32)>> = vec![Vec::new(); experts];
        for (row, scores) in scores.chunks_exact(width).take(n).enumerate() {
            let logits = &scores[..experts];
            // Each expert's weight, and what it is chosen by.
            let (weights, keys) = match &self.choice {
                Choice::Softmax => {
                    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                    let exp: Vec<f32> = logits.iter().map(|l| (l - max).exp()).collect();
                    let sum: f32 = exp.iter().sum();
                    let p: Vec<f32> = exp.iter().map(|e| e / sum).collect();
                    (p.clone(), p)
                }
                Choice::Sigmoid { bias, groups, groups_used } => {
                    let p: Vec<f32> = logits.iter().map(|&l| 1.0 / (1.0 + (-l).exp())).collect();
                    let mut keys: Vec<f32> = p.iter().zip(bias).map(|(p, b)| p + b).collect();
                    let size = experts / groups.max(&1);
                    if *groups > 1 && size >= 2 {
                        // Each group's rank: its two best keys summed; the others' experts are out.
                        let rank: Vec<f32> = keys
                            .chunks_exact(size)
                            .map(|g| {
                                let (best, second) =
                                    g.iter().fold((f32::NEG_INFINITY, f32::NEG_INFINITY), |(a, b), &k| {
                                        if k > a { (k, a) } else { (a, b.max(k)) }
                                    });
                                best + second
                            })
                            .collect();
                        let mut order: Vec<usize> = (0..rank.len()).collect();
                        order.sort_by(|&a, &b| rank[b].total_cmp(&rank[a]).then(a.cmp(&b)));
                        for &g in &order[(*groups_used).min(rank.len())..] {
                            keys[g * size..(g + 1) * size].fill(f32::NEG_INFINITY);
                        }
                    }
                    (p, keys)
                }
            };
            let mut order: Vec<usize> = (0..experts).collect();
            // Highest first; the lower index first on a tie, as torch.topk.
            order.sort_by(|&a, &b| keys[b].total_cmp(&keys[a]).then(a.cmp(&b)));
            let top = &order[..self.top_k.min(experts)];
            // transformers' guard against a sum of zero (sigmoid scores that all underflow).
            let picked: f32 = top.iter().map(|&e| weights[e]).sum::<f32>() + 1e-20;
            for &e in top {
                let w = if self.norm_topk_prob { weights[e] / picked } else { weights[e] };
                groups[e].push((row, w * self.routed_scale));
            }
        }
        groups
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::linear;
    use burn::tensor::Device;

    fn matrix(rows: usize, cols: usize, seed: u32) -> Linear {
        let values = crate::kernels::test_values(rows * cols, seed);
        let w = Tensor::<2>::from_data(TensorData::new(values, [rows, cols]), &Device::flex());
        Linear { weight: linear::dense(w), bias: None }
    }

    /// A packed (quantized, the CPU's) matrix.
    fn packed(rows: usize, cols: usize, seed: u32) -> Linear {
        let values = crate::kernels::test_values(rows * cols, seed);
        let w = crate::quant::PackedMatrix::quantize(crate::quant::QuantType::Q8_0, rows, cols, &values).unwrap();
        Linear { weight: linear::packed(std::sync::Arc::new(w)), bias: None }
    }

    /// Sigmoid routing as transformers' `Glm4MoeTopkRouter` (DeepSeek V3's): experts chosen by
    /// score plus bias within the best groups, weighed by their scores alone, renormalised and
    /// scaled; an ungated shared expert takes no router row.
    #[test]
    fn sigmoid_routing_chooses_by_biased_scores_within_the_best_groups() {
        let hidden = 4;
        let expert = |e: u32| Expert {
            gate_up: matrix(2 * 3, hidden, 10 + e),
            down: matrix(hidden, 3, 20 + e),
            activation: Activation::Silu,
        };
        let sigmoid = |l: f32| 1.0 / (1.0 + (-l).exp());
        // Eight experts in four groups of two; two groups kept, three experts a token.
        let logits = [0.5f32, 0.4, -1.0, 3.0, 0.0, 0.1, 2.0, -2.0];
        // The bias lifts expert 2 (group 1).
        let bias = [0.0f32, 0.0, 0.6, 0.0, 0.0, 0.0, 0.0, 0.0];
        let route = |groups: usize, groups_used: usize, norm: bool, scale: f32| {
            let moe = Moe {
                router: matrix(8, hidden, 3),
                experts: (0..8).map(expert).collect(),
                top_k: 3,
                norm_topk_prob: norm,
                choice: Choice::Sigmoid { bias: bias.to_vec(), groups, groups_used },
                routed_scale: scale,
                shared: Some(expert(99)),
                shared_gated: false,
                stacks: None,
            };
            let mut scores = logits.to_vec();
            scores.extend(logits.iter().rev());
            let groups = moe.route(&scores, 2);
            let mut first: Vec<(usize, f32)> =
                (0..8).filter_map(|e| groups[e].iter().find(|&&(row, _)| row == 0).map(|&(_, w)| (e, w))).collect();
            first.sort_by_key(|&(e, _)| e);
            first
        };
        let keys: Vec<f32> = logits.iter().zip(&bias).map(|(&l, b)| sigmoid(l) + b).collect();
        // Groups by their two best keys: 0 → 1.22, 1 → 1.82, 2 → 1.03, 3 → 1.00; groups 1 and 0
        // are kept, so experts 3, 2 and 0 are chosen, not 6 (the second best key, in group 3).
        assert!(keys[2] + keys[3] > keys[0] + keys[1] && keys[0] + keys[1] > keys[4] + keys[5]);
        assert!(keys[4] + keys[5] > keys[6] + keys[7] && keys[6] > keys[2] && keys[2] > keys[0]);
        let chosen = [0usize, 2, 3];
        let picked: f32 = chosen.iter().map(|&e| sigmoid(logits[e])).sum();
        let got = route(4, 2, true, 2.5);
        assert_eq!(got.iter().map(|&(e, _)| e).collect::<Vec<_>>(), chosen);
        for &(e, w) in &got {
            let want = sigmoid(logits[e]) / picked * 2.5;
            assert!((w - want).abs() < 1e-6, "expert {e}: {w} vs {want}");
        }
        // One group: the three best keys over all experts, 3, 6 and 2 (by its bias), weighed by
        // their scores without it.
        let got = route(1, 1, false, 1.0);
        assert_eq!(got.iter().map(|&(e, _)| e).collect::<Vec<_>>(), [2, 3, 6]);
        for &(e, w) in &got {
            assert!((w - sigmoid(logits[e])).abs() < 1e-7, "expert {e}: unnormalised weights are the scores");
        }
    }

    /// The grouped pass, and the one-row pass on each row alone, equal each token run through its
    /// top-k experts by hand: with dense experts, and with packed ones (whose products run
    /// together on the host: `packed_on_host`).
    #[test]
    fn grouped_experts_equal_a_per_token_reference() {
        for (hidden, width, make) in [(8, 6, matrix as fn(usize, usize, u32) -> Linear), (64, 32, packed)] {
            experts_equal_a_per_token_reference(hidden, width, make);
        }
    }

    fn experts_equal_a_per_token_reference(hidden: usize, width: usize, make: fn(usize, usize, u32) -> Linear) {
        let (experts, n) = (5, 7);
        let expert = |e: u32| Expert {
            gate_up: make(2 * width, hidden, 10 + e),
            down: make(hidden, width, 20 + e),
            activation: Activation::Silu,
        };
        let packed = matches!(expert(0).down.weight.matrix(), linear::Matrix::Packed(_));
        for (norm, shared) in [(true, false), (false, true)] {
            let moe = Moe {
                router: matrix(experts + usize::from(shared), hidden, 3),
                experts: (0..experts as u32).map(expert).collect(),
                top_k: 2,
                norm_topk_prob: norm,
                choice: Choice::Softmax,
                routed_scale: 1.0,
                shared: shared.then(|| expert(99)),
                shared_gated: true,
                stacks: None,
            };
            let values: Vec<f32> = crate::kernels::test_values(n * hidden, 5).iter().map(|v| v * 2.0).collect();
            let x = Tensor::<2>::from_data(TensorData::new(values.clone(), [n, hidden]), &Device::flex());
            let groups = moe.route(&moe.router.forward(x.clone()).into_data().try_into_vec::<f32>().unwrap(), n);
            let on_host = Moe::packed_on_host(&moe.experts, &groups, &x);
            assert_eq!(on_host.is_some(), packed, "the host's route");
            // A prompt's rows take the grouped pass.
            let long = Tensor::<2>::zeros([kernels::XWT_MAX_ROWS + 1, hidden], &Device::flex());
            let width = experts + usize::from(shared);
            let long_groups = moe.route(&vec![0.0; (kernels::XWT_MAX_ROWS + 1) * width], kernels::XWT_MAX_ROWS + 1);
            assert!(Moe::packed_on_host(&moe.experts, &long_groups, &long).is_none());
            if let Some(on_host) = on_host {
                // The same products as the grouped pass runs one expert at a time, bit for bit.
                let bits = |t: Tensor<2>| t.into_data().iter::<f32>().map(f32::to_bits).collect::<Vec<_>>();
                assert_eq!(bits(on_host), bits(Moe::grouped(&moe.experts, &groups, x.clone())));
            }
            let got = moe.forward(x).into_data().try_into_vec::<f32>().unwrap();
            let mut chosen = std::collections::BTreeSet::new();
            for row in 0..n {
                let x = Tensor::<2>::from_data(
                    TensorData::new(values[row * hidden..(row + 1) * hidden].to_vec(), [1, hidden]),
                    &Device::flex(),
                );
                let scores = moe.router.forward(x.clone()).into_data().try_into_vec::<f32>().unwrap();
                let logits = &scores[..experts];
                let sum: f32 = logits.iter().map(|l| l.exp()).sum();
                let mut order: Vec<usize> = (0..experts).collect();
                order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]));
                let top: f32 = order[..2].iter().map(|&e| logits[e].exp() / sum).sum();
                let mut want = vec![0.0f32; hidden];
                for &e in &order[..2] {
                    chosen.insert(e);
                    let p = logits[e].exp() / sum;
                    let w = if norm { p / top } else { p };
                    let y = moe.experts[e].forward(x.clone()).into_data().try_into_vec::<f32>().unwrap();
                    want.iter_mut().zip(&y).for_each(|(o, y)| *o += w * y);
                }
                if let Some(s) = &moe.shared {
                    // The shared expert's gate: the router's last row.
                    let g = scores[experts];
                    let y = s.forward(x.clone()).into_data().try_into_vec::<f32>().unwrap();
                    want.iter_mut().zip(&y).for_each(|(o, y)| *o += y / (1.0 + (-g).exp()));
                }
                // A quantized product's sums run in another order over several rows than over one.
                let tolerance = if packed { 1e-4 } else { 1e-5 };
                for (i, (g, w)) in got[row * hidden..(row + 1) * hidden].iter().zip(&want).enumerate() {
                    assert!((g - w).abs() < tolerance * w.abs().max(1.0), "row {row} dim {i}: {g} vs {w}");
                }
                // The row alone (the one-row pass, a batch-1 decode step's) gives the same.
                let alone = moe.forward(x).into_data().try_into_vec::<f32>().unwrap();
                for (i, (g, w)) in alone.iter().zip(&want).enumerate() {
                    assert!((g - w).abs() < 1e-5 * w.abs().max(1.0), "row {row} alone, dim {i}: {g} vs {w}");
                }
            }
            assert!(chosen.len() > 2, "the tokens chose different experts: {chosen:?}");
        }
    }
}
