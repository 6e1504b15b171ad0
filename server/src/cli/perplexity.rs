//! `llaisys perplexity`: the model's perplexity on a text file, computed as llama.cpp's
//! `llama-perplexity` does, so the two can be compared on the same file: the text's tokens are
//! cut into chunks of `--ctx` tokens, each chunk is evaluated from an empty cache, and the
//! negative log-likelihood of the second half of every chunk (each token given all before it in
//! the chunk) is averaged; the perplexity is its exponential.
//!
//! With `--reference`, a second model (the same weights at higher precision, normally BF16 or
//! F32) is run over the same chunks, and at every scored position the KL divergence of the
//! model's next-token distribution from the reference's is measured, with how often both put the
//! same token first: the figures `llama-perplexity --kl-divergence` reports, so a quantized
//! file's drift can be set beside llama.cpp's on the same file. The reference runs in the same
//! process, so no logits are written to disk. `--kv-dtype` sets the model's KV cache type: with
//! the same file as the reference, the KL divergence is what the cache's type costs.

use std::path::PathBuf;
use std::time::Instant;

use llaisys_model::kernels::log_sum_exp;
use llaisys_model::{
    Batch, Context, DecodeError, Device, KvDtype, LanguageModel, LoadOptions, ModelSource, WeightDtype, load_model,
};

use super::CliError;

#[derive(Debug, clap::Args)]
pub struct PerplexityArgs {
    /// The model: a GGUF file, a Hugging Face directory, or `org/repo[:QUANT]` on the hub.
    #[arg(long)]
    model: PathBuf,
    /// The text to score (UTF-8).
    #[arg(long)]
    file: PathBuf,
    /// Tokens per chunk.
    #[arg(long, default_value_t = 512)]
    ctx: usize,
    /// Score at most this many chunks (default: all the text holds).
    #[arg(long)]
    chunks: Option<usize>,
    /// Weight dtype in memory (see `llaisys serve --help`).
    #[arg(long, default_value = "auto")]
    dtype: WeightDtype,
    /// An importance matrix weighting the errors of the matrices `--dtype` quantizes at load (see
    /// `llaisys generate --help`; the model's only, not the reference's).
    #[arg(long)]
    imatrix: Option<PathBuf>,
    /// The model's LoRA adapters (not the reference's): what a fine-tune does to the text's
    /// perplexity, or with `--reference` the merged model's, how far it moved from its base.
    #[command(flatten)]
    lora: super::serve::LoraArgs,
    /// A reference model with the same vocabulary (normally the same weights in BF16 or F32):
    /// also report the KL divergence of the model's next-token distributions from its.
    #[arg(long)]
    reference: Option<PathBuf>,
    /// The reference's weight dtype in memory.
    #[arg(long, default_value = "auto")]
    reference_dtype: WeightDtype,
    /// The model's KV cache element type (see `llaisys serve --help`; the reference's is the
    /// CPU's default, f16): with the same file as the reference, what the cache's type costs.
    #[arg(long, default_value = "auto")]
    kv_dtype: String,
}

/// Tokens per forward pass.
const BATCH: usize = 512;

pub fn run(args: PerplexityArgs) -> Result<(), CliError> {
    if args.ctx < 4 {
        return Err(CliError::usage("--ctx", "must be at least 4"));
    }
    let kv_dtype = KvDtype::parse_setting(&args.kv_dtype).map_err(|reason| CliError::usage("--kv-dtype", reason))?;
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let text =
        std::fs::read_to_string(&args.file).map_err(|source| CliError::Read { path: args.file.clone(), source })?;
    let adapters = runtime.block_on(args.lora.local())?;
    let options =
        LoadOptions { weight_dtype: args.dtype, imatrix: args.imatrix.clone(), adapters, ..Default::default() };
    let (model, tokens) = load(&runtime, &args.model, &options, &text)?;
    if args.ctx > model.info().context_length {
        let reason = format!("{} is beyond the model's context {}", args.ctx, model.info().context_length);
        return Err(CliError::usage("--ctx", reason));
    }
    let reference = match &args.reference {
        None => None,
        Some(path) => {
            let options = LoadOptions { weight_dtype: args.reference_dtype, ..Default::default() };
            let (reference, ref_tokens) = load(&runtime, path, &options, &text)?;
            if ref_tokens != tokens {
                return Err(CliError::usage(
                    "--reference",
                    "its tokenizer splits the text differently from the model's",
                ));
            }
            if reference.info().vocab_size != model.info().vocab_size {
                let (a, b) = (reference.info().vocab_size, model.info().vocab_size);
                return Err(CliError::usage("--reference", format!("its vocabulary has {a} tokens, the model's {b}")));
            }
            if args.ctx > reference.info().context_length {
                let reason =
                    format!("{} is beyond the reference's context {}", args.ctx, reference.info().context_length);
                return Err(CliError::usage("--ctx", reason));
            }
            Some(reference)
        }
    };
    let chunks = (tokens.len() / args.ctx).min(args.chunks.unwrap_or(usize::MAX));
    if chunks == 0 {
        let reason = format!("the text has {} tokens, fewer than one chunk of {}", tokens.len(), args.ctx);
        return Err(CliError::usage("--file", reason));
    }
    eprintln!("{} tokens, {chunks} chunks of {}", tokens.len(), args.ctx);
    // The engine runs passes on the compute pool; so does this (the kernels' loops start there).
    let scores = rayon::scope(|_| score(model, kv_dtype, reference, &tokens, args.ctx, chunks))?;
    println!(
        "perplexity {:.4} over {} tokens ({chunks} chunks of {})",
        (scores.nll / scores.count as f64).exp(),
        scores.count,
        args.ctx
    );
    if scores.reference.is_some() {
        print!("{}", scores.divergence());
    }
    Ok(())
}

/// A model loaded for scoring, and the text as its tokenizer splits it.
fn load(
    runtime: &tokio::runtime::Runtime,
    path: &std::path::Path,
    options: &LoadOptions,
    text: &str,
) -> Result<(Box<dyn LanguageModel>, Vec<u32>), CliError> {
    let model = runtime.block_on(super::local_model(path))?;
    let source = ModelSource::resolve(&model)?;
    let tokens = source.tokenizer()?.encode(text)?;
    let model = load_model(None, Some(&source), options, &Device::flex())?;
    Ok((model, tokens))
}

/// What the scored positions added up to.
#[derive(Default)]
struct Scores {
    /// Σ −log p(token) under the model, and over how many positions.
    nll: f64,
    count: usize,
    /// Σ −log p(token) under the reference, when there is one.
    reference: Option<f64>,
    /// KL(reference ‖ model) at each position.
    kld: Vec<f64>,
    /// Positions where both models' most likely token is the same.
    same_top: usize,
}

impl Scores {
    fn add(&mut self, logits: &[f32], reference: Option<&[f32]>, next: usize) {
        let lse = log_sum_exp(logits);
        self.nll += f64::from(lse - logits[next]);
        self.count += 1;
        let Some(r) = reference else { return };
        let r_lse = log_sum_exp(r);
        *self.reference.get_or_insert(0.0) += f64::from(r_lse - r[next]);
        let kld = kl_divergence(r, r_lse, logits, lse);
        self.kld.push(kld);
        if argmax(r) == argmax(logits) {
            self.same_top += 1;
        }
    }

    /// The report's lines on the reference: llama-perplexity's names for the same figures.
    fn divergence(&self) -> String {
        let n = self.kld.len();
        let mean = self.kld.iter().sum::<f64>() / n as f64;
        let var = self.kld.iter().map(|k| (k - mean).powi(2)).sum::<f64>() / (n.max(2) - 1) as f64;
        let mut sorted = self.kld.clone();
        sorted.sort_by(f64::total_cmp);
        let at = |q: f64| sorted[((n - 1) as f64 * q).round() as usize];
        let ref_ppl = (self.reference.unwrap_or(0.0) / n as f64).exp();
        format!(
            "reference perplexity {ref_ppl:.4}\n\
             KL divergence mean {mean:.6} ± {:.6}, median {:.6}, 99% {:.6}, max {:.6}\n\
             same top token {:.3}% of {n} positions\n",
            (var / n as f64).sqrt(),
            at(0.5),
            at(0.99),
            sorted[n - 1],
            100.0 * self.same_top as f64 / n as f64,
        )
    }
}

/// `Σ p·(log p − log q)` over the vocabulary, with p and q the softmax of `p_logits` and
/// `q_logits` (`p_lse` and `q_lse` their log-sum-exps), accumulated in f64. Never below zero.
fn kl_divergence(p_logits: &[f32], p_lse: f32, q_logits: &[f32], q_lse: f32) -> f64 {
    let sum: f64 = p_logits
        .iter()
        .zip(q_logits)
        .map(|(&p, &q)| {
            let log_p = f64::from(p) - f64::from(p_lse);
            log_p.exp() * (log_p - (f64::from(q) - f64::from(q_lse)))
        })
        .sum();
    sum.max(0.0)
}

/// The first index of the row's largest value.
fn argmax(row: &[f32]) -> usize {
    row.iter().enumerate().fold((0, f32::NEG_INFINITY), |best, (i, &v)| if v > best.1 { (i, v) } else { best }).0
}

/// Runs the chunks through the model (and the reference, when there is one) and scores the
/// second half of each.
fn score(
    model: Box<dyn LanguageModel>,
    kv_dtype: Option<KvDtype>,
    reference: Option<Box<dyn LanguageModel>>,
    tokens: &[u32],
    ctx: usize,
    chunks: usize,
) -> Result<Scores, CliError> {
    let kv_dtype = kv_dtype.unwrap_or_else(|| KvDtype::default_for(model.device()));
    let mut context = Context::with_kv_dtype(model, ctx, kv_dtype);
    let mut reference = reference.map(|r| Context::new(r, ctx));
    let first = ctx / 2;
    let mut scores = Scores::default();
    let start = Instant::now();
    for c in 0..chunks {
        let chunk = &tokens[c * ctx..(c + 1) * ctx];
        context.kv_mut().clear();
        if let Some(r) = reference.as_mut() {
            r.kv_mut().clear();
        }
        for b0 in (0..ctx).step_by(BATCH) {
            let b1 = (b0 + BATCH).min(ctx);
            let mut batch = Batch::new();
            for (i, &t) in chunk[b0..b1].iter().enumerate() {
                let pos = b0 + i;
                // Logits of positions first..ctx-1 predict tokens first + 1..ctx.
                batch.push(t, pos as i64, &[0], pos >= first && pos + 1 < ctx);
            }
            let failed = |source: DecodeError| CliError::Decode { chunk: c, source };
            context.decode(&batch).map_err(failed)?;
            if let Some(r) = reference.as_mut() {
                r.decode(&batch).map_err(failed)?;
            }
            let outputs = context.outputs();
            let ref_outputs = reference.as_ref().map(Context::outputs);
            for (row, &at) in outputs.output_ids().iter().enumerate() {
                let logits = outputs.row(row).expect("a row per flagged token");
                let ref_logits = ref_outputs.map(|o| o.row(row).expect("a row per flagged token"));
                scores.add(logits, ref_logits, chunk[b0 + at + 1] as usize);
            }
        }
        eprint!("[{}]{:.4},", c + 1, (scores.nll / scores.count as f64).exp());
    }
    eprintln!(
        "\n{:.1} s, {:.1} tokens/s",
        start.elapsed().as_secs_f64(),
        (chunks * ctx) as f64 / start.elapsed().as_secs_f64()
    );
    Ok(scores)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kl_divergence_is_zero_for_equal_rows_and_matches_the_formula() {
        let p = [1.0f32, 2.0, 0.5, -3.0];
        assert!(kl_divergence(&p, log_sum_exp(&p), &p, log_sum_exp(&p)).abs() < 1e-12);
        // Shifting every logit leaves the distribution as it is.
        let shifted = p.map(|v| v + 7.0);
        assert!(kl_divergence(&p, log_sum_exp(&p), &shifted, log_sum_exp(&shifted)) < 1e-9);
        let q = [2.0f32, 1.0, 0.5, -3.0];
        let soft = |r: &[f32]| {
            let z: f64 = r.iter().map(|&v| f64::from(v).exp()).sum();
            r.iter().map(|&v| f64::from(v).exp() / z).collect::<Vec<_>>()
        };
        let (sp, sq) = (soft(&p), soft(&q));
        let want: f64 = sp.iter().zip(&sq).map(|(a, b)| a * (a / b).ln()).sum();
        let got = kl_divergence(&p, log_sum_exp(&p), &q, log_sum_exp(&q));
        assert!((got - want).abs() < 1e-6, "{got} against {want}");
    }
}
