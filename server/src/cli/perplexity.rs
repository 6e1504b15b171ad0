//! `llaisys perplexity`: the model's perplexity on a text file, computed as llama.cpp's
//! `llama-perplexity` does, so the two can be compared on the same file: the text's tokens are
//! cut into chunks of `--ctx` tokens, each chunk is evaluated from an empty cache, and the
//! negative log-likelihood of the second half of every chunk (each token given all before it in
//! the chunk) is averaged; the perplexity is its exponential.

use std::path::PathBuf;
use std::time::Instant;

use llaisys_model::{Batch, Context, DecodeError, Device, LoadOptions, ModelSource, WeightDtype, load_model};

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
}

/// Tokens per forward pass.
const BATCH: usize = 512;

pub fn run(args: PerplexityArgs) -> Result<(), CliError> {
    if args.ctx < 4 {
        return Err(CliError::usage("--ctx", "must be at least 4"));
    }
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let model = runtime.block_on(super::local_model(&args.model))?;
    let source = ModelSource::resolve(&model)?;
    let text =
        std::fs::read_to_string(&args.file).map_err(|source| CliError::Read { path: args.file.clone(), source })?;
    let tokens = source.tokenizer()?.encode(&text)?;
    let model = load_model(None, Some(&source), &LoadOptions { weight_dtype: args.dtype }, &Device::flex())?;
    if args.ctx > model.info().context_length {
        let reason = format!("{} is beyond the model's context {}", args.ctx, model.info().context_length);
        return Err(CliError::usage("--ctx", reason));
    }
    let chunks = (tokens.len() / args.ctx).min(args.chunks.unwrap_or(usize::MAX));
    if chunks == 0 {
        let reason = format!("the text has {} tokens, fewer than one chunk of {}", tokens.len(), args.ctx);
        return Err(CliError::usage("--file", reason));
    }
    eprintln!("{} tokens, {chunks} chunks of {}", tokens.len(), args.ctx);
    // The engine runs passes on the compute pool; so does this (the kernels' loops start there).
    let (nll, count) = rayon::scope(|_| score(model, &tokens, args.ctx, chunks))?;
    let ppl = (nll / count as f64).exp();
    println!("perplexity {ppl:.4} over {count} tokens ({chunks} chunks of {})", args.ctx);
    Ok(())
}

/// Σ −log p(token) over the second half of each chunk, and how many tokens that is.
fn score(
    model: Box<dyn llaisys_model::LanguageModel>,
    tokens: &[u32],
    ctx: usize,
    chunks: usize,
) -> Result<(f64, usize), CliError> {
    let mut context = Context::new(model, ctx);
    let first = ctx / 2;
    let (mut nll, mut count) = (0.0f64, 0usize);
    let start = Instant::now();
    for c in 0..chunks {
        let chunk = &tokens[c * ctx..(c + 1) * ctx];
        context.kv_mut().clear();
        for b0 in (0..ctx).step_by(BATCH) {
            let b1 = (b0 + BATCH).min(ctx);
            let mut batch = Batch::new();
            for (i, &t) in chunk[b0..b1].iter().enumerate() {
                let pos = b0 + i;
                // Logits of positions first..ctx-1 predict tokens first + 1..ctx.
                batch.push(t, pos as i64, &[0], pos >= first && pos + 1 < ctx);
            }
            context.decode(&batch).map_err(|source: DecodeError| CliError::Decode { chunk: c, source })?;
            let outputs = context.outputs();
            for (row, &at) in outputs.output_ids().iter().enumerate() {
                let logits = outputs.row(row).expect("a row per flagged token");
                let next = chunk[b0 + at + 1] as usize;
                nll += (llaisys_model::kernels::log_sum_exp(logits) - logits[next]) as f64;
                count += 1;
            }
        }
        eprint!("[{}]{:.4},", c + 1, (nll / count as f64).exp());
    }
    eprintln!(
        "\n{:.1} s, {:.1} tokens/s",
        start.elapsed().as_secs_f64(),
        (chunks * ctx) as f64 / start.elapsed().as_secs_f64()
    );
    Ok((nll, count))
}
