//! From a `Config` to a running `Server`: build the engine (`Engine::builder()`: the model, its
//! tokenizer, chat template and generation defaults, the request limits), then bind.

use std::net::SocketAddr;
use std::time::Duration;

use llaisys_actors::cluster::{ClusterError, start_front};
use llaisys_actors::{BuildError, Engine, EngineBuilder};

use crate::config::Config;
use crate::http::{AppState, HttpOptions, ModelEntry, Server};

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Build(#[from] BuildError),
    #[error("config `server.host`/`server.port`: {0}")]
    Address(String),
    #[error("listening on {addr}: {source}")]
    Bind { addr: SocketAddr, source: std::io::Error },
    #[error(transparent)]
    Cluster(#[from] ClusterError),
}

/// Loads the configured model and serves it: alone, or as a cluster's front when
/// `cluster.listen` is set (its requests then run on the nodes that join, and on its own model
/// when `cluster.serve_local`; a router-only front reads no weights).
pub async fn start(config: &Config) -> Result<Server, ServeError> {
    if config.cluster.listen.is_empty() {
        let entry = load_entry(builder(config)?, config.model_name()).await?;
        return start_models(vec![entry], config).await;
    }
    let listen = config.cluster_listen().map_err(ServeError::Address)?;
    let (cookie, tls) = (config.cluster_cookie()?, config.cluster_server_tls()?);
    let (text, local) = match config.cluster.serve_local {
        true => {
            let entry = load_entry(builder(config)?, config.model_name()).await?;
            (entry.engine.frontend().clone(), Some(entry.engine))
        }
        false => (std::sync::Arc::new(builder(config)?.build_frontend()?), None),
    };
    let cluster = config.cluster_config();
    let name = cluster.name.clone();
    let engine = start_front(text, local, listen, cookie, tls, cluster).await?;
    tracing::info!(%listen, node = name, "cluster front: worker nodes join at this address");
    // The router queues and refuses (429) by the nodes' capacities; the HTTP layer's own
    // admission limit would cap the whole cluster at one node's.
    let mut config = config.clone();
    config.limits.max_concurrent_requests = tokio::sync::Semaphore::MAX_PERMITS;
    start_models(vec![ModelEntry::new(config.model_name(), engine)], &config).await
}

/// The engine `config` describes, to build.
pub fn builder(config: &Config) -> Result<EngineBuilder, ServeError> {
    let dtype = config.weight_dtype().map_err(|e| ServeError::Address(e.to_string()))?;
    let devices = config.devices().map_err(|e| ServeError::Address(e.to_string()))?;
    let mut builder = Engine::builder()
        .model(&config.model.path)
        .dtype(dtype)
        .devices(devices)
        .config(config.engine_config())
        .limits(config.request_limits());
    if !config.model.model_type.is_empty() {
        builder = builder.model_type(&config.model.model_type);
    }
    if !config.speculative.draft_model.as_os_str().is_empty() {
        builder = builder.draft_model(&config.speculative.draft_model);
    }
    Ok(builder.placement(config.cluster_config().placement))
}

/// Builds an engine (a loader is kept, so a failed worker can be replaced) and names it.
pub async fn load_entry(builder: EngineBuilder, name: String) -> Result<ModelEntry, ServeError> {
    let engine = builder.build().await?;
    tracing::info!(model = name, context = engine.info().context_length, "model loaded");
    Ok(ModelEntry::new(name, engine))
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
