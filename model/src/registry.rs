//! C2: model types by name. Adding a model type is one module and one entry in `MODEL_TYPES`.

use burn::tensor::Device;

use crate::error::LoadError;
use crate::lm::{LanguageModel, ModelInfo};
use crate::source::ModelSource;
use crate::tensors::WeightDtype;
use crate::{mock, qwen2};

/// How to load a model.
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    pub weight_dtype: WeightDtype,
}

pub type LoadFn = fn(Option<&ModelSource>, &LoadOptions, &Device) -> Result<Box<dyn LanguageModel>, LoadError>;
pub type InfoFn = fn(Option<&ModelSource>) -> Result<ModelInfo, LoadError>;

/// A registered model type.
pub struct ModelType {
    /// The `model_type` of `config.json`, or a GGUF's `general.architecture`.
    pub name: &'static str,
    pub load: LoadFn,
    /// What `load` would report as the model's info, from its configuration alone (no weights).
    pub info: InfoFn,
}

pub const MODEL_TYPES: &[ModelType] = &[
    ModelType { name: "qwen2", load: qwen2::load, info: qwen2::info },
    ModelType { name: "mock", load: mock::load, info: mock::info },
];

/// Loads a model of type `model_type`, or of the type `source` names when `None`.
pub fn load_model(
    model_type: Option<&str>,
    source: Option<&ModelSource>,
    opts: &LoadOptions,
    device: &Device,
) -> Result<Box<dyn LanguageModel>, LoadError> {
    (model_type_of(model_type, source)?.load)(source, opts, device)
}

/// The info of the model `load_model` would load, read from its configuration only (a
/// cluster's router-only front needs the vocabulary and context, not the weights).
pub fn model_info(model_type: Option<&str>, source: Option<&ModelSource>) -> Result<ModelInfo, LoadError> {
    (model_type_of(model_type, source)?.info)(source)
}

fn model_type_of(model_type: Option<&str>, source: Option<&ModelSource>) -> Result<&'static ModelType, LoadError> {
    let name = match (model_type, source) {
        (Some(name), _) => name.to_string(),
        (None, Some(source)) => source.model_type()?,
        (None, None) => {
            return Err(LoadError::NeedsDirectory { model_type: "(unspecified)" });
        }
    };
    MODEL_TYPES.iter().find(|t| t.name == name).ok_or_else(|| LoadError::UnknownModelType {
        name: name.clone(),
        known: MODEL_TYPES.iter().map(|t| t.name).collect::<Vec<_>>().join(", "),
    })
}
