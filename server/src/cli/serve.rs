//! `llaisys serve`: the OpenAI-compatible server. Settings come from `config/default.toml`,
//! `--config FILE`, `LLAISYS_*` variables and these flags, in increasing precedence.

use std::path::PathBuf;

use llaisys_model::adapter::Lora;
use llaisys_server::Config;

use super::CliError;

#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// `server.host`.
    #[arg(long)]
    host: Option<String>,
    /// `server.port` (0: any free port).
    #[arg(long)]
    port: Option<u16>,
    /// An accepted bearer key (repeatable; `server.api_keys`).
    #[arg(long = "api-key")]
    api_keys: Vec<String>,
    /// Be a cluster's front: worker nodes join at this HOST:PORT (`cluster.listen`); the cookie
    /// comes from `LLAISYS_CLUSTER_COOKIE` or --cookie-file.
    #[arg(long)]
    cluster_listen: Option<String>,
}

/// What `serve` and `worker` share: the model, the config and the node's identity.
#[derive(Debug, clap::Args)]
pub struct ModelArgs {
    /// The model: a GGUF file, a Hugging Face directory, or a model on the Hugging Face hub by
    /// name, `org/repo[:QUANT]` or `hf://org/repo/file.gguf` (sets `model.path`). Repeated: the
    /// others are served beside the first (`model.also`).
    #[arg(long)]
    model: Vec<PathBuf>,
    /// With a model by name: use only the hub cache (`model.offline`).
    #[arg(long)]
    offline: bool,
    /// A TOML file overriding the defaults (only the keys it sets).
    #[arg(long)]
    config: Option<PathBuf>,
    /// The name clients use for the model (`model.name`); repeated, for each `--model` in turn.
    #[arg(long)]
    model_name: Vec<String>,
    /// Weight dtype in memory (`model.dtype`): auto (the checkpoint's own), f32, f16, bf16, q8_0,
    /// q4_0, q4_1, q5_0, q5_1, q2_k, q3_k, q4_k, q5_k, q6_k, iq4_nl, mxfp4, or llama.cpp's mixes q3_k_m,
    /// q4_k_m, q5_k_m (quantized at load where stored otherwise).
    #[arg(long)]
    dtype: Option<String>,
    /// An importance matrix (`model.imatrix`; llama.cpp's `llama-imatrix` file, GGUF or .dat)
    /// weighting the errors of the matrices `--dtype` quantizes at load.
    #[arg(long)]
    imatrix: Option<PathBuf>,
    /// A GGUF model's vision tower (`model.mmproj`): llama.cpp's projector file
    /// (`mmproj-*.gguf`), for a model that sees images. A directory holding the model and one
    /// projector file needs none.
    #[arg(long)]
    mmproj: Option<PathBuf>,
    /// The (first) model's LoRA adapters (`model.lora`).
    #[command(flatten)]
    lora: LoraArgs,
    /// Devices (`model.device`), one replica of the model each: cpu, wgpu, vulkan, gl, cuda (a
    /// GPU index as in vulkan:1), as a comma-separated list (`cpu,vulkan:0`; a device twice is
    /// two replicas).
    #[arg(long)]
    device: Option<String>,
    /// The KV cache's element type (`engine.kv_dtype`): auto (the device's default: f16, or f32
    /// on a GPU without f16 buffers), f32, f16, bf16, q8_0 (the CPU only).
    #[arg(long)]
    kv_dtype: Option<String>,
    /// In a cluster: a file whose first line is the shared cookie (`cluster.cookie_file`; else
    /// `LLAISYS_CLUSTER_COOKIE`).
    #[arg(long)]
    cookie_file: Option<PathBuf>,
    /// In a cluster: this node's name, unique among the nodes (`cluster.name`).
    #[arg(long)]
    name: Option<String>,
    /// Any key: `--set engine.kv_capacity=16384` (repeatable).
    #[arg(long = "set", value_name = "SECTION.KEY=VALUE")]
    settings: Vec<String>,
}

/// LoRA adapters merged into a model's weights as they load.
#[derive(Debug, Default, clap::Args)]
pub struct LoraArgs {
    /// A LoRA adapter merged into the model's weights as they load: a PEFT directory for a
    /// Hugging Face model, llama.cpp's GGUF adapter for a GGUF file (a path, or a name on the
    /// Hugging Face hub as `--model` takes one). Repeatable.
    #[arg(long, value_name = "PATH")]
    lora: Vec<PathBuf>,
    /// A LoRA adapter and how much of its change to merge (1: as trained), as llama.cpp's
    /// `--lora-scaled`. Repeatable.
    #[arg(long, num_args = 2, value_names = ["PATH", "SCALE"])]
    lora_scaled: Vec<String>,
}

impl LoraArgs {
    /// The adapters, `--lora`'s then `--lora-scaled`'s.
    pub fn adapters(&self) -> Result<Vec<Lora>, CliError> {
        let mut adapters: Vec<Lora> = self.lora.iter().map(Lora::new).collect();
        for pair in self.lora_scaled.chunks(2) {
            let [path, scale] = pair else {
                return Err(CliError::usage("--lora-scaled", "expected PATH SCALE"));
            };
            let scale =
                scale.parse().ok().filter(|s: &f32| s.is_finite()).ok_or_else(|| {
                    CliError::usage("--lora-scaled", format!("{scale}: expected a number (PATH SCALE)"))
                })?;
            adapters.push(Lora { path: path.into(), scale });
        }
        Ok(adapters)
    }

    /// The adapters with those given by name on the hub resolved to their local copies.
    pub async fn local(&self) -> Result<Vec<Lora>, CliError> {
        let mut adapters = self.adapters()?;
        for lora in &mut adapters {
            lora.path = super::local_model(&lora.path).await?;
        }
        Ok(adapters)
    }
}

/// A TOML string.
pub fn quoted(s: &str) -> String {
    format!("{s:?}")
}

impl ModelArgs {
    /// The config: defaults, `--config`, `LLAISYS_*`, these flags and `extra`, in increasing
    /// precedence.
    pub fn config(&self, mut extra: Vec<(String, String)>) -> Result<Config, CliError> {
        let mut settings: Vec<(String, String)> = Vec::new();
        if self.model_name.len() > self.model.len().max(1) {
            return Err(CliError::usage("--model-name", "more names than models"));
        }
        if let Some(m) = self.model.first() {
            settings.push(("model.path".into(), quoted(&m.display().to_string())));
        }
        if let Some(n) = self.model_name.first() {
            settings.push(("model.name".into(), quoted(n)));
        }
        if self.model.len() > 1 {
            let also: Vec<String> = (self.model.iter().enumerate().skip(1))
                .map(|(i, m)| {
                    let name = self.model_name.get(i).map_or(String::new(), |n| n.clone());
                    format!("{{ path = {}, name = {} }}", quoted(&m.display().to_string()), quoted(&name))
                })
                .collect();
            settings.push(("model.also".into(), format!("[{}]", also.join(", "))));
        }
        if self.offline {
            settings.push(("model.offline".into(), "true".into()));
        }
        if let Some(d) = &self.dtype {
            settings.push(("model.dtype".into(), quoted(d)));
        }
        if let Some(m) = &self.imatrix {
            settings.push(("model.imatrix".into(), quoted(&m.display().to_string())));
        }
        if let Some(m) = &self.mmproj {
            settings.push(("model.mmproj".into(), quoted(&m.display().to_string())));
        }
        let adapters: Vec<String> = (self.lora.adapters()?.iter())
            .map(|l| format!("{{ path = {}, scale = {:?} }}", quoted(&l.path.display().to_string()), l.scale))
            .collect();
        if !adapters.is_empty() {
            settings.push(("model.lora".into(), format!("[{}]", adapters.join(", "))));
        }
        if let Some(d) = &self.device {
            settings.push(("model.device".into(), quoted(d)));
        }
        if let Some(d) = &self.kv_dtype {
            settings.push(("engine.kv_dtype".into(), quoted(d)));
        }
        if let Some(f) = &self.cookie_file {
            settings.push(("cluster.cookie_file".into(), quoted(&f.display().to_string())));
        }
        if let Some(n) = &self.name {
            settings.push(("cluster.name".into(), quoted(n)));
        }
        settings.append(&mut extra);
        for s in &self.settings {
            let (k, v) = s
                .split_once('=')
                .ok_or_else(|| CliError::usage("--set", format!("{s}: expected SECTION.KEY=VALUE")))?;
            settings.push((k.trim().into(), v.trim().into()));
        }
        Ok(Config::load(self.config.as_deref(), std::env::vars(), &settings)?)
    }
}

pub fn run(args: ServeArgs) -> Result<(), CliError> {
    let mut settings: Vec<(String, String)> = Vec::new();
    if let Some(h) = &args.host {
        settings.push(("server.host".into(), quoted(h)));
    }
    if let Some(p) = args.port {
        settings.push(("server.port".into(), p.to_string()));
    }
    if !args.api_keys.is_empty() {
        let keys: Vec<String> = args.api_keys.iter().map(|k| quoted(k)).collect();
        settings.push(("server.api_keys".into(), format!("[{}]", keys.join(", "))));
    }
    if let Some(l) = &args.cluster_listen {
        settings.push(("cluster.listen".into(), quoted(l)));
    }
    let config = args.model.config(settings)?;
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async {
        let server = llaisys_server::start(&config).await?;
        let names: Vec<String> = server.state().models().map(|m| m.name).collect();
        eprintln!("llaisys: serving '{}' on http://{}", names.join("', '"), server.addr);
        wait_for_signal().await;
        eprintln!("llaisys: shutting down (draining in-flight requests)");
        server.shutdown().await;
        Ok(())
    })
}

/// SIGTERM or Ctrl-C.
pub async fn wait_for_signal() {
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
