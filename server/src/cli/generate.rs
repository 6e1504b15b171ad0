//! `llaisys generate`: greedy decoding with the model core, for checking a model end to end.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use llaisys_model::generate::{Finish, greedy};
use llaisys_model::tokenizer::{ChatMessage, ChatTemplate};
use llaisys_model::{Context, Device, LoadOptions, Tokenizer, WeightDtype, load_model};

use super::CliError;

#[derive(Debug, clap::Args)]
pub struct GenerateArgs {
    /// Model directory (Hugging Face layout: config.json, safetensors, tokenizer.json).
    #[arg(long)]
    model: PathBuf,
    /// Model type; default: `model_type` of config.json.
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
    /// Print generated token ids (comma-separated) instead of text.
    #[arg(long)]
    ids: bool,
    /// Keep generating past end-of-sequence tokens.
    #[arg(long)]
    ignore_eos: bool,
    /// Weight dtype in memory: f32, or f16 (half the memory traffic per token).
    #[arg(long, default_value = "f32")]
    dtype: WeightDtype,
}

pub fn run(args: GenerateArgs) -> Result<(), CliError> {
    let opts = LoadOptions { weight_dtype: args.dtype };
    let model = load_model(args.model_type.as_deref(), Some(&args.model), &opts, &Device::flex())?;
    let tokenizer = if args.prompt.is_some() || !args.ids { Some(Tokenizer::from_dir(&args.model)?) } else { None };
    let prompt = match (&args.prompt, args.prompt_ids) {
        (Some(text), _) => {
            let text = if args.chat { chat_prompt(&args.model, args.system.as_deref(), text)? } else { text.clone() };
            tokenizer.as_ref().map(|t| t.encode(&text)).transpose()?.unwrap_or_default()
        }
        (None, Some(ids)) => ids,
        (None, None) => return Err(CliError::Usage("give --prompt or --prompt-ids".into())),
    };
    if prompt.is_empty() {
        return Err(CliError::Usage("the prompt is empty".into()));
    }
    let context = model.info().context_length;
    if prompt.len() >= context {
        return Err(CliError::Usage(format!("the prompt has {} tokens; the context holds {context}", prompt.len())));
    }
    let stop = if args.ignore_eos { Vec::new() } else { model.info().eos_token_ids.clone() };
    let mut ctx = Context::new(model, (prompt.len() + args.max_tokens).min(context));
    let generation = greedy(&mut ctx, 0, &prompt, args.max_tokens, &stop)?;

    let mut text_tokens = generation.tokens.clone();
    if generation.finish == Finish::Stop {
        text_tokens.pop(); // the stop token is not part of the answer
    }
    let mut out = std::io::stdout().lock();
    match (&tokenizer, args.ids) {
        (Some(t), false) => writeln!(out, "{}", t.decode(&text_tokens, false)?)?,
        _ => writeln!(out, "{}", generation.tokens.iter().map(u32::to_string).collect::<Vec<_>>().join(","))?,
    }
    let n = generation.tokens.len();
    let decode = match n {
        0 | 1 => "n/a".to_string(),
        _ => format!("{:.2} tok/s", (n - 1) as f64 / generation.decode.as_secs_f64().max(1e-9)),
    };
    eprintln!(
        "prompt {} tokens: prefill {:.1} ms ({:.1} tok/s); generated {n} tokens, decode {decode}; finish {:?}",
        prompt.len(),
        ms(generation.prefill),
        prompt.len() as f64 / generation.prefill.as_secs_f64(),
        generation.finish,
    );
    Ok(())
}

/// The model's chat template rendered around one user message, ready for the answer.
fn chat_prompt(dir: &std::path::Path, system: Option<&str>, user: &str) -> Result<String, CliError> {
    let template = ChatTemplate::from_dir(dir)?
        .ok_or_else(|| CliError::Usage(format!("{} has no chat template", dir.display())))?;
    let mut messages: Vec<ChatMessage> = system.map(|s| ChatMessage::new("system", s)).into_iter().collect();
    messages.push(ChatMessage::new("user", user));
    Ok(template.render(&messages, true)?)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
