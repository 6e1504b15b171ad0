//! `Engine::builder()`: a model file or directory in, a running engine (or an offline `Llm`)
//! out, with its tokenizer, chat template and generation defaults.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use llaisys_model::adapter::Lora;
use llaisys_model::{
    DeviceError, DeviceSpec, LoadError, LoadOptions, ModelSource, WeightDtype, load_model, model_info,
};

use super::frontend::{Frontend, RequestLimits};
use super::rerank::Reranker;
use super::text::{GenerationDefaults, ModelText};
use crate::placement::PlacementConfig;
use crate::speculative::SettingError;
use crate::{Engine, EngineConfig, EngineError, Llm, ModelLoader, ReplicaSpec};

/// Why an engine could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("no model: give `model(path)` (a GGUF file or a Hugging Face directory) or a `model_type`")]
    NoModel,
    #[error("loading the model {path}: {source}")]
    Load { path: String, source: LoadError },
    #[error("the draft model {path} cannot propose for this model: its vocabulary differs ({difference})")]
    DraftVocabulary { path: String, difference: String },
    #[error("the model {path} cannot rerank: {reason}")]
    Reranker { path: String, reason: String },
    #[error("--device: {0}")]
    Device(#[from] DeviceError),
    #[error("offline use (`build_offline`) runs on one device; {0} were given")]
    OfflineDevices(usize),
    #[error("speculative decoding: {0}")]
    Speculative(#[from] SettingError),
    #[error("starting the engine: {0}")]
    Engine(#[from] EngineError),
}

impl BuildError {
    /// A stable label for logs.
    pub fn error_type(&self) -> &'static str {
        match self {
            Self::NoModel => "no_model",
            Self::Load { source, .. } => source.error_type(),
            Self::DraftVocabulary { .. } => "draft_vocabulary",
            Self::Reranker { .. } => "reranker",
            Self::Device(_) => "device",
            Self::OfflineDevices(_) => "offline_devices",
            Self::Speculative(_) => "speculative",
            Self::Engine(e) => e.error_type(),
        }
    }
}

/// Settings of an engine to build; `Engine::builder()` makes one.
#[derive(Debug, Clone)]
pub struct EngineBuilder {
    model: Option<PathBuf>,
    mmproj: Option<PathBuf>,
    model_type: Option<String>,
    draft: Option<PathBuf>,
    reranker: Reranker,
    load: LoadOptions,
    devices: Vec<DeviceSpec>,
    placement: PlacementConfig,
    config: EngineConfig,
    limits: RequestLimits,
}

impl Default for EngineBuilder {
    fn default() -> Self {
        Self {
            model: None,
            mmproj: None,
            model_type: None,
            draft: None,
            reranker: Reranker::default(),
            load: LoadOptions::default(),
            devices: vec![DeviceSpec::Cpu],
            placement: PlacementConfig::default(),
            config: EngineConfig::default(),
            limits: RequestLimits::default(),
        }
    }
}

impl EngineBuilder {
    /// The checkpoint: a GGUF file, or a Hugging Face directory (or one holding a GGUF).
    pub fn model(mut self, path: impl AsRef<Path>) -> Self {
        self.model = Some(path.as_ref().to_path_buf());
        self
    }

    /// The vision tower of a GGUF model: llama.cpp's projector file (`mmproj-*.gguf`, its
    /// `--mmproj`). A directory holding the model and one projector file needs none.
    pub fn mmproj(mut self, path: impl AsRef<Path>) -> Self {
        self.mmproj = Some(path.as_ref().to_path_buf());
        self
    }

    /// The model's files: where the model is, with its projector file.
    fn source(&self) -> Result<Option<ModelSource>, BuildError> {
        let Some(model) = &self.model else {
            return match &self.mmproj {
                Some(_) => Err(BuildError::NoModel),
                None => Ok(None),
            };
        };
        let load_err = |source| BuildError::Load { path: model.display().to_string(), source };
        let source = ModelSource::resolve(model).map_err(load_err)?;
        Ok(Some(source.with_mmproj(self.mmproj.clone()).map_err(load_err)?))
    }

    /// A draft model (GGUF file or Hugging Face directory) that proposes tokens for speculating
    /// requests instead of prompt lookup: a smaller or more quantized model with the same
    /// vocabulary. Which requests speculate is `EngineConfig::speculative`'s `default_on` and
    /// each request's own `speculative` option.
    pub fn draft_model(mut self, path: impl AsRef<Path>) -> Self {
        self.draft = Some(path.as_ref().to_path_buf());
        self
    }

    /// Whether the model scores documents itself as a yes/no reranker (`Engine::rerank`);
    /// default: when its path names it a reranker (see [`Reranker`]).
    pub fn reranker(mut self, reranker: Reranker) -> Self {
        self.reranker = reranker;
        self
    }

    /// The registry's model type (default: the checkpoint's own). `mock` needs no checkpoint.
    pub fn model_type(mut self, model_type: impl Into<String>) -> Self {
        self.model_type = Some(model_type.into());
        self
    }

    /// The weights' dtype in memory (default: the checkpoint's own precision).
    pub fn dtype(mut self, dtype: WeightDtype) -> Self {
        self.load.weight_dtype = dtype;
        self
    }

    /// An importance matrix (llama.cpp's `llama-imatrix` file) weighting the errors of the
    /// matrices the dtype quantizes at load (the model's only, not a draft model's).
    pub fn imatrix(mut self, path: impl Into<PathBuf>) -> Self {
        self.load.imatrix = Some(path.into());
        self
    }

    /// A LoRA adapter merged into the weights as they load, times `scale` (1: as trained): a
    /// PEFT directory for a checkpoint, llama.cpp's GGUF adapter for a GGUF file. Repeated, each
    /// adds its change (the model's only, not a draft model's).
    pub fn lora(mut self, path: impl Into<PathBuf>, scale: f32) -> Self {
        self.load.adapters.push(Lora { path: path.into(), scale });
        self
    }

    /// The device the model runs on (default: the CPU).
    pub fn device(mut self, device: DeviceSpec) -> Self {
        self.devices = vec![device];
        self
    }

    /// One replica of the model per entry, each a worker with its own KV cache (the same device
    /// twice is two replicas); each request goes to one, chosen by session, cached prefix and
    /// load (`placement`).
    pub fn devices(mut self, devices: impl IntoIterator<Item = DeviceSpec>) -> Self {
        self.devices = devices.into_iter().collect();
        self
    }

    /// How requests are spread over several replicas.
    pub fn placement(mut self, placement: PlacementConfig) -> Self {
        self.placement = placement;
        self
    }

    /// KV cache size and scheduling budgets.
    pub fn config(mut self, config: EngineConfig) -> Self {
        self.config = config;
        self
    }

    /// What one request may ask for.
    pub fn limits(mut self, limits: RequestLimits) -> Self {
        self.limits = limits;
        self
    }

    /// Loads the model (off the async threads) and starts the engine's actors in the current
    /// tokio runtime. A worker that fails later is replaced by loading the model again.
    pub async fn build(self) -> Result<Engine, BuildError> {
        let Parts { replicas, text, limits, config, placement } = self.parts()?;
        Ok(Engine::start_limited(replicas, text, limits, config, placement).await?)
    }

    /// The model's sizes, text side and request limits, from its configuration and tokenizer
    /// files only: the weights are not read (a cluster's router-only front, whose nodes check
    /// requests against their own KV caches).
    pub fn build_frontend(self) -> Result<Frontend, BuildError> {
        let path = self.model.as_ref().map(|p| p.display().to_string()).unwrap_or_default();
        let load_err = |source| BuildError::Load { path: path.clone(), source };
        let source = self.source()?;
        let info = model_info(self.model_type.as_deref(), source.as_ref()).map_err(load_err)?;
        let Parts { text, limits, .. } = self.parts()?;
        Ok(Frontend::new(info, text, limits, None))
    }

    /// Loads the model for blocking offline use.
    pub fn build_offline(self) -> Result<Llm, BuildError> {
        let Parts { mut replicas, text, limits, config, .. } = self.parts()?;
        if replicas.len() != 1 {
            return Err(BuildError::OfflineDevices(replicas.len()));
        }
        let ReplicaSpec { loader, draft, .. } = replicas.remove(0);
        let model = loader().map_err(|source| BuildError::Load { path: "(model)".into(), source })?;
        let mut llm = Llm::with_text(model, text, limits, config);
        if let Some(draft) = draft {
            let model = draft().map_err(|source| BuildError::Load { path: "(draft model)".into(), source })?;
            llm = llm.with_draft(model, &config);
        }
        Ok(llm)
    }

    fn parts(self) -> Result<Parts, BuildError> {
        if self.model.is_none() && self.model_type.is_none() {
            return Err(BuildError::NoModel);
        }
        if self.devices.is_empty() {
            return Err(DeviceError::Empty.into());
        }
        let path = self.model.as_ref().map(|p| p.display().to_string()).unwrap_or_default();
        let load_err = |source| BuildError::Load { path: path.clone(), source };
        let source = self.source()?;
        let text = match &source {
            Some(source) => {
                let tokenizer = source.tokenizer().map_err(load_err)?;
                let template = source.chat_template().map_err(load_err)?;
                let defaults =
                    source.generation_config().map(|p| GenerationDefaults::from_file(&p)).unwrap_or_default();
                let mut text = ModelText::new(tokenizer, template, defaults);
                text.files = source.summary().inspect_err(|e| tracing::warn!(%e, "the model's files")).ok();
                text.adapters = self.load.adapters.clone();
                text.judge = self
                    .reranker
                    .resolve(self.model.as_deref(), &text)
                    .map_err(|reason| BuildError::Reranker { path: path.clone(), reason })?;
                Some(text)
            }
            None => None,
        };
        self.config.speculative.validate()?;
        let draft = match &self.draft {
            Some(path) => {
                let shown = path.display().to_string();
                let source =
                    ModelSource::resolve(path).map_err(|source| BuildError::Load { path: shown.clone(), source })?;
                let tokenizer =
                    source.tokenizer().map_err(|source| BuildError::Load { path: shown.clone(), source })?;
                let difference = match &text {
                    Some(f) => f.tokenizer().vocab_difference(&tokenizer),
                    None => Some("the model has no tokenizer to compare with".into()),
                };
                if let Some(difference) = difference {
                    return Err(BuildError::DraftVocabulary { path: shown, difference });
                }
                Some(source)
            }
            None => None,
        };
        let mut replicas = Vec::with_capacity(self.devices.len());
        for spec in &self.devices {
            let device = spec.device()?;
            if let Some(kv) = self.config.kv_dtype {
                spec.check_kv_dtype(&device, kv)?;
            }
            let (model_type, load, source, dev) =
                (self.model_type.clone(), self.load.clone(), source.clone(), device.clone());
            let loader: ModelLoader = Arc::new(move || load_model(model_type.as_deref(), source.as_ref(), &load, &dev));
            let draft = draft.clone().map(|source| {
                // The importance matrix and the adapters are the main model's.
                let load = LoadOptions { imatrix: None, adapters: Vec::new(), ..self.load.clone() };
                let device = device.clone();
                Arc::new(move || load_model(None, Some(&source), &load, &device)) as ModelLoader
            });
            replicas.push(ReplicaSpec { device: spec.to_string(), loader, draft });
        }
        Ok(Parts { replicas, text, limits: self.limits, config: self.config, placement: self.placement })
    }
}

/// What an engine is built from.
struct Parts {
    replicas: Vec<ReplicaSpec>,
    text: Option<ModelText>,
    limits: RequestLimits,
    config: EngineConfig,
    placement: PlacementConfig,
}
