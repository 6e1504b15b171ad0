//! `Engine::builder()`: a model file or directory in, a running engine (or an offline `Llm`)
//! out, with its tokenizer, chat template and generation defaults.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use llaisys_model::{Device, LoadError, LoadOptions, ModelSource, WeightDtype, load_model};

use super::frontend::{Frontend, GenerationDefaults, RequestLimits};
use crate::speculative::SettingError;
use crate::{Engine, EngineConfig, EngineError, Llm, ModelLoader};

/// Why an engine could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("no model: give `model(path)` (a GGUF file or a Hugging Face directory) or a `model_type`")]
    NoModel,
    #[error("loading the model {path}: {source}")]
    Load { path: String, source: LoadError },
    #[error("the draft model {path} cannot propose for this model: its vocabulary differs ({difference})")]
    DraftVocabulary { path: String, difference: String },
    #[error("speculative decoding: {0}")]
    Speculative(#[from] SettingError),
    #[error("starting the engine: {0}")]
    Engine(#[from] EngineError),
}

/// Settings of an engine to build; `Engine::builder()` makes one.
#[derive(Debug, Clone)]
pub struct EngineBuilder {
    model: Option<PathBuf>,
    model_type: Option<String>,
    draft: Option<PathBuf>,
    load: LoadOptions,
    device: Device,
    config: EngineConfig,
    limits: RequestLimits,
}

impl Default for EngineBuilder {
    fn default() -> Self {
        Self {
            model: None,
            model_type: None,
            draft: None,
            load: LoadOptions::default(),
            device: Device::flex(),
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

    /// A draft model (GGUF file or Hugging Face directory) that proposes tokens for speculating
    /// requests instead of prompt lookup: a smaller or more quantized model with the same
    /// vocabulary. Which requests speculate is `EngineConfig::speculative`'s `default_on` and
    /// each request's own `speculative` option.
    pub fn draft_model(mut self, path: impl AsRef<Path>) -> Self {
        self.draft = Some(path.as_ref().to_path_buf());
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

    /// The device the model runs on.
    pub fn device(mut self, device: Device) -> Self {
        self.device = device;
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
        let Parts { loader, frontend, config, draft } = self.parts()?;
        Ok(Engine::start_with_draft(loader, frontend, config, draft).await?)
    }

    /// Loads the model for blocking offline use.
    pub fn build_offline(self) -> Result<Llm, BuildError> {
        let Parts { loader, frontend, config, draft } = self.parts()?;
        let model = loader().map_err(|source| BuildError::Load { path: "(model)".into(), source })?;
        let mut llm = Llm::with_frontend(model, frontend, config);
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
        let path = self.model.as_ref().map(|p| p.display().to_string()).unwrap_or_default();
        let load_err = |source| BuildError::Load { path: path.clone(), source };
        let source = self.model.as_deref().map(ModelSource::resolve).transpose().map_err(load_err)?;
        let frontend = match &source {
            Some(source) => {
                let tokenizer = source.tokenizer().map_err(load_err)?;
                let template = source.chat_template().map_err(load_err)?;
                let defaults =
                    source.generation_config().map(|p| GenerationDefaults::from_file(&p)).unwrap_or_default();
                Some(Frontend::new(tokenizer, template, defaults, self.limits))
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
                let difference = match &frontend {
                    Some(f) => f.tokenizer().vocab_difference(&tokenizer),
                    None => Some("the model has no tokenizer to compare with".into()),
                };
                if let Some(difference) = difference {
                    return Err(BuildError::DraftVocabulary { path: shown, difference });
                }
                let (load, device) = (self.load.clone(), self.device.clone());
                let loader: ModelLoader = Arc::new(move || load_model(None, Some(&source), &load, &device));
                Some(loader)
            }
            None => None,
        };
        let (model_type, load, device) = (self.model_type, self.load, self.device);
        let loader: ModelLoader = Arc::new(move || load_model(model_type.as_deref(), source.as_ref(), &load, &device));
        Ok(Parts { loader, frontend, config: self.config, draft })
    }
}

/// What an engine is built from.
struct Parts {
    loader: ModelLoader,
    frontend: Option<Frontend>,
    config: EngineConfig,
    draft: Option<ModelLoader>,
}
