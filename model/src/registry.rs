//! C2: model types by name. Adding a model type is one module and one entry in `MODEL_TYPES`.

use std::path::Path;

use burn::tensor::Device;

use crate::checkpoint::WeightDtype;
use crate::config::read_json;
use crate::error::LoadError;
use crate::lm::LanguageModel;
use crate::{mock, qwen2};

/// How to load a model.
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    pub weight_dtype: WeightDtype,
}

pub type LoadFn = fn(Option<&Path>, &LoadOptions, &Device) -> Result<Box<dyn LanguageModel>, LoadError>;

/// A registered model type.
pub struct ModelType {
    /// The `model_type` of `config.json`.
    pub name: &'static str,
    pub load: LoadFn,
}

pub const MODEL_TYPES: &[ModelType] =
    &[ModelType { name: "qwen2", load: qwen2::load }, ModelType { name: "mock", load: mock::load }];

/// Loads a model of type `model_type`, or of the type named in `DIR/config.json` when `None`.
pub fn load_model(
    model_type: Option<&str>,
    dir: Option<&Path>,
    opts: &LoadOptions,
    device: &Device,
) -> Result<Box<dyn LanguageModel>, LoadError> {
    let name = match (model_type, dir) {
        (Some(name), _) => name.to_string(),
        (None, Some(dir)) => detect(dir)?,
        (None, None) => {
            return Err(LoadError::NeedsDirectory { model_type: "(unspecified)" });
        }
    };
    let entry = MODEL_TYPES.iter().find(|t| t.name == name).ok_or_else(|| LoadError::UnknownModelType {
        name: name.clone(),
        known: MODEL_TYPES.iter().map(|t| t.name).collect::<Vec<_>>().join(", "),
    })?;
    (entry.load)(dir, opts, device)
}

/// The `model_type` field of `DIR/config.json`.
fn detect(dir: &Path) -> Result<String, LoadError> {
    let json = read_json(&dir.join("config.json"))?;
    json.get("model_type").and_then(|v| v.as_str()).map(str::to_owned).ok_or_else(|| LoadError::Config {
        field: "model_type".into(),
        reason: "missing: pass the model type explicitly".into(),
    })
}
