//! C2: model types by name. Every family of `crate::arch` loads through the shared decoder;
//! adding a family is a file of tables in `arch/` and an entry here.

use std::path::PathBuf;

use burn::tensor::Device;

use crate::error::LoadError;
use crate::lm::{LanguageModel, ModelInfo};
use crate::source::ModelSource;
use crate::tensors::WeightDtype;
use crate::{decoder, mock};

/// How to load a model.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    pub weight_dtype: WeightDtype,
    /// On a GPU, record a decode step's launches as a graph the second time its shape comes
    /// and replay it from then on (`decoder::replay`). On by default; the environment variable
    /// `LLAISYS_GPU_GRAPHS=off` turns the default off.
    pub step_graphs: bool,
    /// An importance matrix (llama.cpp's `llama-imatrix` file, GGUF or `.dat`) that weights the
    /// errors of the matrices quantized at load.
    pub imatrix: Option<PathBuf>,
}

impl Default for LoadOptions {
    fn default() -> Self {
        let off = std::env::var("LLAISYS_GPU_GRAPHS").is_ok_and(|v| matches!(v.as_str(), "off" | "0"));
        Self { weight_dtype: WeightDtype::default(), step_graphs: !off, imatrix: None }
    }
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
    ModelType { name: "qwen2", load: decoder::load, info: decoder::info },
    ModelType { name: "qwen3", load: decoder::load, info: decoder::info },
    ModelType { name: "llama", load: decoder::load, info: decoder::info },
    ModelType { name: "qwen2_moe", load: decoder::load, info: decoder::info },
    ModelType { name: "qwen3_moe", load: decoder::load, info: decoder::info },
    ModelType { name: "qwen3_5", load: decoder::load, info: decoder::info },
    ModelType { name: "qwen3_5_moe", load: decoder::load, info: decoder::info },
    ModelType { name: "qwen3_next", load: decoder::load, info: decoder::info },
    ModelType { name: "mistral", load: decoder::load, info: decoder::info },
    ModelType { name: "mixtral", load: decoder::load, info: decoder::info },
    ModelType { name: "ministral3", load: decoder::load, info: decoder::info },
    ModelType { name: "phi3", load: decoder::load, info: decoder::info },
    ModelType { name: "gemma3", load: decoder::load, info: decoder::info },
    ModelType { name: "gemma2", load: decoder::load, info: decoder::info },
    ModelType { name: "gpt_oss", load: decoder::load, info: decoder::info },
    ModelType { name: "smollm3", load: decoder::load, info: decoder::info },
    ModelType { name: "olmo2", load: decoder::load, info: decoder::info },
    ModelType { name: "granite", load: decoder::load, info: decoder::info },
    ModelType { name: "glm4_moe", load: decoder::load, info: decoder::info },
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
    // A GGUF architecture may be spelled otherwise than the family's name (`qwen3moe`).
    let name = crate::arch::find(&name).map_or(name, |a| a.name.to_string());
    let known = || MODEL_TYPES.iter().map(|t| t.name).collect::<Vec<_>>().join(", ");
    MODEL_TYPES.iter().find(|t| t.name == name).ok_or_else(|| match crate::arch::unsupported(&name) {
        Some(needs) => LoadError::UnsupportedArchitecture { name: name.clone(), needs, known: known() },
        None => LoadError::UnknownModelType { name: name.clone(), known: known() },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every family the decoder serves is a model type.
    #[test]
    fn every_architecture_is_registered() {
        for arch in crate::arch::ARCHITECTURES {
            assert!(MODEL_TYPES.iter().any(|t| t.name == arch.name), "{} has no registry entry", arch.name);
        }
    }
}
