//! From a `Config` to a running `Server`: load the model (with a loader, so a failed worker can
//! be replaced), its tokenizer, chat template and generation defaults; start the engine; bind.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use llaisys_actors::{Engine, EngineError, ModelLoader};
use llaisys_model::tokenizer::{ChatTemplate, TemplateError};
use llaisys_model::{Device, LoadError, LoadOptions, Tokenizer, load_model};

use crate::config::Config;
use crate::http::openai::Defaults;
use crate::http::{AppState, ModelEntry, Server};

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("loading the model from {dir}: {source}")]
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
    let dir = config.model.path.clone();
    let load_err = |source| ServeError::Load { dir: dir.display().to_string(), source };
    let opts = LoadOptions { weight_dtype: config.weight_dtype().map_err(|e| ServeError::Address(e.to_string()))? };
    let model_type = Some(config.model.model_type.clone()).filter(|t| !t.is_empty());
    let loader: ModelLoader = {
        let dir = dir.clone();
        Arc::new(move || load_model(model_type.as_deref(), Some(&dir), &opts, &Device::flex()))
    };
    let tokenizer = Tokenizer::from_dir(&dir).map_err(load_err)?;
    let template = ChatTemplate::from_dir(&dir).map_err(load_err)?;
    let engine = Engine::start_with_loader(loader, Some(tokenizer.clone()), config.engine_config()).await?;
    let name = config.model_name();
    tracing::info!(model = name, dir = %dir.display(), context = engine.info().context_length, "model loaded");
    let entry = ModelEntry {
        name,
        info: engine.info().clone(),
        engine,
        tokenizer,
        template,
        defaults: Defaults::from_dir(&dir),
        created: crate::http::unix_now(),
    };
    let state = AppState::new(vec![entry], config.limits.clone(), config.server.api_keys.clone());
    let addr: SocketAddr = format!("{}:{}", config.server.host, config.server.port)
        .parse()
        .map_err(|e| ServeError::Address(format!("{}:{}: {e}", config.server.host, config.server.port)))?;
    let grace = Duration::from_secs(config.server.shutdown_grace_secs);
    Server::start(state, addr, config.server.max_body_bytes, grace)
        .await
        .map_err(|source| ServeError::Bind { addr, source })
}
