//! C2: model types by name. Adding a model type is one module and one entry in `MODEL_TYPES`.

use burn::tensor::Device;

use crate::error::LoadError;
use crate::lm::LanguageModel;
use crate::source::ModelSource;
use crate::tensors::WeightDtype;
use crate::{mock, qwen2};

/// How to load a model.
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    pub weight_dtype: WeightDtype,
}

pub type LoadFn = fn(Option<&ModelSource>, &LoadOptions, &Device) -> Result<Box<dyn LanguageModel>, LoadError>;

/// A registered model type.
pub struct ModelType {
    /// The `model_type` of `config.json`, or a GGUF's `general.architecture`.
    pub name: &'static str,
    pub load: LoadFn,
}

pub const MODEL_TYPES: &[ModelType] =
    &[ModelType { name: "qwen2", load: qwen2::load }, ModelType { name: "mock", load: mock::load }];

/// Loads a model of type `model_type`, or of the type `source` names when `None`.
pub fn load_model(
    model_type: Option<&str>,
    source: Option<&ModelSource>,
    opts: &LoadOptions,
    device: &Device,
) -> Result<Box<dyn LanguageModel>, LoadError> {
    let name = match (model_type, source) {
        (Some(name), _) => name.to_string(),
        (None, Some(source)) => source.model_type()?,
        (None, None) => {
            return Err(LoadError::NeedsDirectory { model_type: "(unspecified)" });
        }
    };
    let entry = MODEL_TYPES.iter().find(|t| t.name == name).ok_or_else(|| LoadError::UnknownModelType {
        name: name.clone(),
        known: MODEL_TYPES.iter().map(|t| t.name).collect::<Vec<_>>().join(", "),
    })?;
    (entry.load)(source, opts, device)
}
