//! llaisys-model: the synchronous model core. Config (C1), model registry (C2), weights (C3) from
//! safetensors or GGUF files (Q1), quantized weights and their kernels (Q2–Q5), batches (C4), the
//! forward pass (C5), the slot/cell KV cache (C6), outputs (C7), errors (C8), tokenizer (C10). No tokio, no actors: the engine drives a [`Context`] from its worker.

pub mod adapter;
pub mod arch;
pub mod batch;
pub mod checkpoint;
pub mod config;
pub mod context;
pub mod decoder;
pub mod device;
pub mod error;
pub mod generate;
pub mod gguf;
pub mod grammar;
pub mod kernels;
pub mod kv;
pub mod launches;
pub mod layers;
pub mod lm;
pub mod mock;
pub mod output;
pub mod quant;
pub mod registry;
pub mod sampling;
pub mod source;
pub mod tensors;
pub mod tokenizer;
pub mod transfers;
pub mod vision;

pub use batch::{Batch, BatchInput, Embedded};
pub use burn::tensor::{Device, Tensor, TensorData};
pub use config::ModelConfig;
pub use context::Context;
pub use device::{DeviceError, DeviceSpec, DeviceStream};
pub use error::{DecodeError, KvError, LoadError};
pub use grammar::{
    ArgTag, ArgTags, CallSyntax, CallTags, Constraint, Grammar, GrammarCompiler, GrammarError, Guidance, GuidanceSpec,
    GuideEnd, HarmonyTags, ThinkStart, Thinking, ToolCallTags,
};
pub use kv::{KvCache, KvDtype, Pos, PosRange, SeqId};
pub use lm::{LanguageModel, ModelInfo, Pooling, Readout};
pub use output::{Outputs, RowAsk, RowNeed, argmax, top_logits};
pub use registry::{LoadOptions, MODEL_TYPES, load_model, model_info};
pub use sampling::{Sampled, Sampler, SamplingParams};
pub use source::{FileSummary, ModelSource};
pub use tensors::WeightDtype;
pub use tokenizer::Tokenizer;
pub use vision::{Image, ImageError, ImageProcessor, VisionInfo};
