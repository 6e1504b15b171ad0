//! `llaisys generate`: one request through the engine, streamed to stdout.

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use llaisys_actors::request::FinishReason;
use llaisys_actors::{Engine, EngineConfig, Event, GenerateParams, GenerateRequest};
use llaisys_model::tokenizer::ChatMessage;
use llaisys_model::{Device, LoadOptions, ModelSource, SamplingParams, WeightDtype, load_model};

use super::CliError;

#[derive(Debug, clap::Args)]
pub struct GenerateArgs {
    /// The model: a GGUF file, or a Hugging Face directory (config.json, safetensors, tokenizer.json).
    #[arg(long)]
    model: PathBuf,
    /// Model type; default: `model_type` of config.json, or the GGUF's architecture.
    #[arg(long)]
    model_type: Option<String>,
    /// Prompt text (encoded with the model's tokenizer, special tokens recognised).
    #[arg(long, required_unless_present = "prompt_ids", conflicts_with = "prompt_ids")]
    prompt: Option<String>,
    /// Treat --prompt as a user message and render the model's chat template around it.
    #[arg(long, requires = "prompt")]
    chat: bool,
    /// System message for --chat (default: the template's own).
    #[arg(long, requires = "chat")]
    system: Option<String>,
    /// Prompt token ids, comma-separated.
    #[arg(long, value_delimiter = ',')]
    prompt_ids: Option<Vec<u32>>,
    /// Most tokens to generate.
    #[arg(long, default_value_t = 64)]
    max_tokens: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Nucleus sampling: keep the most likely tokens up to this probability mass.
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// Keep only the k most likely tokens.
    #[arg(long)]
    top_k: Option<usize>,
    /// Seed for reproducible sampling.
    #[arg(long)]
    seed: Option<u64>,
    /// Stop string (repeatable); the output ends before it.
    #[arg(long)]
    stop: Vec<String>,
    /// Print generated token ids (comma-separated) instead of text.
    #[arg(long)]
    ids: bool,
    /// Keep generating past end-of-sequence tokens.
    #[arg(long)]
    ignore_eos: bool,
    /// Weight dtype in memory: auto (the checkpoint's own), f32, f16, bf16, or a quantized
    /// format (q8_0, q4_0, q4_1, q5_0, q5_1; a GGUF's K-quants as stored).
    #[arg(long, default_value = "auto")]
    dtype: WeightDtype,
}

pub fn run(args: GenerateArgs) -> Result<(), CliError> {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(generate(args))
}

async fn generate(args: GenerateArgs) -> Result<(), CliError> {
    let opts = LoadOptions { weight_dtype: args.dtype };
    let source = ModelSource::resolve(&args.model)?;
    let model = load_model(args.model_type.as_deref(), Some(&source), &opts, &Device::flex())?;
    let tokenizer = if args.prompt.is_some() || !args.ids { Some(source.tokenizer()?) } else { None };
    let prompt = match (&args.prompt, &args.prompt_ids) {
        (Some(text), _) => {
            let text = if args.chat { chat_prompt(&source, args.system.as_deref(), text)? } else { text.clone() };
            tokenizer.as_ref().map(|t| t.encode(&text)).transpose()?.unwrap_or_default()
        }
        (None, Some(ids)) => ids.clone(),
        (None, None) => return Err(CliError::Usage("give --prompt or --prompt-ids".into())),
    };
    let context = model.info().context_length;
    let config =
        EngineConfig { kv_capacity: (prompt.len() + args.max_tokens).clamp(1, context), ..EngineConfig::default() };
    let engine = Engine::start(model, if args.ids { None } else { tokenizer }, config).await?;
    let params = GenerateParams {
        max_tokens: args.max_tokens,
        sampling: SamplingParams {
            temperature: args.temperature,
            top_p: args.top_p,
            top_k: args.top_k,
            seed: args.seed,
            ..SamplingParams::default()
        },
        stop: args.stop.clone(),
        ignore_eos: args.ignore_eos,
        ..GenerateParams::default()
    };
    let start = Instant::now();
    let mut stream = engine.generate(GenerateRequest::new(prompt.clone(), params)).await?;
    let mut out = std::io::stdout().lock();
    let (mut ids, mut first_token) = (Vec::new(), None);
    let finish = loop {
        match stream.next().await {
            Some(Event::Token { token, text, .. }) => {
                first_token.get_or_insert_with(|| start.elapsed());
                ids.push(token);
                if !args.ids {
                    write!(out, "{text}")?;
                    out.flush()?;
                }
            }
            Some(Event::Finished { reason, text, .. }) => {
                if !args.ids {
                    write!(out, "{text}")?;
                }
                break reason;
            }
            None => return Err(CliError::Usage("the engine ended the stream without a finish".into())),
        }
    };
    if args.ids {
        write!(out, "{}", ids.iter().map(u32::to_string).collect::<Vec<_>>().join(","))?;
    }
    writeln!(out)?;
    engine.shutdown().await;
    if finish == FinishReason::Error {
        return Err(CliError::Usage("generation failed (see the log)".into()));
    }
    report(prompt.len(), ids.len(), first_token.unwrap_or_default(), start.elapsed(), finish);
    Ok(())
}

/// Time to first token (the prefill) and decode speed on stderr.
fn report(prompt: usize, n: usize, ttft: std::time::Duration, total: std::time::Duration, finish: FinishReason) {
    let decode = match n {
        0 | 1 => "n/a".to_string(),
        _ => format!("{:.2} tok/s", (n - 1) as f64 / (total - ttft).as_secs_f64().max(1e-9)),
    };
    eprintln!(
        "prompt {prompt} tokens: time to first token {:.1} ms ({:.1} tok/s prefill); generated {n} tokens, decode {decode}; finish {}",
        ttft.as_secs_f64() * 1e3,
        prompt as f64 / ttft.as_secs_f64().max(1e-9),
        finish.as_str(),
    );
}

/// The model's chat template rendered around one user message, ready for the answer.
fn chat_prompt(source: &ModelSource, system: Option<&str>, user: &str) -> Result<String, CliError> {
    let template = source
        .chat_template()?
        .ok_or_else(|| CliError::Usage(format!("{} has no chat template", source.path().display())))?;
    let mut messages: Vec<ChatMessage> = system.map(|s| ChatMessage::new("system", s)).into_iter().collect();
    messages.push(ChatMessage::new("user", user));
    Ok(template.render(&messages, true)?)
}
