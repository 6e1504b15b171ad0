//! From a `Config` to a running `Server`: load the model (with a loader, so a failed worker can
//! be replaced), its tokenizer, chat template and generation defaults; start the engine; bind.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use llaisys_actors::{Engine, EngineConfig, EngineError, ModelLoader};
use llaisys_model::tokenizer::TemplateError;
use llaisys_model::{Device, LoadError, LoadOptions, ModelSource, load_model};

use crate::config::Config;
use crate::http::openai::Defaults;
use crate::http::{AppState, HttpOptions, ModelEntry, Server};

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("loading the model {dir}: {source}")]
    Load { dir: String, source: LoadError },
    #[error("the chat template: {0}")]
    Template(#[from] TemplateError),
    #[error("starting the engine: {0}")]
    Engine(#[from] EngineError),
    #[error("config `server.host`/`server.port`: {0}")]
    Address(String),
    #[error("listening on {addr}: {source}")]
    Bind { addr: SocketAddr, source: std::io::Error },
}

/// Loads the configured model and serves it.
pub async fn start(config: &Config) -> Result<Server, ServeError> {
    let opts = LoadOptions { weight_dtype: config.weight_dtype().map_err(|e| ServeError::Address(e.to_string()))? };
    let model_type = Some(config.model.model_type.as_str()).filter(|t| !t.is_empty());
    let entry = load_entry(&config.model.path, model_type, config.model_name(), opts, config.engine_config()).await?;
    start_models(vec![entry], config).await
}

/// Loads the model at `path` (a GGUF file or a Hugging Face directory; with a loader, so a
/// failed worker can be replaced), its tokenizer, chat template and generation defaults, and
/// starts its engine.
pub async fn load_entry(
    path: &Path,
    model_type: Option<&str>,
    name: String,
    opts: LoadOptions,
    engine: EngineConfig,
) -> Result<ModelEntry, ServeError> {
    let load_err = |source| ServeError::Load { dir: path.display().to_string(), source };
    let source = ModelSource::resolve(path).map_err(load_err)?;
    let tokenizer = source.tokenizer().map_err(load_err)?;
    let template = source.chat_template().map_err(load_err)?;
    let defaults = source.generation_config().map(|p| Defaults::from_file(&p)).unwrap_or_default();
    let loader: ModelLoader = {
        let model_type = model_type.map(str::to_string);
        Arc::new(move || load_model(model_type.as_deref(), Some(&source), &opts, &Device::flex()))
    };
    let engine = Engine::start_with_loader(loader, Some(tokenizer.clone()), engine).await?;
    tracing::info!(model = name, path = %path.display(), context = engine.info().context_length, "model loaded");
    Ok(ModelEntry {
        name,
        info: engine.info().clone(),
        engine,
        tokenizer,
        template,
        defaults,
        created: crate::http::unix_now(),
    })
}

/// Serves already loaded models (names must differ) with `config`'s server settings and limits.
pub async fn start_models(models: Vec<ModelEntry>, config: &Config) -> Result<Server, ServeError> {
    let state = AppState::new(models, config.limits.clone(), config.server.api_keys.clone());
    let addr: SocketAddr = format!("{}:{}", config.server.host, config.server.port)
        .parse()
        .map_err(|e| ServeError::Address(format!("{}:{}: {e}", config.server.host, config.server.port)))?;
    let options = HttpOptions {
        max_body_bytes: config.server.max_body_bytes,
        grace: Duration::from_secs(config.server.shutdown_grace_secs),
        webui: config.server.webui,
    };
    Server::start(state, addr, options).await.map_err(|source| ServeError::Bind { addr, source })
}
