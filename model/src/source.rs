//! Q1: where a model's files are. A Hugging Face directory (config.json, safetensors,
//! tokenizer.json, tokenizer_config.json) or one GGUF file that carries all of it; everything
//! that reads a model (weights, tokenizer, chat template, architecture) starts from here.

use std::path::{Path, PathBuf};

use crate::config::read_json;
use crate::error::LoadError;
use crate::gguf::{self, GgufFile};
use crate::tokenizer::{ChatTemplate, Tokenizer};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelSource {
    /// A Hugging Face model directory.
    Dir(PathBuf),
    /// A GGUF file.
    Gguf(PathBuf),
}

impl ModelSource {
    /// `path` is a `.gguf` file, a Hugging Face directory, or a directory holding exactly one
    /// `.gguf` file, or the parts of one split model (and no config.json).
    pub fn resolve(path: &Path) -> Result<Self, LoadError> {
        let io = |source| LoadError::Io { path: path.into(), source };
        let meta = std::fs::metadata(path).map_err(io)?;
        if meta.is_file() {
            return Ok(Self::Gguf(path.into()));
        }
        if path.join("config.json").exists() {
            return Ok(Self::Dir(path.into()));
        }
        let mut ggufs = Vec::new();
        for entry in std::fs::read_dir(path).map_err(io)? {
            let p = entry.map_err(io)?.path();
            if p.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf")) && p.is_file() {
                ggufs.push(p);
            }
        }
        // The parts of one split model: its first.
        let parts: Vec<_> = ggufs.iter().filter_map(|p| gguf::split_part(p.file_name()?.to_str()?)).collect();
        if let Some(&(prefix, _, count)) = parts.first()
            && parts.len() == ggufs.len()
            && count == ggufs.len()
            && parts.iter().all(|&(p, _, c)| p == prefix && c == count)
        {
            return Ok(Self::Gguf(path.join(gguf::split_name(prefix, 1, count))));
        }
        match ggufs.len() {
            1 => Ok(Self::Gguf(ggufs.remove(0))),
            0 => Err(LoadError::NotAModel { path: path.into(), reason: "no config.json and no .gguf file".into() }),
            n => Err(LoadError::NotAModel {
                path: path.into(),
                reason: format!("{n} .gguf files; name the one to load"),
            }),
        }
    }

    pub fn path(&self) -> &Path {
        match self {
            Self::Dir(p) | Self::Gguf(p) => p,
        }
    }

    /// The model type: `model_type` of config.json, or the GGUF's `general.architecture`.
    pub fn model_type(&self) -> Result<String, LoadError> {
        match self {
            Self::Dir(dir) => {
                let json = read_json(&dir.join("config.json"))?;
                json.get("model_type").and_then(|v| v.as_str()).map(str::to_owned).ok_or_else(|| LoadError::Config {
                    field: "model_type".into(),
                    reason: "missing: pass the model type explicitly".into(),
                })
            }
            Self::Gguf(path) => gguf::architecture(&GgufFile::open(path)?),
        }
    }

    pub fn tokenizer(&self) -> Result<Tokenizer, LoadError> {
        match self {
            Self::Dir(dir) => Tokenizer::from_dir(dir),
            Self::Gguf(path) => gguf::tokenizer(&GgufFile::open(path)?),
        }
    }

    /// The chat template, `None` if the model has none.
    pub fn chat_template(&self) -> Result<Option<ChatTemplate>, LoadError> {
        match self {
            Self::Dir(dir) => ChatTemplate::from_dir(dir),
            Self::Gguf(path) => gguf::chat_template(&GgufFile::open(path)?),
        }
    }

    /// The directory's `generation_config.json`, if it has one (a GGUF carries none).
    pub fn generation_config(&self) -> Option<PathBuf> {
        match self {
            Self::Dir(dir) => Some(dir.join("generation_config.json")).filter(|p| p.exists()),
            Self::Gguf(_) => None,
        }
    }
}
