//! C5: the decoder's batched forward pass, for every served family. embedding (× √hidden: Gemma)
//! → N × [RMSNorm → q, k, v (biases where the family has them) → per-head q/k RMSNorm (Qwen3,
//! Gemma 3) → RoPE (scaled as the config says; a local layer's by its own base) → write k, v
//! into the batch's cells → GQA attention over the visible cells (a local layer's: those within
//! its sliding window; scores soft-capped: Gemma 2; each head's sink in its softmax: gpt-oss)
//! → o (times a sigmoid gate per head: Qwen3.5) → RMSNorm (Gemma) → residual → RMSNorm →
//! SwiGLU, GeGLU or mixture-of-experts MLP → RMSNorm (Gemma) → residual]
//! → final RMSNorm → lm head for the flagged rows only (logits soft-capped: Gemma 2). A
//! linear-attention layer (Qwen3.5's gated DeltaNet) has its stacked input projection →
//! `DeltaNet` over each sequence's state in the cache → output projection in place of the
//! attention. A latent-attention layer (DeepSeek's, GLM-4.7-Flash's) has its stacked query and
//! latent projection → `LatentAttention::project` (queries in the latent space, one cached row a
//! token) → the same attention over one key-value head → `LatentAttention::values` → o.

use burn::tensor::{DType, Device, Int, Tensor, TensorData};

use super::fused_experts::FusedExperts;
use super::replay::{self, Plan, StepGraphs};
use super::split_experts::SplitExperts;
use super::weights::{self, Reordered, Weights};
use crate::adapter;
use crate::batch::{BatchInput, ValidBatch};
use crate::checkpoint::Checkpoint;
use crate::config::ModelConfig;
use crate::device::DeviceStream;
use crate::error::{DecodeError, LoadError};
use crate::gguf::{self, GgufFile};
use crate::kernels;
use crate::kv::{KvCache, KvLayout, Placement, Pos, RecurrentLayout};
use crate::layers::{Linear, Pre, RmsNorm, Rope, RopeTables, attention};
use crate::lm::{LanguageModel, ModelInfo};
use crate::quant::Imatrix;
use crate::registry::LoadOptions;
use crate::source::ModelSource;
use crate::tensors::{Naming, TensorSource};
use crate::vision::{self, Features, Image, Vision, VisionInfo};

pub struct Decoder {
    config: ModelConfig,
    info: ModelInfo,
    weights: Weights,
    rope: Rope,
    /// The local layers' (Gemma's sliding-window layers), where the model has them.
    local_rope: Option<Rope>,
    device: Device,
    /// Where all of its device work goes, whichever thread calls (on a GPU).
    stream: DeviceStream,
    /// Decode steps recorded and replayed on a GPU.
    graphs: StepGraphs,
    /// Its vision tower, where it sees images.
    vision: Option<Vision>,
}

/// The registry entry: loads the configuration and the weights of a Hugging Face directory or a
/// GGUF file, checking every slot before the first tensor is read.
pub fn load(
    source: Option<&ModelSource>,
    opts: &LoadOptions,
    device: &Device,
) -> Result<Box<dyn LanguageModel>, LoadError> {
    let source = source.ok_or(LoadError::NeedsDirectory { model_type: "qwen2, qwen3 or llama" })?;
    let (config, src): (ModelConfig, Box<dyn TensorSource>) = match source {
        ModelSource::Dir(dir) => {
            let config = ModelConfig::from_dir(dir)?;
            let checkpoint = Checkpoint::open(dir)?
                .aliased(config.arch.hf_aliases)
                .without_layers(config.num_hidden_layers..config.num_hidden_layers + config.nextn_layers);
            // Experts kept in 3-D tensors (gpt-oss's), read as one tensor each.
            let fused = config.arch.experts.as_ref().is_some_and(|e| e.fused_3d.is_some());
            let src: Box<dyn TensorSource> = match fused {
                true => match FusedExperts::new(checkpoint, &config) {
                    Ok(fused) => Box::new(fused),
                    Err(checkpoint) => Box::new(checkpoint),
                },
                false => Box::new(checkpoint),
            };
            (config, src)
        }
        ModelSource::Gguf { path, .. } => {
            let file = GgufFile::open(path)?;
            let conversions = file.conversions();
            if !conversions.is_empty() {
                // The kernels do not run these formats: the model takes more memory than the file.
                tracing::info!(conversions = conversions.join(", "), "tensors converted at load");
            }
            let config = gguf::model_config(&file)?;
            // Experts kept one tensor each (older Mixtral files), read stacked.
            let src = SplitExperts::wrap(Box::new(file), &config)?;
            (config, src)
        }
    };
    // Adapters merged into the tensors they change, as stored.
    let src = adapter::adapted(src, &opts.adapters, &config)?;
    // Rows the kernels take in another order than the checkpoint holds them (Qwen3.5's q and k).
    // and tensors it holds fused (Qwen3-Next's linear attention).
    let naming = src.naming();
    // A split applies where the checkpoint holds the fused tensor (latent attention's
    // `attn_kv_b` is in GGUF files from before llama.cpp split it, its parts in later ones).
    let orders: Vec<_> = {
        let stored = src.names();
        let all = weights::reorderings(&config, naming).into_iter();
        all.filter(|(_, from, _)| stored.contains(from.as_str())).collect()
    };
    let src: Box<dyn TensorSource> = if orders.is_empty() { src } else { Box::new(Reordered { inner: src, orders }) };
    weights::check(&config, src.as_ref())?;
    let stream = DeviceStream::for_device(device);
    let imatrix = opts.imatrix.as_deref().map(Imatrix::open).transpose()?;
    if let Some(m) = &imatrix {
        tracing::info!(path = %m.path().display(), entries = m.len(), "importance matrix for quantizing at load");
    }
    let weights = stream.enter(|| Weights::load(&config, src.as_ref(), opts.weight_dtype, imatrix.as_ref(), device))?;
    let vision = stream.enter(|| Vision::load(source, &config, device))?;
    tracing::info!(
        path = %source.path().display(),
        weights = %weights.describe(),
        mib = weights.matrix_bytes() >> 20,
        arch = config.arch.name,
        images = vision.is_some(),
        "weights loaded"
    );
    Ok(Box::new(Decoder::new(config, weights, device, stream, opts.step_graphs, vision)))
}

/// The registry's info entry: what `load` would report, from the configuration alone.
pub fn info(source: Option<&ModelSource>) -> Result<ModelInfo, LoadError> {
    let source = source.ok_or(LoadError::NeedsDirectory { model_type: "qwen2, qwen3 or llama" })?;
    let config = match source {
        ModelSource::Dir(dir) => ModelConfig::from_dir(dir)?,
        ModelSource::Gguf { path, .. } => gguf::model_config(&GgufFile::open(path)?)?,
    };
    Ok(info_of(&config, vision::info(source, &config)?))
}

fn info_of(config: &ModelConfig, vision: Option<VisionInfo>) -> ModelInfo {
    ModelInfo {
        model_type: config.arch.name,
        vocab_size: config.vocab_size,
        hidden_size: config.hidden_size,
        context_length: config.max_position_embeddings,
        bos_token_id: config.bos_token_id,
        eos_token_ids: config.eos_token_ids.clone(),
        pooling: config.pooling.unwrap_or_default(),
        state_bytes: config.linear.as_ref().map_or(0, |a| {
            let (conv, memory) = a.state_floats();
            (config.num_hidden_layers - config.attention_layers()) * (conv + memory) * 4
        }),
        vision,
    }
}

impl Decoder {
    fn new(
        config: ModelConfig,
        weights: Weights,
        device: &Device,
        stream: DeviceStream,
        graphs: bool,
        vision: Option<Vision>,
    ) -> Self {
        let info = info_of(&config, vision.as_ref().map(|v| v.info.clone()));
        let rope = Rope::from_config(&config);
        let local_rope = Rope::local(&config);
        // A graph keeps the memory its step was given: where a product of more rows than the
        // few-row kernels take dequantizes a matrix of blocks each step (the output
        // projection's among them, hundreds of MB), only steps they take are recorded.
        let rows = if weights.blocks_on_device() { kernels::gpu_fused_rows() } else { replay::MAX_ROWS };
        // A linear-attention layer's recurrence runs on the host: nothing to record. Nor are the
        // steps of a model whose queries are scaled past a position (Ministral 3): a step
        // recorded before it would replay without the scaling after it. Nor are those of a model
        // with local layers (a second cell table, not among a replay's inputs), or with layers
        // that turn nothing (their tables are not among a replay's inputs either).
        // Nor are those of latent attention, whose steps the recording has not been checked on.
        let plain = config.linear.is_none()
            && config.latent.is_none()
            && config.query_scaling.is_none()
            && config.sliding.is_none()
            && config.unrotated.is_none();
        let graphs = StepGraphs::new(graphs && plain, rows);
        Self { config, info, weights, rope, local_rope, device: device.clone(), stream, graphs, vision }
    }

    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The output projection: the embedding itself when tied (stored once).
    fn lm_head(&self) -> Linear {
        Linear { weight: self.weights.lm_head.clone().unwrap_or_else(|| self.weights.embed.clone()), bias: None }
    }

    /// [n_tokens, hidden] f32 input rows.
    fn embed(&self, input: &BatchInput) -> Tensor<2> {
        match input {
            BatchInput::Tokens(ids) => self.weights.embed.rows(ids, &self.device),
            BatchInput::Embeddings { values, dim } => {
                crate::transfers::upload(TensorData::new(values.clone(), [values.len() / dim, *dim]), &self.device)
            }
        }
    }
}

impl LanguageModel for Decoder {
    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn kv_layout(&self) -> KvLayout {
        let c = &self.config;
        KvLayout {
            layers: c.attention_layers(),
            kv_heads: c.num_key_value_heads,
            head_dim: c.head_dim,
            recurrent: c.linear.as_ref().map(|a| {
                let (conv, memory) = a.state_floats();
                RecurrentLayout { layers: c.num_hidden_layers - c.attention_layers(), conv, memory }
            }),
            // Latent attention's one row a token is its key and its value.
            values_are_keys: c.latent.is_some(),
        }
    }

    fn device(&self) -> &Device {
        &self.device
    }

    fn stream(&self) -> DeviceStream {
        self.stream
    }

    /// On the CPU the pool's threads spin for the pass's parallel loops (`kernels::with_awake_pool`).
    /// On a GPU a decode step of a shape seen before is replayed from its recorded graph
    /// (`replay`).
    fn forward(
        &self,
        batch: &ValidBatch<'_>,
        placement: &Placement,
        cache: &mut KvCache,
        abort: &dyn Fn() -> bool,
    ) -> Result<Tensor<2>, DecodeError> {
        // The final norm inside the output projection's kernel where it has one (a GPU's decode
        // step), else apart.
        let norm = self.weights.norm.pre();
        let logits = |x, tables, cells: kernels::CellTable, cache: &mut KvCache| {
            let local = self.local_tables(batch, &cells, cache);
            let logits =
                self.lm_head().forward_with(self.trunk(batch, x, tables, cells, local, cache, abort)?, norm, None);
            // Granite's scaled logits; Gemma 2's soft-capped ones.
            let logits = match self.config.logit_scale {
                Some(s) => logits.div_scalar(s),
                None => logits,
            };
            Ok(match self.config.logit_softcap {
                Some(cap) => logits.div_scalar(cap).tanh().mul_scalar(cap),
                None => logits,
            })
        };
        let pass = || {
            let (tables, cells) = self.tables(batch, placement, cache);
            let plan = match batch.input {
                // Rows given as embeddings or turned by M-RoPE's streams are not among a replay's inputs.
                BatchInput::Tokens(ids) if batch.embedded.is_empty() && batch.rope.is_none() => {
                    self.graphs.begin(ids, batch, &cells, &tables, cache, &self.device)
                }
                _ => Plan::Plain,
            };
            match plan {
                Plan::Plain => logits(self.embed(batch.input), tables, cells, cache),
                Plan::Replayed(logits) => Ok(*logits),
                Plan::Record(inputs, key) => self.graphs.record(key, inputs, |inputs| {
                    let (tables, cells) = self.tables(batch, placement, cache);
                    let tables = tables.preset(inputs.rope.clone());
                    let cells = cells.preset(inputs.slots.clone(), inputs.table.clone());
                    let x = self.weights.embed.rows_at(&inputs.ids).unwrap_or_else(|| self.embed(batch.input));
                    logits(x, tables, cells, cache)
                }),
            }
        };
        self.stream.enter(|| kernels::with_awake_pool(&self.device, pass))
    }

    fn hidden(
        &self,
        batch: &ValidBatch<'_>,
        placement: &Placement,
        cache: &mut KvCache,
        abort: &dyn Fn() -> bool,
    ) -> Result<Tensor<2>, DecodeError> {
        let pass = || {
            let (tables, cells) = self.tables(batch, placement, cache);
            let local = self.local_tables(batch, &cells, cache);
            let x = self.trunk(batch, self.embed(batch.input), tables, cells, local, cache, abort)?;
            Ok(self.weights.norm.forward(x))
        };
        self.stream.enter(|| kernels::with_awake_pool(&self.device, pass))
    }

    fn encode_image(&self, image: &Image) -> Result<Features, DecodeError> {
        let vision = self.vision.as_ref().ok_or_else(|| {
            DecodeError::InvalidInput(format!("this model ({}) takes text only, not images", self.config.arch.name))
        })?;
        self.stream.enter(|| kernels::with_awake_pool(&self.device, || vision.encode(image)))
    }

    fn shift_keys(&self, cache: &mut KvCache, shifts: &[Pos]) {
        self.stream.enter(|| {
            let c = &self.config;
            let tables = self.rope.shift_tables(shifts, &self.device);
            let local = self.local_rope.as_ref().map(|r| r.shift_tables(shifts, &self.device));
            // The layers with keys, by their index among all layers.
            let attending = (0..c.num_hidden_layers).filter(|&i| !c.is_linear_layer(i));
            for (l, i) in attending.enumerate() {
                // A layer without the rotary embedding keeps its keys as they are.
                if c.is_unrotated_layer(i) {
                    continue;
                }
                let tables = match &local {
                    Some(local) if c.is_local_layer(i) => local,
                    _ => &tables,
                };
                let (keys, _) = cache.read(l, shifts.len()); // [kv_heads, extent, hd]
                let keys = keys.swap_dims(0, 1);
                let rotated = match &c.latent {
                    // Latent attention's rows turn their rotated part only, the latent after it
                    // as it is (read as the values too, past that part).
                    Some(a) => {
                        let turned = Rope::apply(keys.clone().narrow(2, 0, a.rope_dim), tables);
                        Tensor::cat(vec![turned, keys.narrow(2, a.rope_dim, a.kv_rank)], 2)
                    }
                    None => Rope::apply(keys, tables),
                }
                .swap_dims(0, 1);
                cache.set_keys(l, rotated);
            }
        })
    }

    fn replace_weight(&mut self, name: &str, data: TensorData) -> Result<(), LoadError> {
        // The graphs read the weights' buffers, which a replacement may move.
        self.graphs.clear();
        let stream = self.stream;
        stream.enter(|| self.replace_here(name, data))
    }
}

impl Decoder {
    /// [`LanguageModel::replace_weight`], on the model's stream.
    fn replace_here(&mut self, name: &str, data: TensorData) -> Result<(), LoadError> {
        let c = &self.config;
        let (slot, layer) = weights::slot_of(c, name).ok_or_else(|| LoadError::UnknownSlot(name.into()))?;
        if !matches!(data.dtype(), DType::F32 | DType::F16 | DType::BF16) {
            let dtype = format!("{:?}", data.dtype());
            return Err(LoadError::Dtype { tensor: name.into(), slot: slot.label(), layer, dtype });
        }
        let (Some(l), true) = (layer, weights::MOE_SLOTS.iter().any(|(s, _, _)| *s == slot)) else {
            weights::check_one(c, slot, layer, data.shape().as_slice())?;
            // Rows the loaded model keeps in another order (Qwen3.5's q and k), as loading put them.
            let hf = weights::name_of(slot, layer, Naming::Hf);
            let data = match weights::row_orders(c, Naming::Hf).into_iter().find(|(n, _)| *n == hf) {
                Some((_, order)) => weights::reorder_rows(name, data, &order)?,
                None => data,
            };
            self.weights.replace(c, slot, layer, data, &self.device);
            return Ok(());
        };
        // A mixture of experts' slot: one expert's matrix (Hugging Face names it), all of them as
        // one 3-D tensor (a GGUF file's name), or the router or shared expert.
        let experts = c.moe.as_ref().map_or(0, |m| m.experts);
        let shape = slot.shape(c);
        let found = data.shape().as_slice().to_vec();
        let values = |data: TensorData| {
            let reason = |e| format!("reading values: {e:?}");
            data.convert::<f32>()
                .try_into_vec::<f32>()
                .map_err(|e| LoadError::Tensor { name: name.into(), reason: reason(e) })
        };
        if weights::is_expert(slot) && found == slot.shape_in(c, Naming::Gguf) {
            let values = values(data)?;
            let per = shape.iter().product::<usize>();
            for (e, part) in values.chunks_exact(per).enumerate() {
                let part = TensorData::new(part.to_vec(), shape.clone());
                self.weights.replace_moe(c, slot, l, e, part, &self.device);
            }
            self.weights.restack_moe(l);
            return Ok(());
        }
        // A GGUF file may store the shared expert's gate as a vector.
        let data = match (slot, found.as_slice()) {
            (weights::Slot::SharedRouter, [h]) if *h == c.hidden_size => TensorData::new(values(data)?, shape.clone()),
            _ => data,
        };
        weights::check_one(c, slot, layer, data.shape().as_slice())?;
        let expert = (0..experts).find(|&e| weights::expert_name(slot, l, e) == name).unwrap_or(0);
        self.weights.replace_moe(c, slot, l, expert, data, &self.device);
        // Written into the layer's stacks on a GPU where they take the rows; otherwise stacked
        // again where the experts still share one storage (a copy of the layer's experts).
        self.weights.restack_moe(l);
        Ok(())
    }

    /// A pass's RoPE tables and cell table (where each row's key and value go, and the cells
    /// each row sees), uploaded at their first use unless preset.
    fn tables(
        &self,
        batch: &ValidBatch<'_>,
        placement: &Placement,
        cache: &KvCache,
    ) -> (RopeTables, kernels::CellTable) {
        let tables = match batch.rope {
            Some(rope) => self.rope.tables_streams(rope, &self.device),
            None => self.rope.tables_in(&batch.pos, &batch.seqs, &self.device),
        };
        let extent = cache.cells().extent();
        let visible = cache.visible(&batch.seqs, batch.seen(), extent);
        (tables, kernels::CellTable::new(placement.clone(), visible, &self.device))
    }

    /// The local layers' RoPE tables and cell table, where the model has such layers: the pass's
    /// `cells` with each row seeing only those of its last `sliding_window` positions; their own
    /// rotation where they have one (Gemma 3's), else none (gpt-oss's rotate as the global ones,
    /// by the pass's tables).
    fn local_tables(
        &self,
        batch: &ValidBatch<'_>,
        cells: &kernels::CellTable,
        cache: &KvCache,
    ) -> Option<(Option<RopeTables>, kernels::CellTable)> {
        let sliding = self.config.sliding.as_ref()?;
        let tables = self.local_rope.as_ref().map(|rope| rope.tables_in(&batch.pos, &batch.seqs, &self.device));
        let visible = cache.within_window(&cells.visible, &batch.pos, sliding.window);
        Some((tables, kernels::CellTable::new(cells.placement.clone(), visible, &self.device)))
    }

    /// The pass up to the final norm from its input rows `x` ([n, hidden]): the rows of
    /// `batch.out_rows`, [n_outputs, hidden] (`forward` and `hidden` norm them and keep the pool
    /// awake around it). `local`: the local layers' tables (`local_tables`).
    #[allow(clippy::too_many_arguments)]
    fn trunk(
        &self,
        batch: &ValidBatch<'_>,
        mut x: Tensor<2>,
        tables: RopeTables,
        cells: kernels::CellTable,
        local: Option<(Option<RopeTables>, kernels::CellTable)>,
        cache: &mut KvCache,
        abort: &dyn Fn() -> bool,
    ) -> Result<Tensor<2>, DecodeError> {
        let n = batch.len();
        let c = &self.config;
        let (heads, kv_heads, hd) = (c.num_attention_heads, c.num_key_value_heads, c.head_dim);
        let extent = cache.cells().extent();
        // Gemma's token embeddings are scaled (given rows are taken as they are), Granite's input
        // whatever it is.
        let given = matches!(batch.input, BatchInput::Embeddings { .. });
        if let Some(scale) = c.embedding_scale.filter(|_| !given || c.scale_given_embeddings) {
            x = x.mul_scalar(scale);
        }
        // Rows given in place of their tokens' (an image's features), scaled only where given
        // rows are.
        for e in batch.embedded {
            let rows = e.values.len() / c.hidden_size;
            let values =
                crate::transfers::upload(TensorData::new(e.values.clone(), [rows, c.hidden_size]), &self.device);
            let values = match c.embedding_scale.filter(|_| c.scale_given_embeddings) {
                Some(scale) => values.mul_scalar(scale),
                None => values,
            };
            x = x.slice_assign([e.row..e.row + rows, 0..c.hidden_size], values);
        }
        // Scores scaled by `query_pre_attn_scalar`^−½ where the kernels scale by head_dim^−½: the
        // queries times the ratio's root.
        let q_factor = c.attention_scalar.map(|s| (hd as f64 / s).sqrt()).filter(|&f| f != 1.0);
        // [n, extent], global layers' then local ones', built only if the attention kernel cannot
        // run and some row does not see every cell below the extent (a lone sequence's decode
        // step sees them all).
        let mut masks: [Option<Option<Tensor<2>>>; 2] = [None, None];
        let [q_rows, k_rows, _] = weights::qkv_rows(&self.config);
        // The output gate's rows, before q's (Qwen3.5).
        let gate_rows = weights::gate_rows(&self.config);
        // A model with linear attention: the batch's rows by sequence, checked against their
        // states, which each linear layer moves on.
        let groups = match cache.recurrent() {
            Some(r) => Some(r.rows(&batch.seqs, &batch.pos)?),
            None => None,
        };
        // Ministral 3's queries past the original context, scaled by their position ([n, 1, 1]);
        // nothing to do in a pass that stays below it.
        let query_scales = self.config.query_scaling.filter(|s| batch.pos.iter().any(|&p| p >= s.original as Pos));
        let query_scales = query_scales.map(|s| -> Tensor<3> {
            let factors: Vec<f32> = batch.pos.iter().map(|&p| s.at(p)).collect();
            crate::transfers::upload(TensorData::new(factors, [n, 1, 1]), &self.device)
        });
        // The tables of the layers without the rotary embedding (SmolLM3's NoPE layers).
        let unturned = c.unrotated.is_some().then(|| self.rope.unturned_tables(n, &self.device));
        // Layers with keys and values are numbered apart from the linear ones in the cache.
        let (mut kv_layer, mut linear_layer) = (0, 0);
        for (i, w) in self.weights.layers.iter().enumerate() {
            // A stop part way would leave the linear layers' states between two tokens.
            if abort() && (groups.is_none() || kv_layer + linear_layer == 0) {
                return Err(DecodeError::Aborted);
            }
            if let (Some(delta), Some(groups)) = (&w.delta, &groups) {
                let proj = w.qkv.forward_with(x.clone(), w.attn_pre(), None);
                let states = cache.recurrent().map(|r| r.layer(linear_layer, groups)).unwrap_or_default();
                let mixed = delta.forward(proj, states)?;
                x = w.o.forward_with(mixed, Pre::Plain, Some(x));
                x = w.ffn.forward_residual(w.mlp_pre(), x);
                linear_layer += 1;
                continue;
            }
            let l = kv_layer;
            kv_layer += 1;
            // A local layer's own rotation and window.
            let (tables, cells, mask) = match &local {
                Some((local, cells)) if c.is_local_layer(i) => {
                    (local.as_ref().unwrap_or(&tables), cells, &mut masks[1])
                }
                _ => (&tables, &cells, &mut masks[0]),
            };
            let tables = match &unturned {
                Some(unturned) if c.is_unrotated_layer(i) => unturned,
                _ => tables,
            };
            let mut gate = None;
            // On a GPU: a decode step's projection, RoPE and KV write in one kernel (without
            // per-head norms, which need a head's whole projection); else the projection, then the
            // norms, RoPE and the KV write in one kernel; else apart.
            let on_gpu = cells.on_gpu() && gate_rows == 0;
            // Norms over all heads at once (OLMo 2's) are applied to the projection apart.
            let whole = w.qk_norm.as_ref().filter(|_| c.whole_qk_norms);
            let per_head = w.qk_norm.as_ref().filter(|_| !c.whole_qk_norms);
            let norms = per_head.map(RmsNorm::qk);
            let projected = match w.qkv.weight.matrix().gpu() {
                _ if w.latent.is_some() => None,
                Some(m) if on_gpu && w.qk_norm.is_none() => {
                    let (pre, bias) = (w.attn_pre(), w.qkv.bias.as_ref());
                    cache.project_rotated(l, cells, &x, pre, m, bias, heads, tables.stacked())
                }
                _ => None,
            };
            let q = match (projected, &w.latent) {
                (Some(q), _) => q,
                // Latent attention: one row a token cached, its key and its value (the
                // attention's keys and values are the same rows).
                (None, Some(latent)) => {
                    let proj = w.qkv.forward_with(x.clone(), w.attn_pre(), None);
                    let (q, row) = latent.project(proj, tables);
                    let row = row.swap_dims(0, 1); // [1, n, hd]
                    cache.write(l, cells, row.clone(), row); // the values are the keys' rows
                    q.reshape([n, heads * hd])
                }
                (None, None) => {
                    let qkv = w.qkv.forward_with(x.clone(), w.attn_pre(), None); // [n, (heads + 2 · kv_heads) · hd]
                    let qkv = match gate_rows {
                        0 => qkv,
                        g => {
                            let width = qkv.dims()[1];
                            gate = Some(qkv.clone().narrow(1, 0, g));
                            qkv.narrow(1, g, width - g)
                        }
                    };
                    let qkv = match whole {
                        Some([q_norm, k_norm]) => {
                            let (q, k) = (heads * hd, kv_heads * hd);
                            RmsNorm::forward_parts(qkv, [(q_norm, 0..q), (k_norm, q..q + k)])
                        }
                        None => qkv,
                    };
                    let rotated = on_gpu.then(|| cache.write_rotated(l, cells, &qkv, heads, tables.stacked(), norms));
                    rotated.flatten().unwrap_or_else(|| {
                        let [q, k, v] = Rope::apply_qk(qkv, q_rows.clone(), k_rows.clone(), tables, per_head);
                        let k = k.reshape([n, kv_heads, hd]);
                        let v = v.reshape([n, kv_heads, hd]);
                        cache.write(l, cells, k.swap_dims(0, 1), v.swap_dims(0, 1)); // [kv_heads, n, hd]
                        q
                    })
                }
            };
            let q = q.reshape([n, heads, hd]);
            let q = match &query_scales {
                Some(scales) => q * scales.clone(),
                None => q,
            };
            let q = match q_factor {
                Some(f) => q.mul_scalar(f),
                None => q,
            };
            // Soft-capped scores (Gemma 2's) are capped by the kernels too, and the sinks (gpt-oss's)
            // join their heads' softmax.
            let sinks = w.sinks.as_ref();
            let a = match cache.attention(l, &q, cells, c.attention_softcap, sinks) {
                Some(a) => a,
                None => {
                    let visible = &cells.visible;
                    let partial = || visible.iter().any(|cells| cells.len() < extent);
                    let mask = mask.get_or_insert_with(|| partial().then(|| cache.mask(visible, extent))).clone();
                    let (keys, values) = cache.read(l, extent); // [kv_heads, extent, hd]
                    attention(q, keys, values, mask, c.attention_softcap, sinks)
                }
            };
            let a = match (gate.take(), &w.latent) {
                (Some(g), _) => a * burn::tensor::activation::sigmoid(g),
                (None, Some(latent)) => latent.values(a),
                (None, None) => a,
            };
            // Gemma's outputs are normed before their residual sums; others' sums are fused into
            // the products.
            // Granite's are scaled before their sums.
            x = match (&w.post_norms, c.residual_scale) {
                (Some([after_attention, _]), _) => x + after_attention.forward(w.o.forward_with(a, Pre::Plain, None)),
                (None, Some(m)) => x + w.o.forward_with(a, Pre::Plain, None).mul_scalar(m),
                (None, None) => w.o.forward_with(a, Pre::Plain, Some(x)),
            };
            x = match (&w.post_norms, c.residual_scale) {
                (Some([_, after_ffn]), _) => x.clone() + after_ffn.forward(w.ffn.forward_with(w.mlp_pre(), x, None)),
                (None, Some(m)) => x.clone() + w.ffn.forward_with(w.mlp_pre(), x, None).mul_scalar(m),
                (None, None) => w.ffn.forward_residual(w.mlp_pre(), x),
            };
            // Qwen3-VL's deepstack: an image's rows get its tower's earlier blocks' features after
            // the first layers.
            for e in batch.embedded {
                let Some(features) = e.deepstack.get(i) else { continue };
                let rows = features.len() / c.hidden_size;
                let features =
                    crate::transfers::upload(TensorData::new(features.clone(), [rows, c.hidden_size]), &self.device);
                let at = [e.row..e.row + rows, 0..c.hidden_size];
                x = x.clone().slice_assign(at.clone(), x.slice(at) + features);
            }
        }
        if let (Some(groups), Some(r)) = (&groups, cache.recurrent()) {
            r.advance(groups);
        }
        if batch.out_rows.len() < n {
            let rows: Vec<i64> = batch.out_rows.iter().map(|&r| r as i64).collect();
            let len = rows.len();
            x = x.select(0, Tensor::<1, Int>::from_data(TensorData::new(rows, [len]), &self.device));
        }
        Ok(x) // [n_outputs, hidden], before the final norm
    }
}
