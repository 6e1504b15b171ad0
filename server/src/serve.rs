//! From a `Config` to a running `Server`: build the engine (`Engine::builder()`: the model, its
//! tokenizer, chat template and generation defaults, the request limits), then bind.

use std::net::SocketAddr;
use std::time::Duration;

use llaisys_actors::cluster::{ClusterError, start_front};
use llaisys_actors::{BuildError, Engine, EngineBuilder, EngineError, Router};

use crate::config::Config;
use crate::http::{AppState, HttpOptions, ModelEntry, Server};

/// Why a server could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Build(#[from] BuildError),
    /// A setting that does not hold a usable value, named as the configuration spells it.
    #[error("config `{key}`: {reason}")]
    Setting { key: &'static str, reason: String },
    #[error("listening on {addr}: {source}")]
    Bind { addr: SocketAddr, source: std::io::Error },
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    #[error(transparent)]
    Engine(#[from] EngineError),
    #[error(transparent)]
    Hub(#[from] crate::hub::HubError),
}

impl ServeError {
    /// A stable label for logs.
    pub fn error_type(&self) -> &'static str {
        match self {
            Self::Build(_) => "build",
            Self::Setting { .. } => "setting",
            Self::Bind { .. } => "bind",
            Self::Cluster(e) => e.error_type(),
            Self::Engine(e) => e.error_type(),
            Self::Hub(_) => "hub",
        }
    }
}

fn setting(key: &'static str) -> impl Fn(String) -> ServeError {
    move |reason| ServeError::Setting { key, reason }
}

/// Loads the configured model and serves it: alone, or as a cluster's front when
/// `cluster.listen` is set (its requests then run on the nodes that join, and on its own model
/// when `cluster.serve_local`; a router-only front reads no weights).
pub async fn start(config: &Config) -> Result<Server, ServeError> {
    let (models, config) = models(config).await?;
    start_models(models, &config).await
}

/// The configured models, loaded (or, for a cluster's front, the front over the nodes that
/// join), with the configuration to serve them with.
pub async fn models(config: &Config) -> Result<(Vec<ModelEntry>, Config), ServeError> {
    let config = &with_local_model(config).await?;
    if config.cluster.listen.is_empty() {
        let mut entries = vec![load_entry(builder(config)?, config.model_name()).await?];
        for also in &config.model.also {
            let other = with_local_model(&config.for_model(also)).await?;
            entries.push(load_entry(builder(&other)?, other.model_name()).await?);
        }
        return Ok((entries, config.clone()));
    }
    let listen = config.cluster_listen().map_err(setting("cluster.listen"))?;
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
    config.admission.max_concurrent_requests = usize::MAX;
    Ok((vec![ModelEntry { name: config.model_name(), engine }], config))
}

/// `config` with its model as a local path: a model given by name is resolved through the hub
/// (downloaded once into its cache) and served under that name.
/// The hub is the environment's (`HF_ENDPOINT`, `HF_HOME`, `HF_TOKEN`; offline with
/// `model.offline` or `HF_HUB_OFFLINE`).
pub async fn with_local_model(config: &Config) -> Result<Config, ServeError> {
    with_model_from(config, &crate::hub::HubConfig::from_env(config.model.offline)).await
}

/// As [`with_local_model`], through `hub`; the model's LoRA adapters given by name too.
pub async fn with_model_from(config: &Config, hub: &crate::hub::HubConfig) -> Result<Config, ServeError> {
    let mut local = config.clone();
    for lora in &mut local.model.lora {
        let spec = lora.path.to_string_lossy().into_owned();
        if !matches!(crate::hub::ModelSpec::parse(&spec), crate::hub::ModelSpec::Path(_)) {
            lora.path = crate::hub::resolve(&spec, hub).await?.path;
            tracing::info!(adapter = spec, path = %lora.path.display(), "adapter resolved through the hub cache");
        }
    }
    let spec = config.model.path.to_string_lossy().into_owned();
    if matches!(crate::hub::ModelSpec::parse(&spec), crate::hub::ModelSpec::Path(_)) {
        return Ok(local);
    }
    let resolved = crate::hub::resolve(&spec, hub).await?;
    tracing::info!(model = spec, path = %resolved.path.display(), mmproj = ?resolved.mmproj, "model resolved through the hub cache");
    local.model.name = config.model_name();
    local.model.path = resolved.path;
    // The repo's projector, unless one is named.
    if local.model.mmproj.as_os_str().is_empty() {
        local.model.mmproj = resolved.mmproj.unwrap_or_default();
    }
    Ok(local)
}

/// The engine `config` describes, to build.
pub fn builder(config: &Config) -> Result<EngineBuilder, ServeError> {
    let dtype = config.weight_dtype().map_err(setting("model.dtype"))?;
    let devices = config.devices().map_err(setting("model.device"))?;
    let reranker = config.reranker().map_err(setting("model.reranker"))?;
    let mut builder = Engine::builder()
        .model(&config.model.path)
        .dtype(dtype)
        .devices(devices)
        .reranker(reranker)
        .config(config.engine_config())
        .limits(config.request_limits());
    if !config.model.model_type.is_empty() {
        builder = builder.model_type(&config.model.model_type);
    }
    if !config.model.imatrix.as_os_str().is_empty() {
        builder = builder.imatrix(&config.model.imatrix);
    }
    if !config.model.mmproj.as_os_str().is_empty() {
        builder = builder.mmproj(&config.model.mmproj);
    }
    for lora in &config.model.lora {
        builder = builder.lora(&lora.path, lora.scale);
    }
    if !config.draft_model.as_os_str().is_empty() {
        builder = builder.draft_model(&config.draft_model);
    }
    Ok(builder.placement(config.cluster_config().placement))
}

/// Builds an engine (a loader is kept, so a failed worker can be replaced) and names it.
pub async fn load_entry(builder: EngineBuilder, name: String) -> Result<ModelEntry, ServeError> {
    let engine = builder.build().await?;
    tracing::info!(model = name, context = engine.info().context_length, "model loaded");
    Ok(ModelEntry { name, engine })
}

/// Serves already loaded models (names must differ) with `config`'s server settings and limits.
pub async fn start_models(models: Vec<ModelEntry>, config: &Config) -> Result<Server, ServeError> {
    let state = app_state(models, config)?;
    let addr: SocketAddr =
        format!("{}:{}", config.server.host, config.server.port).parse().map_err(|e| ServeError::Setting {
            key: "server.host",
            reason: format!("{}:{}: {e}", config.server.host, config.server.port),
        })?;
    Server::start(state, addr, http_options(config)).await.map_err(|source| ServeError::Bind { addr, source })
}

/// The HTTP service's state over loaded models (names must differ), with `config`'s admission
/// limits and server settings.
pub fn app_state(models: Vec<ModelEntry>, config: &Config) -> Result<AppState, ServeError> {
    let mut engines = Router::new();
    for ModelEntry { name, engine } in models {
        engines.add(name, engine)?;
    }
    Ok(AppState::new(engines, config.admission.clone(), &config.server))
}

/// How `config` has the HTTP service run.
pub fn http_options(config: &Config) -> HttpOptions {
    HttpOptions {
        max_body_bytes: config.server.max_body_bytes,
        max_file_bytes: config.server.stored_files_bytes,
        grace: Duration::from_secs(config.server.shutdown_grace_secs),
        webui: config.server.webui,
        cors_origins: config.server.cors_origins.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A setting that does not hold a usable value is named as the configuration spells it
    /// (a bad dtype was once reported as `server.host`).
    #[test]
    fn unusable_settings_name_their_own_key() {
        let settings = [("model.path".to_string(), "\"m\"".to_string())];
        let mut config = Config::load(None, std::iter::empty(), &settings).unwrap();
        config.model.dtype = "q3_x".into();
        let Err(e) = builder(&config) else { panic!("a bad dtype was accepted") };
        assert!(e.to_string().starts_with("config `model.dtype`: "), "{e}");
        config.model.dtype = "auto".into();
        config.model.device = "tpu".into();
        let Err(e) = builder(&config) else { panic!("a bad device was accepted") };
        assert!(e.to_string().starts_with("config `model.device`: "), "{e}");
    }
}
