//! Q1: where a model's files are. A Hugging Face directory (config.json, safetensors,
//! tokenizer.json, tokenizer_config.json) or one GGUF file that carries all of it (and, for a
//! model that sees images, llama.cpp's projector file beside it: `mmproj`); everything that reads
//! a model (weights, tokenizer, chat template, architecture) starts from here.

use std::path::{Path, PathBuf};

use crate::config::read_json;
use crate::error::LoadError;
use crate::gguf::{self, GgufFile};
use crate::tokenizer::{ChatTemplate, Tokenizer};

/// What a model's weight files hold, as a model list shows it (Ollama's `/api/tags`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileSummary {
    /// `gguf` or `safetensors`.
    pub format: &'static str,
    /// The weight files, in order (a split GGUF's parts, a checkpoint's shards).
    pub files: Vec<PathBuf>,
    /// Their size in bytes.
    pub bytes: u64,
    /// Values in all tensors.
    pub parameters: u64,
    /// The file's type as llama.cpp names it (`Q4_K_M`), else the type most of the tensors'
    /// bytes have (`BF16`).
    pub quantization: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelSource {
    /// A Hugging Face model directory.
    Dir(PathBuf),
    /// A GGUF file (the first part of a split one), and the projector file of its vision tower
    /// (llama.cpp's `--mmproj`), where it sees images.
    Gguf { path: PathBuf, mmproj: Option<PathBuf> },
}

impl ModelSource {
    /// A GGUF file without a projector.
    pub fn gguf(path: impl Into<PathBuf>) -> Self {
        Self::Gguf { path: path.into(), mmproj: None }
    }

    /// `path` is a `.gguf` file, a Hugging Face directory, or a directory holding exactly one
    /// model's `.gguf` file, or the parts of one split model (and no config.json), and at most one
    /// projector file (llama.cpp's `mmproj-*.gguf`, told by its `clip` architecture), which it
    /// takes as the model's.
    pub fn resolve(path: &Path) -> Result<Self, LoadError> {
        let io = |source| LoadError::Io { path: path.into(), source };
        let meta = std::fs::metadata(path).map_err(io)?;
        if meta.is_file() {
            return Ok(Self::gguf(path));
        }
        if path.join("config.json").exists() {
            return Ok(Self::Dir(path.into()));
        }
        let mut ggufs = Vec::new();
        let mut projectors = Vec::new();
        for entry in std::fs::read_dir(path).map_err(io)? {
            let p = entry.map_err(io)?.path();
            if p.extension().is_some_and(|e| e.eq_ignore_ascii_case("gguf")) && p.is_file() {
                match is_projector(&p) {
                    true => projectors.push(p),
                    false => ggufs.push(p),
                }
            }
        }
        projectors.sort();
        let mmproj = match projectors.len() {
            0 | 1 => projectors.pop(),
            n => {
                return Err(LoadError::NotAModel {
                    path: path.into(),
                    reason: format!("{n} projector (mmproj) files; name the one to load with --mmproj"),
                });
            }
        };
        Self::model_file(path, ggufs)?.with_mmproj(mmproj)
    }

    /// The projector file `mmproj` for this GGUF model (none: as it is); a Hugging Face directory
    /// carries its own tower and takes none.
    pub fn with_mmproj(self, mmproj: Option<PathBuf>) -> Result<Self, LoadError> {
        match (self, mmproj) {
            (source, None) => Ok(source),
            (Self::Gguf { path, .. }, Some(mmproj)) => {
                let file = GgufFile::open(&mmproj)?;
                match gguf::architecture(&file)?.as_str() {
                    "clip" => Ok(Self::Gguf { path, mmproj: Some(mmproj) }),
                    arch => {
                        Err(file
                            .error(format!("not a projector (mmproj) file: its architecture is `{arch}`, not `clip`")))
                    }
                }
            }
            (Self::Dir(dir), Some(_)) => Err(LoadError::NotAModel {
                path: dir,
                reason:
                    "a projector (mmproj) file goes with a GGUF model; a Hugging Face directory holds its own tower"
                        .into(),
            }),
        }
    }

    /// The one model among a directory's `.gguf` files.
    fn model_file(path: &Path, mut ggufs: Vec<PathBuf>) -> Result<Self, LoadError> {
        // The parts of one split model: its first.
        let parts: Vec<_> = ggufs.iter().filter_map(|p| gguf::split_part(p.file_name()?.to_str()?)).collect();
        if let Some(&(prefix, _, count)) = parts.first()
            && parts.len() == ggufs.len()
            && count == ggufs.len()
            && parts.iter().all(|&(p, _, c)| p == prefix && c == count)
        {
            return Ok(Self::gguf(path.join(gguf::split_name(prefix, 1, count))));
        }
        match ggufs.len() {
            1 => Ok(Self::gguf(ggufs.remove(0))),
            0 => Err(LoadError::NotAModel { path: path.into(), reason: "no config.json and no .gguf file".into() }),
            n => Err(LoadError::NotAModel {
                path: path.into(),
                reason: format!("{n} .gguf files; name the one to load"),
            }),
        }
    }

    pub fn path(&self) -> &Path {
        match self {
            Self::Dir(p) | Self::Gguf { path: p, .. } => p,
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
            Self::Gguf { path, .. } => gguf::model_type(&GgufFile::open(path)?),
        }
    }

    pub fn tokenizer(&self) -> Result<Tokenizer, LoadError> {
        match self {
            Self::Dir(dir) => Tokenizer::from_dir(dir),
            Self::Gguf { path, .. } => gguf::tokenizer(&GgufFile::open(path)?),
        }
    }

    /// The chat template, `None` if the model has none.
    pub fn chat_template(&self) -> Result<Option<ChatTemplate>, LoadError> {
        match self {
            Self::Dir(dir) => ChatTemplate::from_dir(dir),
            Self::Gguf { path, .. } => gguf::chat_template(&GgufFile::open(path)?),
        }
    }

    /// The weight files' summary: format, size, parameters, quantization.
    pub fn summary(&self) -> Result<FileSummary, LoadError> {
        // (values, bytes, type) of each tensor.
        let (format, files, sizes, file_type): (_, _, Vec<(usize, usize, String)>, _) = match self {
            Self::Gguf { path, .. } => {
                let file = GgufFile::open(path)?;
                let sizes =
                    file.tensors().iter().map(|t| (t.n_values(), t.byte_len().unwrap_or(0), t.ty.name())).collect();
                ("gguf", file.parts().to_vec(), sizes, file.file_type())
            }
            Self::Dir(dir) => {
                let checkpoint = crate::checkpoint::Checkpoint::open(dir)?;
                ("safetensors", checkpoint.files(), checkpoint.sizes().collect(), None)
            }
        };
        let mut bytes = 0;
        for file in &files {
            bytes += std::fs::metadata(file).map_err(|source| LoadError::Io { path: file.clone(), source })?.len();
        }
        let mut by_type: Vec<(String, usize)> = Vec::new();
        for (_, size, ty) in &sizes {
            match by_type.iter_mut().find(|(t, _)| t == ty) {
                Some((_, total)) => *total += size,
                None => by_type.push((ty.clone(), *size)),
            }
        }
        let dominant = by_type.iter().max_by_key(|(_, size)| *size).map(|(t, _)| t.clone()).unwrap_or_default();
        Ok(FileSummary {
            format,
            files,
            bytes,
            parameters: sizes.iter().map(|(n, _, _)| *n as u64).sum(),
            quantization: file_type.map_or(dominant, str::to_string),
        })
    }

    /// The directory's `generation_config.json`, if it has one (a GGUF carries none).
    pub fn generation_config(&self) -> Option<PathBuf> {
        match self {
            Self::Dir(dir) => Some(dir.join("generation_config.json")).filter(|p| p.exists()),
            Self::Gguf { .. } => None,
        }
    }
}

/// Whether `path` is llama.cpp's projector file (`general.architecture` `clip`): a vision
/// tower, not a language model. A file that does not open is not one (its opening as a model
/// says why).
fn is_projector(path: &Path) -> bool {
    GgufFile::open(path).is_ok_and(|f| gguf::architecture(&f).is_ok_and(|a| a == "clip"))
}
