//! C2: model types by name. Every family of `crate::arch` loads through the shared decoder, so
//! adding a family is a file of tables in `arch/` and its entry in `arch::ARCHITECTURES`; other
//! model types (the mock) are listed here.

use std::path::PathBuf;

use burn::tensor::Device;

use crate::adapter::Lora;
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
    /// LoRA adapters merged into the weights as they load, in order (`crate::adapter`).
    pub adapters: Vec<Lora>,
}

impl Default for LoadOptions {
    fn default() -> Self {
        let off = std::env::var("LLAISYS_GPU_GRAPHS").is_ok_and(|v| matches!(v.as_str(), "off" | "0"));
        Self { weight_dtype: WeightDtype::default(), step_graphs: !off, imatrix: None, adapters: Vec::new() }
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

/// Model types besides the families of `crate::arch::ARCHITECTURES`, which all load through
/// the shared decoder.
pub const MODEL_TYPES: &[ModelType] = &[ModelType { name: "mock", load: mock::load, info: mock::info }];

/// Loads a model of type `model_type`, or of the type `source` names when `None`.
pub fn load_model(
    model_type: Option<&str>,
    source: Option<&ModelSource>,
    opts: &LoadOptions,
    device: &Device,
) -> Result<Box<dyn LanguageModel>, LoadError> {
    (model_type_of(model_type, source)?.0)(source, opts, device)
}

/// The info of the model `load_model` would load, read from its configuration only (a
/// cluster's router-only front needs the vocabulary and context, not the weights).
pub fn model_info(model_type: Option<&str>, source: Option<&ModelSource>) -> Result<ModelInfo, LoadError> {
    (model_type_of(model_type, source)?.1)(source)
}

fn model_type_of(model_type: Option<&str>, source: Option<&ModelSource>) -> Result<(LoadFn, InfoFn), LoadError> {
    let name = match (model_type, source) {
        (Some(name), _) => name.to_string(),
        (None, Some(source)) => source.model_type()?,
        (None, None) => {
            return Err(LoadError::NeedsDirectory { model_type: "(unspecified)" });
        }
    };
    // A family, by its name or its GGUF architecture's (`qwen3moe`).
    if crate::arch::find(&name).is_some() {
        return Ok((decoder::load, decoder::info));
    }
    let known = || {
        let families = crate::arch::ARCHITECTURES.iter().map(|a| a.name);
        families.chain(MODEL_TYPES.iter().map(|t| t.name)).collect::<Vec<_>>().join(", ")
    };
    let other = MODEL_TYPES.iter().find(|t| t.name == name).map(|t| (t.load, t.info));
    other.ok_or_else(|| match crate::arch::unsupported(&name) {
        Some(needs) => LoadError::UnsupportedArchitecture { name: name.clone(), needs, known: known() },
        None => LoadError::UnknownModelType { name: name.clone(), known: known() },
    })
}
