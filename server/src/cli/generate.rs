//! `llaisys generate`: one request through the engine, streamed to stdout.

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use llaisys_actors::request::FinishReason;
use llaisys_actors::{
    ChatMessage, ChatRequest, CompletionRequest, DeviceSpec, Engine, EngineConfig, Event, Options, StreamExt,
    WeightDtype,
};
use llaisys_model::KvDtype;

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
    /// format (q8_0, q4_0, q4_1, q5_0, q5_1, q2_k, q3_k, q4_k, q5_k, q6_k, iq4_nl, mxfp4, or llama.cpp's
    /// mixes q3_k_m, q4_k_m, q5_k_m), quantized at load where stored otherwise.
    #[arg(long, default_value = "auto")]
    dtype: WeightDtype,
    /// An importance matrix (llama.cpp's `llama-imatrix` file, GGUF or .dat) weighting the errors
    /// of the matrices `--dtype` quantizes at load.
    #[arg(long)]
    imatrix: Option<PathBuf>,
    #[command(flatten)]
    lora: super::serve::LoraArgs,
    /// The device: cpu, wgpu, vulkan, gl, cuda (an index as in vulkan:1; GPUs need a build with
    /// the `wgpu` or `cuda` feature).
    #[arg(long, default_value = "cpu")]
    device: DeviceSpec,
    /// The KV cache's element type: auto (the device's default, f16 on the CPU), f32, f16, bf16,
    /// q8_0 (the CPU only).
    #[arg(long, default_value = "auto")]
    kv_dtype: String,
}

pub fn run(args: GenerateArgs) -> Result<(), CliError> {
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(generate(args))
}

async fn generate(args: GenerateArgs) -> Result<(), CliError> {
    // The KV cache holds this one request; a longer prompt is refused with a clear error.
    let kv_dtype = KvDtype::parse_setting(&args.kv_dtype).map_err(|e| CliError::usage("--kv-dtype", e))?;
    let config = EngineConfig { kv_capacity: (args.max_tokens + 4096).max(8192), kv_dtype, ..EngineConfig::default() };
    let model = super::local_model(&args.model).await?;
    let mut builder = Engine::builder().model(&model).dtype(args.dtype).device(args.device).config(config);
    if let Some(m) = &args.imatrix {
        builder = builder.imatrix(m);
    }
    for lora in args.lora.local().await? {
        builder = builder.lora(lora.path, lora.scale);
    }
    if let Some(t) = &args.model_type {
        builder = builder.model_type(t);
    }
    let engine = builder.build().await?;
    let options = Options {
        max_tokens: Some(args.max_tokens),
        temperature: Some(args.temperature),
        top_p: Some(args.top_p),
        top_k: Some(args.top_k.unwrap_or(0)),
        seed: args.seed,
        stop: args.stop.clone(),
        ignore_eos: args.ignore_eos,
        ..Options::default()
    };
    // The same checks and chat rendering a server or library request gets.
    let request = match (&args.prompt, &args.prompt_ids) {
        (Some(text), _) if args.chat => {
            let mut messages: Vec<ChatMessage> = args.system.iter().map(|s| ChatMessage::new("system", s)).collect();
            messages.push(ChatMessage::new("user", text));
            engine.prepare_chat(&ChatRequest::new(messages).options(options))?
        }
        (Some(text), _) => engine.prepare_completion(&CompletionRequest::new(text.as_str()).options(options))?,
        (None, Some(ids)) => engine.prepare_completion(&CompletionRequest::new(ids.clone()).options(options))?,
        (None, None) => return Err(CliError::usage("--prompt", "give --prompt or --prompt-ids")),
    };
    let prompt_len = request.prompts()[0].len();
    let start = Instant::now();
    let mut stream = engine.submit(request).await?;
    let mut out = std::io::stdout().lock();
    let (mut ids, mut first_token) = (Vec::new(), None);
    let finish = loop {
        match stream.next().await.map(|o| o.event) {
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
            None => return Err(CliError::GenerationFailed),
        }
    };
    if args.ids {
        write!(out, "{}", ids.iter().map(u32::to_string).collect::<Vec<_>>().join(","))?;
    }
    writeln!(out)?;
    engine.shutdown().await;
    if finish == FinishReason::Error {
        return Err(CliError::GenerationFailed);
    }
    report(prompt_len, ids.len(), first_token.unwrap_or_default(), start.elapsed(), finish);
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
