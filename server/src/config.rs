//! S6: the server's configuration. The defaults are `config/default.toml` (built in); a config
//! file, `LLAISYS_<SECTION>_<KEY>` environment variables and command-line settings override
//! them in that order. Every error names the key it is about.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use llaisys_actors::cluster::{ClusterConfig, ClusterError, Tls, read_cookie};
use llaisys_actors::placement::{PlacementConfig, Routing};
use llaisys_actors::speculative::SpeculativeConfig;
use llaisys_actors::{EngineConfig, RequestLimits, Reranker};
use llaisys_model::{DeviceSpec, WeightDtype};
use serde::Deserialize;

/// The documented defaults.
pub const DEFAULT_TOML: &str = include_str!("../../config/default.toml");

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub server: ServerConfig,
    pub model: ModelConfig,
    /// `[engine]` and `[speculative]` deserialise into the engine's own configuration types:
    /// each knob is defined once, there.
    pub engine: EngineConfig,
    pub speculative: SpeculativeConfig,
    /// `[limits]`: what one request may ask for (the engine's checks)...
    pub limits: RequestLimits,
    /// ... and the server's own admission limits from the same section.
    #[serde(skip)]
    pub admission: AdmissionLimits,
    /// `speculative.draft_model`: the draft model's path (empty: prompt lookup), which the
    /// builder loads beside the model.
    #[serde(skip)]
    pub draft_model: PathBuf,
    pub cluster: ClusterSection,
}

/// `[limits]`' server-side keys: requests admitted to the engine at once, and waiting for it.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct AdmissionLimits {
    pub max_concurrent_requests: usize,
    pub max_queue: usize,
}

/// The keys of `[speculative]` and `[limits]` that are not the engine's, read from the same
/// table in a second pass (each struct takes its own keys and leaves the others; `Config::load`
/// refuses keys the defaults do not have).
#[derive(Deserialize)]
struct ServerKeys {
    speculative: DraftModel,
    limits: AdmissionLimits,
}

#[derive(Deserialize)]
struct DraftModel {
    draft_model: PathBuf,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterSection {
    pub listen: String,
    pub cookie_file: PathBuf,
    pub name: String,
    pub serve_local: bool,
    pub routing: String,
    pub heartbeat_interval_ms: u64,
    pub heartbeat_timeout_ms: u64,
    pub capacity: usize,
    pub tls_cert: PathBuf,
    pub tls_key: PathBuf,
    pub tls_ca: PathBuf,
    pub tls_server_name: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    pub host: String,
    pub port: u16,
    pub api_keys: Vec<String>,
    pub max_body_bytes: usize,
    pub shutdown_grace_secs: u64,
    pub webui: bool,
    pub cors_origins: Vec<String>,
    pub stored_responses: usize,
    pub stored_files_bytes: usize,
    /// Which remote image URLs are fetched: `off`, `public` (hosts at public addresses only) or `any`.
    pub image_urls: crate::http::fetch::ImageUrls,
    /// The only hosts images are fetched from, where not empty (private ones too).
    pub image_url_hosts: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    pub path: PathBuf,
    pub offline: bool,
    pub name: String,
    pub model_type: String,
    pub dtype: String,
    /// An importance matrix for the matrices `dtype` quantizes at load (empty: none).
    pub imatrix: PathBuf,
    /// A GGUF model's vision tower: llama.cpp's projector file (empty: none, or the one beside
    /// the model in its directory).
    pub mmproj: PathBuf,
    pub device: String,
    /// `auto`, `yes_no` or `off`: whether the model scores `/v1/rerank` documents itself.
    pub reranker: String,
    /// More models served beside this one (each its own engine, with these settings).
    pub also: Vec<AlsoModel>,
    /// LoRA adapters merged into this model's weights as they load, in order.
    pub lora: Vec<LoraConfig>,
}

/// A LoRA adapter: a PEFT directory (for a checkpoint) or llama.cpp's GGUF adapter (for a GGUF
/// file), as a path or a name on the Hugging Face hub (as `model.path`), and how much of its
/// change (1: as trained).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoraConfig {
    pub path: PathBuf,
    #[serde(default = "as_trained")]
    pub scale: f32,
}

fn as_trained() -> f32 {
    1.0
}

/// A model served beside `model.path`: its path (or name on the hub) and the name clients use.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AlsoModel {
    pub path: PathBuf,
    #[serde(default)]
    pub name: String,
    /// Its own adapters (`model.lora` is the first model's).
    #[serde(default)]
    pub lora: Vec<LoraConfig>,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config file {path}: {reason}")]
    File { path: PathBuf, reason: String },
    #[error("config key `{key}` ({origin}): {reason}")]
    Key { key: String, origin: String, reason: String },
    /// The built-in defaults do not parse (a broken build).
    #[error("config: the built-in defaults: {0}")]
    Defaults(#[from] toml::de::Error),
}

impl ConfigError {
    /// A stable label for logs.
    pub fn error_type(&self) -> &'static str {
        match self {
            Self::File { .. } => "config_file",
            Self::Key { .. } => "config_key",
            Self::Defaults(_) => "config_defaults",
        }
    }
}

impl Config {
    /// The defaults, then `file`, then the environment, then `settings` (`section.key`, value as
    /// written on the command line).
    pub fn load(
        file: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
        settings: &[(String, String)],
    ) -> Result<Self, ConfigError> {
        let mut table: toml::Table = DEFAULT_TOML.parse()?;
        let mut sources: Vec<(String, String)> = Vec::new(); // key → where its value came from
        if let Some(path) = file {
            let text = std::fs::read_to_string(path)
                .map_err(|e| ConfigError::File { path: path.into(), reason: e.to_string() })?;
            let over: toml::Table = text
                .parse()
                .map_err(|e: toml::de::Error| ConfigError::File { path: path.into(), reason: e.to_string() })?;
            for (section, values) in over {
                let toml::Value::Table(values) = values else {
                    return Err(ConfigError::Key {
                        key: section,
                        origin: path.display().to_string(),
                        reason: "expected a [section]".into(),
                    });
                };
                for (key, value) in values {
                    let full = format!("{section}.{key}");
                    set(&mut table, &full, value, &path.display().to_string())?;
                    sources.push((full, path.display().to_string()));
                }
            }
        }
        let keys: Vec<String> = table
            .iter()
            .flat_map(|(s, v)| v.as_table().into_iter().flat_map(move |t| t.keys().map(move |k| format!("{s}.{k}"))))
            .collect();
        let mut env: Vec<(String, String)> = env.into_iter().filter(|(k, _)| k.starts_with("LLAISYS_")).collect();
        env.sort();
        for (var, raw) in env {
            let Some(key) = keys.iter().find(|k| env_name(k) == var) else { continue };
            set(&mut table, key, parse_value(&raw), &var)?;
            sources.push((key.clone(), var));
        }
        for (key, raw) in settings {
            set(&mut table, key, parse_value(raw), "command line")?;
            sources.push((key.clone(), "command line".into()));
        }
        let source_of =
            |key: &str| sources.iter().rev().find(|(k, _)| k == key).map_or("default".into(), |(_, s)| s.clone());
        let key_error = |e: serde_path_to_error::Error<toml::de::Error>| {
            let key = e.path().to_string();
            ConfigError::Key { origin: source_of(&key), key, reason: e.into_inner().message().to_string() }
        };
        let table = toml::Value::Table(table);
        let mut config: Config = serde_path_to_error::deserialize(table.clone()).map_err(key_error)?;
        let server: ServerKeys = serde_path_to_error::deserialize(table).map_err(key_error)?;
        (config.admission, config.draft_model) = (server.limits, server.speculative.draft_model);
        config.validate(&source_of)?;
        Ok(config)
    }

    fn validate(&self, source_of: &dyn Fn(&str) -> String) -> Result<(), ConfigError> {
        let bad = |key: &str, reason: &str| ConfigError::Key {
            key: key.into(),
            origin: source_of(key),
            reason: reason.into(),
        };
        if self.model.path.as_os_str().is_empty() {
            return Err(bad("model.path", "no model: give --model FILE.gguf or DIR (or LLAISYS_MODEL_PATH)"));
        }
        if self.model.also.iter().any(|m| m.path.as_os_str().is_empty()) {
            return Err(bad("model.also", "each model needs its path"));
        }
        if !self.model.also.is_empty() && !self.cluster.listen.is_empty() {
            return Err(bad("model.also", "a cluster's front serves one model"));
        }
        self.weight_dtype().map_err(|e| bad("model.dtype", &e))?;
        let adapters = self.model.lora.iter().map(|l| ("model.lora", l));
        for (key, lora) in adapters.chain(self.model.also.iter().flat_map(|m| &m.lora).map(|l| ("model.also", l))) {
            // A path that does not exist is a name on the hub, if it reads as one.
            let spec = crate::hub::ModelSpec::parse(&lora.path.to_string_lossy());
            if matches!(spec, crate::hub::ModelSpec::Path(_)) && !lora.path.exists() {
                return Err(bad(key, &format!("no adapter {}", lora.path.display())));
            }
            if !lora.scale.is_finite() {
                return Err(bad(key, &format!("{}: scale {} is not a number", lora.path.display(), lora.scale)));
            }
        }
        if !self.model.imatrix.as_os_str().is_empty() && !self.model.imatrix.is_file() {
            return Err(bad("model.imatrix", &format!("no file {}", self.model.imatrix.display())));
        }
        if !self.model.mmproj.as_os_str().is_empty() && !self.model.mmproj.is_file() {
            return Err(bad("model.mmproj", &format!("no file {}", self.model.mmproj.display())));
        }
        self.devices().map_err(|e| bad("model.device", &e))?;
        let factor = self.engine.prefill_step_factor;
        if !(factor == 0.0 || (factor.is_finite() && factor > 1.0)) {
            return Err(bad("engine.prefill_step_factor", "must be 0 (off) or a number above 1"));
        }
        for (key, value) in [
            ("server.max_body_bytes", self.server.max_body_bytes),
            ("engine.kv_capacity", self.engine.kv_capacity),
            ("engine.max_seqs_per_step", self.engine.max_seqs_per_step),
            ("engine.max_tokens_per_step", self.engine.max_tokens_per_step),
            ("engine.max_prefill_tokens_while_decoding", self.engine.max_prefill_tokens_while_decoding),
            ("limits.max_concurrent_requests", self.admission.max_concurrent_requests),
            ("limits.max_tokens", self.limits.max_tokens),
            ("limits.max_n", self.limits.max_n),
        ] {
            if value == 0 {
                return Err(bad(key, "must be at least 1"));
            }
        }
        if self.engine.max_seqs_per_step > llaisys_model::kv::MAX_SEQ {
            return Err(bad("engine.max_seqs_per_step", &format!("must be at most {}", llaisys_model::kv::MAX_SEQ)));
        }
        self.engine_config().speculative.validate().map_err(|e| bad(e.key, &e.reason))?;
        self.routing().map_err(|e| bad("cluster.routing", &e))?;
        if !self.cluster.listen.is_empty() {
            self.cluster_listen().map_err(|e| bad("cluster.listen", &e))?;
        }
        let c = &self.cluster;
        if c.heartbeat_interval_ms == 0 {
            return Err(bad("cluster.heartbeat_interval_ms", "must be at least 1"));
        }
        if c.heartbeat_timeout_ms <= c.heartbeat_interval_ms {
            return Err(bad("cluster.heartbeat_timeout_ms", "must be longer than cluster.heartbeat_interval_ms"));
        }
        if c.tls_cert.as_os_str().is_empty() != c.tls_key.as_os_str().is_empty() {
            return Err(bad("cluster.tls_key", "give both cluster.tls_cert and cluster.tls_key, or neither"));
        }
        if self.server.api_keys.iter().any(|k| k.trim().is_empty()) {
            return Err(bad("server.api_keys", "keys must not be empty"));
        }
        if let Some(o) = self.server.cors_origins.iter().find(|o| !valid_origin(o)) {
            return Err(bad(
                "server.cors_origins",
                &format!("{o:?} is not an origin: \"*\" or scheme://host[:port], without a path"),
            ));
        }
        Ok(())
    }

    /// `cluster.routing` as the placement policy's rule.
    pub fn routing(&self) -> Result<Routing, String> {
        self.cluster.routing.parse()
    }

    /// `cluster.listen` as an address.
    pub fn cluster_listen(&self) -> Result<SocketAddr, String> {
        self.cluster.listen.parse().map_err(|e| format!("'{}': {e} (expected HOST:PORT)", self.cluster.listen))
    }

    /// The cluster's cookie: `cluster.cookie_file`'s first line, else `LLAISYS_CLUSTER_COOKIE`.
    pub fn cluster_cookie(&self) -> Result<String, ClusterError> {
        let file = &self.cluster.cookie_file;
        read_cookie((!file.as_os_str().is_empty()).then_some(file.as_path()))
    }

    /// The front's TLS (`cluster.tls_cert` and `tls_key`), if set.
    pub fn cluster_server_tls(&self) -> Result<Option<Tls>, ClusterError> {
        let c = &self.cluster;
        match c.tls_cert.as_os_str().is_empty() {
            true => Ok(None),
            false => Tls::server(&c.tls_cert, &c.tls_key).map(Some),
        }
    }

    /// A worker's TLS (`cluster.tls_ca` and `tls_server_name`), if set.
    pub fn cluster_client_tls(&self) -> Result<Option<Tls>, ClusterError> {
        let c = &self.cluster;
        match c.tls_ca.as_os_str().is_empty() {
            true => Ok(None),
            false => Tls::client(&c.tls_ca, &c.tls_server_name).map(Some),
        }
    }

    /// The cluster's settings for this process (a front or a worker node).
    pub fn cluster_config(&self) -> ClusterConfig {
        let c = &self.cluster;
        let defaults = ClusterConfig::default();
        ClusterConfig {
            name: if c.name.is_empty() { defaults.name } else { c.name.clone() },
            heartbeat_interval: Duration::from_millis(c.heartbeat_interval_ms),
            heartbeat_timeout: Duration::from_millis(c.heartbeat_timeout_ms),
            queue: self.admission.max_queue,
            capacity: if c.capacity == 0 { self.admission.max_concurrent_requests } else { c.capacity },
            placement: PlacementConfig { routing: self.routing().unwrap_or_default(), ..PlacementConfig::default() },
        }
    }

    pub fn weight_dtype(&self) -> Result<WeightDtype, String> {
        self.model.dtype.parse::<WeightDtype>().map_err(|e| e.to_string())
    }

    /// `model.reranker`.
    pub fn reranker(&self) -> Result<Reranker, String> {
        let name = &self.model.reranker;
        Reranker::parse(name).ok_or_else(|| format!("\"{name}\" is not auto, yes_no or off"))
    }

    /// `model.device` as a list of devices, one replica each.
    pub fn devices(&self) -> Result<Vec<DeviceSpec>, String> {
        DeviceSpec::parse_list(&self.model.device).map_err(|e| e.to_string())
    }

    /// The name clients use for the model: `model.name`, or the file's name without `.gguf`,
    /// or the directory's name.
    pub fn model_name(&self) -> String {
        if !self.model.name.is_empty() {
            return self.model.name.clone();
        }
        if let Some(name) = crate::hub::ModelSpec::served_name(&self.model.path.to_string_lossy()) {
            return name;
        }
        let path = self.model.path.canonicalize().unwrap_or_else(|_| self.model.path.clone());
        let name = if path.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf")) {
            path.file_stem()
        } else {
            path.file_name()
        };
        name.map_or_else(|| "model".into(), |n| n.to_string_lossy().into_owned())
    }

    /// This config serving `also` instead of `model.path` (for the models beside it).
    pub fn for_model(&self, also: &AlsoModel) -> Config {
        let mut config = self.clone();
        (config.model.path, config.model.name) = (also.path.clone(), also.name.clone());
        config.model.lora.clone_from(&also.lora);
        config.model.also.clear();
        // The importance matrix and the projector are the main model's.
        config.model.imatrix = PathBuf::new();
        config.model.mmproj = PathBuf::new();
        config
    }

    /// What one request may ask for (the engine checks it).
    pub fn request_limits(&self) -> RequestLimits {
        self.limits
    }

    /// The engine's settings: `[engine]` with `[speculative]`'s.
    pub fn engine_config(&self) -> EngineConfig {
        EngineConfig { speculative: self.speculative, ..self.engine }
    }
}

/// `server.port` → `LLAISYS_SERVER_PORT`.
pub fn env_name(key: &str) -> String {
    format!("LLAISYS_{}", key.replace('.', "_").to_uppercase())
}

/// A value written outside TOML (environment, command line): TOML if it parses as a value,
/// else a plain string.
fn parse_value(raw: &str) -> toml::Value {
    format!("v = {raw}")
        .parse::<toml::Table>()
        .ok()
        .and_then(|mut t| t.remove("v"))
        .unwrap_or_else(|| toml::Value::String(raw.into()))
}

/// Sets `section.key`, which must exist in the defaults.
fn set(table: &mut toml::Table, key: &str, value: toml::Value, source: &str) -> Result<(), ConfigError> {
    let unknown = || ConfigError::Key { key: key.into(), origin: source.into(), reason: "no such key".into() };
    let (section, name) = key.split_once('.').ok_or_else(unknown)?;
    let section = table.get_mut(section).and_then(toml::Value::as_table_mut).ok_or_else(unknown)?;
    let slot = section.get_mut(name).ok_or_else(unknown)?;
    *slot = value;
    Ok(())
}

/// `*`, or an origin as browsers send it: `scheme://host[:port]`, no path, no trailing slash.
fn valid_origin(origin: &str) -> bool {
    if origin == "*" {
        return true;
    }
    let Some((scheme, rest)) = origin.split_once("://") else { return false };
    !scheme.is_empty()
        && scheme.bytes().all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b))
        && !rest.is_empty()
        && rest.bytes().all(|b| b.is_ascii_graphic() && !b"/?#".contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(env: &[(&str, &str)], settings: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let env = env.iter().map(|(k, v)| (k.to_string(), v.to_string()));
        let settings: Vec<(String, String)> = settings.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        Config::load(None, env, &settings)
    }

    #[test]
    fn the_model_path_is_all_that_is_needed() {
        let c = load(&[], &[("model.path", "models/x.gguf")]).unwrap();
        assert_eq!((c.server.port, c.engine.kv_capacity, c.model_name().as_str()), (8000, 8192, "x"));
        let err = load(&[], &[]).unwrap_err().to_string();
        assert!(err.contains("model.path") && err.contains("--model"), "{err}");
    }

    #[test]
    fn each_model_takes_its_own_adapters() {
        let root = env!("CARGO_MANIFEST_DIR");
        let (first, beside) = (format!("{root}/src"), format!("{root}/tests"));
        let settings = [
            ("model.path", "\"m\"".to_string()),
            ("model.lora", format!("[{{ path = {first:?}, scale = 0.5 }}]")),
            ("model.also", format!("[{{ path = \"e\", lora = [{{ path = {beside:?} }}] }}, {{ path = \"f\" }}]")),
        ];
        let c = load(&[], &settings.iter().map(|(k, v)| (*k, v.as_str())).collect::<Vec<_>>()).unwrap();
        let adapters = |c: &Config| c.model.lora.iter().map(|l| (l.path.clone(), l.scale)).collect::<Vec<_>>();
        assert_eq!(adapters(&c), [(first.into(), 0.5)]);
        assert_eq!(adapters(&c.for_model(&c.model.also[0])), [(beside.into(), 1.0)]);
        assert!(adapters(&c.for_model(&c.model.also[1])).is_empty());
    }

    #[test]
    fn the_command_line_beats_the_environment_which_beats_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("c.toml");
        std::fs::write(&file, "[server]\nport = 1\nhost = \"0.0.0.0\"\n[model]\npath = \"m\"\n").unwrap();
        let env = [("LLAISYS_SERVER_PORT".to_string(), "2".to_string()), ("HOME".into(), "/x".into())];
        let c = Config::load(Some(&file), env.clone(), &[]).unwrap();
        assert_eq!((c.server.port, c.server.host.as_str()), (2, "0.0.0.0"));
        let c = Config::load(Some(&file), env, &[("server.port".into(), "3".into())]).unwrap();
        assert_eq!(c.server.port, 3);
    }

    #[test]
    fn wrong_values_name_their_key_and_where_they_came_from() {
        let err = load(&[("LLAISYS_ENGINE_KV_CAPACITY", "lots")], &[("model.path", "m")]).unwrap_err().to_string();
        assert!(err.contains("engine.kv_capacity") && err.contains("LLAISYS_ENGINE_KV_CAPACITY"), "{err}");
        let err = load(&[], &[("model.path", "m"), ("limits.max_n", "0")]).unwrap_err().to_string();
        assert!(err.contains("limits.max_n") && err.contains("at least 1"), "{err}");
        let err = load(&[], &[("model.path", "m"), ("engine.prefill_step_factor", "0.5")]).unwrap_err().to_string();
        assert!(err.contains("engine.prefill_step_factor") && err.contains("above 1"), "{err}");
        assert!(load(&[], &[("model.path", "m"), ("engine.prefill_step_factor", "0")]).is_ok());
        let err = load(&[], &[("model.path", "m"), ("server.prot", "1")]).unwrap_err().to_string();
        assert!(err.contains("server.prot") && err.contains("no such key"), "{err}");
        let err = load(&[], &[("model.path", "m"), ("model.dtype", "f8")]).unwrap_err().to_string();
        assert!(err.contains("model.dtype"), "{err}");
        let err = load(&[], &[("model.path", "m"), ("model.imatrix", "\"no/such.imatrix\"")]).unwrap_err().to_string();
        assert!(err.contains("model.imatrix") && err.contains("no/such.imatrix"), "{err}");
        let err = load(&[], &[("model.path", "m"), ("model.mmproj", "\"no/mmproj.gguf\"")]).unwrap_err().to_string();
        assert!(err.contains("model.mmproj") && err.contains("no/mmproj.gguf"), "{err}");
        let err = load(&[], &[("model.path", "m"), ("model.lora", "[{ path = \"no/such/adapter\" }]")]).unwrap_err();
        assert!(err.to_string().contains("model.lora") && err.to_string().contains("no/such/adapter"), "{err}");
        let err = load(
            &[],
            &[("model.path", "m"), ("model.also", "[{ path = \"e\", lora = [{ path = \".\", scale = nan }] }]")],
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("model.also") && err.contains("not a number"), "{err}");
        let err = load(&[], &[("model.path", "m"), ("server.port", "70000")]).unwrap_err().to_string();
        assert!(err.contains("server.port"), "{err}");
    }

    #[test]
    fn every_default_is_documented_in_the_file() {
        let table: toml::Table = DEFAULT_TOML.parse().unwrap();
        for (section, values) in &table {
            for key in values.as_table().unwrap().keys() {
                let line = DEFAULT_TOML.lines().position(|l| l.starts_with(&format!("{key} ="))).unwrap();
                let above = DEFAULT_TOML.lines().nth(line - 1).unwrap();
                assert!(above.starts_with('#') || above.contains(" = "), "{section}.{key} has no comment");
            }
        }
    }

    /// The sections the engine's own types read, and the keys beside them, name the key of a
    /// value of the wrong type; the engine's config is the sections as they are.
    #[test]
    fn engine_sections_deserialise_into_the_engines_types_and_name_their_keys() {
        for (key, value) in [
            ("engine.kv_capacity", "\"x\""),
            ("engine.kv_dtype", "\"q4\""),
            ("engine.session_idle_timeout_secs", "-1"),
            ("speculative.default", "3"),
            ("speculative.max_draft", "\"x\""),
            ("speculative.draft_model", "3"),
            ("limits.max_n", "\"x\""),
            ("limits.max_queue", "\"x\""),
        ] {
            let err = load(&[], &[("model.path", "m"), (key, value)]).unwrap_err().to_string();
            assert!(err.starts_with(&format!("config key `{key}` (command line): ")), "{key}: {err}");
        }
        let settings = [
            ("model.path", "m"),
            ("engine.kv_capacity", "100"),
            ("engine.kv_dtype", "\"bf16\""),
            ("engine.session_idle_timeout_secs", "7"),
            ("speculative.default", "true"),
            ("speculative.draft_model", "\"d.gguf\""),
            ("limits.max_n", "3"),
            ("limits.max_queue", "5"),
        ];
        let c = load(&[], &settings).unwrap();
        let engine = c.engine_config();
        assert_eq!(
            (engine.kv_capacity, engine.session_idle_timeout.as_secs(), engine.speculative.default_on),
            (100, 7, true)
        );
        assert_eq!(engine.kv_dtype, Some(llaisys_model::KvDtype::BF16));
        assert_eq!(load(&[], &[("model.path", "m")]).unwrap().engine_config().kv_dtype, None, "auto");
        assert_eq!((c.request_limits().max_n, c.admission.max_queue), (3, 5));
        assert_eq!(c.draft_model, PathBuf::from("d.gguf"));
    }
}
