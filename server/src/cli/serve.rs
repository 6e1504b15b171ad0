//! `llaisys serve`: the OpenAI-compatible server. Settings come from `config/default.toml`,
//! `--config FILE`, `LLAISYS_*` variables and these flags, in increasing precedence.

use std::path::PathBuf;

use llaisys_server::Config;

use super::CliError;

#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// The model: a GGUF file, or a Hugging Face directory (sets `model.path`).
    #[arg(long)]
    model: Option<PathBuf>,
    /// A TOML file overriding the defaults (only the keys it sets).
    #[arg(long)]
    config: Option<PathBuf>,
    /// The name clients use for the model (`model.name`).
    #[arg(long)]
    model_name: Option<String>,
    /// `server.host`.
    #[arg(long)]
    host: Option<String>,
    /// `server.port` (0: any free port).
    #[arg(long)]
    port: Option<u16>,
    /// Weight dtype in memory (`model.dtype`): auto (the checkpoint's own), f32, f16, bf16, q8_0,
    /// q4_0, q4_1, q5_0, q5_1 (quantized at load), q4_k, q5_k, q6_k (a GGUF's, as stored).
    #[arg(long)]
    dtype: Option<String>,
    /// Devices (`model.device`), one replica of the model each: cpu, wgpu, vulkan, gl, cuda (a
    /// GPU index as in vulkan:1), as a comma-separated list (`cpu,vulkan:0`; a device twice is
    /// two replicas).
    #[arg(long)]
    device: Option<String>,
    /// An accepted bearer key (repeatable; `server.api_keys`).
    #[arg(long = "api-key")]
    api_keys: Vec<String>,
    /// Any key: `--set engine.kv_capacity=16384` (repeatable).
    #[arg(long = "set", value_name = "SECTION.KEY=VALUE")]
    settings: Vec<String>,
}

pub fn run(args: ServeArgs) -> Result<(), CliError> {
    let mut settings: Vec<(String, String)> = Vec::new();
    let quoted = |s: &str| format!("{s:?}"); // a TOML string
    if let Some(m) = &args.model {
        settings.push(("model.path".into(), quoted(&m.display().to_string())));
    }
    if let Some(n) = &args.model_name {
        settings.push(("model.name".into(), quoted(n)));
    }
    if let Some(h) = &args.host {
        settings.push(("server.host".into(), quoted(h)));
    }
    if let Some(p) = args.port {
        settings.push(("server.port".into(), p.to_string()));
    }
    if let Some(d) = &args.dtype {
        settings.push(("model.dtype".into(), quoted(d)));
    }
    if let Some(d) = &args.device {
        settings.push(("model.device".into(), quoted(d)));
    }
    if !args.api_keys.is_empty() {
        let keys: Vec<String> = args.api_keys.iter().map(|k| quoted(k)).collect();
        settings.push(("server.api_keys".into(), format!("[{}]", keys.join(", "))));
    }
    for s in &args.settings {
        let (k, v) =
            s.split_once('=').ok_or_else(|| CliError::Usage(format!("--set {s}: expected SECTION.KEY=VALUE")))?;
        settings.push((k.trim().into(), v.trim().into()));
    }
    let config = Config::load(args.config.as_deref(), std::env::vars(), &settings)?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async {
        let server = llaisys_server::start(&config).await?;
        eprintln!("llaisys: serving '{}' on http://{}", config.model_name(), server.addr);
        wait_for_signal().await;
        eprintln!("llaisys: shutting down (draining in-flight requests)");
        server.shutdown().await;
        Ok(())
    })
}

/// SIGTERM or Ctrl-C.
async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
