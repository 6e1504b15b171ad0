//! The GGUF container (versions 2 and 3): a header, typed metadata key/value pairs, tensor
//! infos, then the aligned tensor data. The file is memory-mapped; every read is bounds-checked,
//! so a truncated or corrupt file is an error naming what was being read, never a panic, and no
//! count read from the file is trusted before the bytes it promises are known to be there.
//!
//! A model split by llama.cpp's `gguf-split` (`NAME-00001-of-00003.gguf`, ...) opens from its
//! first part: the metadata is the first part's, the tensors are every part's, each read from
//! its own part's map.

use std::collections::HashMap;
use std::fs::File;
use std::path::{Path, PathBuf};

use memmap2::{Mmap, UncheckedAdvice};

use crate::error::LoadError;
use crate::quant::{Foreign, QuantType, row_bytes};

/// A metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    U64(u64),
    I64(i64),
    F32(f32),
    F64(f64),
    Bool(bool),
    String(String),
    Array(Vec<Value>),
}

impl Value {
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::U8(v) => Some(v.into()),
            Value::U16(v) => Some(v.into()),
            Value::U32(v) => Some(v.into()),
            Value::U64(v) => Some(v),
            Value::I8(v) => u64::try_from(v).ok(),
            Value::I16(v) => u64::try_from(v).ok(),
            Value::I32(v) => u64::try_from(v).ok(),
            Value::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Value::I8(v) => Some(v.into()),
            Value::I16(v) => Some(v.into()),
            Value::I32(v) => Some(v.into()),
            Value::I64(v) => Some(v),
            _ => self.as_u64().and_then(|v| i64::try_from(v).ok()),
        }
    }
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v.into()),
            Value::F64(v) => Some(v),
            _ => self.as_i64().map(|v| v as f64),
        }
    }
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => None,
        }
    }
    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// A tensor's element type as GGUF stores it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TensorType {
    F32,
    F16,
    BF16,
    Quant(QuantType),
    /// A ggml type loaded converted to one the kernels run (`Foreign::target`).
    Foreign(Foreign),
    /// A ggml type llaisys does not load (its id).
    Other(u32),
}

impl TensorType {
    fn from_id(id: u32) -> Self {
        match id {
            0 => Self::F32,
            1 => Self::F16,
            30 => Self::BF16,
            id => QuantType::from_ggml_id(id)
                .map(Self::Quant)
                .or_else(|| Foreign::from_ggml_id(id).map(Self::Foreign))
                .unwrap_or(Self::Other(id)),
        }
    }

    /// ggml's name of the type.
    pub fn name(self) -> String {
        const OTHER: [(u32, &str); 11] = [
            (9, "Q8_1"),
            (15, "Q8_K"),
            (16, "IQ2_XXS"),
            (17, "IQ2_XS"),
            (18, "IQ3_XXS"),
            (19, "IQ1_S"),
            (21, "IQ3_S"),
            (22, "IQ2_S"),
            (29, "IQ1_M"),
            (34, "TQ1_0"),
            (35, "TQ2_0"),
        ];
        match self {
            Self::F32 => "F32".into(),
            Self::F16 => "F16".into(),
            Self::BF16 => "BF16".into(),
            Self::Quant(q) => q.name().into(),
            Self::Foreign(f) => f.name().into(),
            Self::Other(id) => {
                OTHER.iter().find(|(i, _)| *i == id).map_or(format!("type {id}"), |(_, n)| n.to_string())
            }
        }
    }

    /// Bytes of `values` elements in rows of `row` values; `None` for an unknown type or a row
    /// that is not a whole number of blocks.
    fn bytes(self, row: usize, values: usize) -> Option<usize> {
        let rows = values.checked_div(row)?;
        match self {
            Self::F32 => values.checked_mul(4),
            Self::F16 | Self::BF16 => values.checked_mul(2),
            Self::Quant(q) if q.fits_row(row) => rows.checked_mul(row_bytes(q, row)),
            Self::Foreign(f) if f.fits_row(row) => rows.checked_mul(row / f.block_values() * f.block_bytes()),
            _ => None,
        }
    }
}

impl std::fmt::Display for TensorType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())
    }
}

/// Where one tensor is.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    /// ggml's order: `dims[0]` is the length of a row (a weight [out, in] has dims [in, out]).
    pub dims: Vec<usize>,
    pub ty: TensorType,
    /// Absolute byte range in its part of the file (`None` for a type whose size is unknown here).
    range: Option<(usize, usize)>,
    /// Which part of a split file holds it (0 for an unsplit one).
    part: usize,
}

impl TensorInfo {
    /// The shape in row-major order, outermost first (a weight's [out, in]).
    pub fn shape(&self) -> Vec<usize> {
        self.dims.iter().rev().copied().collect()
    }
    pub fn n_values(&self) -> usize {
        self.dims.iter().product()
    }
    /// Bytes its data takes, when its type is known here.
    pub fn byte_len(&self) -> Option<usize> {
        self.range.map(|(start, end)| end - start)
    }
}

/// An open GGUF file (all its parts, if split).
pub struct GgufFile {
    path: PathBuf,
    /// Every part's path, the first first (one for an unsplit file).
    parts: Vec<PathBuf>,
    /// One map per part.
    maps: Vec<Mmap>,
    pub version: u32,
    metadata: HashMap<String, Value>,
    tensors: Vec<TensorInfo>,
    /// Per tensor, its name as the decoder knows it, or `None` for one it does not read
    /// (`GgufFile::served`, made at first use).
    pub(super) served: std::sync::OnceLock<Vec<Option<String>>>,
}

const MAGIC: &[u8; 4] = b"GGUF";
/// Nested arrays deeper than this are refused (no real file nests at all).
const MAX_DEPTH: usize = 4;

impl GgufFile {
    /// Opens a GGUF file; a split one from its first part, with the others beside it.
    pub fn open(path: &Path) -> Result<Self, LoadError> {
        let (mmap, (version, metadata, mut tensors)) = open_part(path)?;
        let error = |reason: String| LoadError::Gguf { path: path.into(), reason };
        let split = Split::of(&metadata).map_err(error)?;
        let mut maps = vec![mmap];
        let mut parts = vec![path.to_path_buf()];
        if let Some(split) = split.filter(|s| s.count > 1) {
            if split.no != 0 {
                return Err(error(format!(
                    "this is part {} of {} of a split model; open its first part (…-00001-of-{:05}.gguf)",
                    split.no + 1,
                    split.count,
                    split.count
                )));
            }
            let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
            let prefix = match split_part(&name) {
                Some((prefix, 1, count)) if count == split.count => prefix,
                _ => {
                    let want = split_name("NAME", 1, split.count);
                    return Err(error(format!("the first of {} parts of a split model is named {want}", split.count)));
                }
            };
            for part in 1..split.count {
                let sibling = path.with_file_name(split_name(prefix, part + 1, split.count));
                let (mmap, (_, meta, more)) = open_part(&sibling)?;
                let theirs = Split::of(&meta).map_err(|reason| LoadError::Gguf { path: sibling.clone(), reason })?;
                if theirs.is_none_or(|s| s.no != part || s.count != split.count) {
                    let reason = format!("is not part {} of {} of {}", part + 1, split.count, path.display());
                    return Err(LoadError::Gguf { path: sibling, reason });
                }
                tensors.extend(more.into_iter().map(|t| TensorInfo { part, ..t }));
                maps.push(mmap);
                parts.push(sibling);
            }
            if tensors.len() != split.tensors {
                return Err(error(format!(
                    "its {} parts hold {} tensors; the first part says {}",
                    split.count,
                    tensors.len(),
                    split.tensors
                )));
            }
        }
        Ok(Self { path: path.into(), parts, maps, version, metadata, tensors, served: Default::default() })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Every part's path, the first first (the file's own path when it is not split).
    pub fn parts(&self) -> &[PathBuf] {
        &self.parts
    }

    /// The whole file's type as llama.cpp names it (`general.file_type`: `Q4_K_M`), if known.
    pub fn file_type(&self) -> Option<&'static str> {
        const FILE_TYPES: [(u64, &str); 20] = [
            (0, "F32"),
            (1, "F16"),
            (2, "Q4_0"),
            (3, "Q4_1"),
            (7, "Q8_0"),
            (8, "Q5_0"),
            (9, "Q5_1"),
            (10, "Q2_K"),
            (11, "Q3_K_S"),
            (12, "Q3_K_M"),
            (13, "Q3_K_L"),
            (14, "Q4_K_S"),
            (15, "Q4_K_M"),
            (16, "Q5_K_S"),
            (17, "Q5_K_M"),
            (18, "Q6_K"),
            (25, "IQ4_NL"),
            (30, "IQ4_XS"),
            (32, "BF16"),
            (38, "MXFP4_MOE"),
        ];
        let id = self.get("general.file_type")?.as_u64()?;
        FILE_TYPES.iter().find(|(i, _)| *i == id).map(|(_, name)| *name)
    }
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.get(key)
    }
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.metadata.keys().map(String::as_str)
    }
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// An error about this file.
    pub fn error(&self, reason: impl Into<String>) -> LoadError {
        LoadError::Gguf { path: self.path.clone(), reason: reason.into() }
    }

    /// The tensor's bytes, in place in the map.
    pub fn bytes(&self, t: &TensorInfo) -> Result<&[u8], LoadError> {
        let (start, end) = t.range.ok_or_else(|| self.unsupported(t))?;
        Ok(&self.maps[t.part][start..end])
    }

    /// The error for a tensor whose type does not load.
    pub fn unsupported(&self, t: &TensorInfo) -> LoadError {
        self.error(format!(
            "tensor `{}` has type {}, which llaisys does not load ({})",
            t.name,
            t.ty,
            crate::quant::loadable_types()
        ))
    }

    /// Drops the tensor's pages from this process's memory once its bytes have been copied into
    /// the model (they stay in the page cache): loading then holds the model plus one tensor,
    /// not the model plus the file.
    pub fn release(&self, t: &TensorInfo) {
        let Some((start, end)) = t.range else { return };
        let page = 4096;
        let (start, end) = (start.next_multiple_of(page), end / page * page);
        if end > start {
            // SAFETY: the map is a shared, read-only file mapping: after MADV_DONTNEED its pages
            // read the file's contents again, so nothing a borrow could see changes. The
            // caller holds no borrow of this tensor's bytes any more.
            #[allow(unsafe_code)]
            let _ = unsafe { self.maps[t.part].unchecked_advise_range(UncheckedAdvice::DontNeed, start, end - start) };
        }
    }
}

/// The file name `gguf-split` gives part `no` (from 1) of `count`: `PREFIX-00002-of-00003.gguf`.
pub fn split_name(prefix: &str, no: usize, count: usize) -> String {
    format!("{prefix}-{no:05}-of-{count:05}.gguf")
}

/// A split part's file name read back: its prefix, part number (from 1) and count.
pub fn split_part(file_name: &str) -> Option<(&str, usize, usize)> {
    let stem = file_name.strip_suffix(".gguf").or_else(|| file_name.strip_suffix(".GGUF"))?;
    let (rest, count) = stem.rsplit_once("-of-")?;
    let (prefix, no) = rest.rsplit_once('-')?;
    let number = |s: &str| (s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit())).then(|| s.parse::<usize>().ok())?;
    let (no, count) = (number(no)?, number(count)?);
    (1..=count).contains(&no).then_some((prefix, no, count))
}

/// One part of a file, mapped and parsed.
fn open_part(path: &Path) -> Result<(Mmap, Parsed), LoadError> {
    let io = |source| LoadError::Io { path: path.into(), source };
    let file = File::open(path).map_err(io)?;
    // SAFETY: the map is read-only and lives as long as `GgufFile`. Another process changing
    // the file while it is mapped could change the bytes read (wrong weights) but not break
    // memory safety here: every read is bounds-checked against the map's length and the
    // bytes are copied out (never reinterpreted as references).
    #[allow(unsafe_code)]
    let mmap = unsafe { Mmap::map(&file) }.map_err(io)?;
    let parsed = parse(&mmap).map_err(|reason| LoadError::Gguf { path: path.into(), reason })?;
    Ok((mmap, parsed))
}

/// `gguf-split`'s keys: this part's index, the number of parts, the tensors in all of them.
struct Split {
    no: usize,
    count: usize,
    tensors: usize,
}

impl Split {
    fn of(metadata: &HashMap<String, Value>) -> Result<Option<Self>, String> {
        let Some(count) = metadata.get("split.count") else { return Ok(None) };
        let number = |key: &str| {
            let value = metadata.get(key).ok_or_else(|| format!("corrupt: split.count without {key}"))?;
            let n = value.as_u64().ok_or_else(|| format!("corrupt: {key} is not a count"))?;
            usize::try_from(n).map_err(|_| format!("corrupt: {key} is {n}"))
        };
        let count =
            count.as_u64().filter(|&c| (1..=9999).contains(&c)).ok_or("corrupt: split.count is not 1 to 9999")?;
        let split = Self { no: number("split.no")?, count: count as usize, tensors: number("split.tensors.count")? };
        if split.no >= split.count {
            return Err(format!("corrupt: split.no is {} of {} parts", split.no, split.count));
        }
        Ok(Some(split))
    }
}

/// A bounds-checked reader over the file's bytes.
struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], String> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len()).ok_or_else(|| {
            format!("truncated: {what} needs {n} bytes at offset {}, the file has {}", self.at, self.bytes.len())
        })?;
        let s = &self.bytes[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], String> {
        Ok(self.take(N, what)?.try_into().expect("took N bytes"))
    }
    fn u32(&mut self, what: &str) -> Result<u32, String> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }
    fn u64(&mut self, what: &str) -> Result<u64, String> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }
    /// A count of items each at least `min_item` bytes long: refused if the rest of the file
    /// could not hold them.
    fn count(&mut self, min_item: usize, what: &str) -> Result<usize, String> {
        let n = self.u64(what)?;
        let left = (self.bytes.len() - self.at) as u64;
        if n.saturating_mul(min_item as u64) > left {
            return Err(format!("truncated or corrupt: {what} is {n}, more than the {left} bytes left can hold"));
        }
        Ok(n as usize)
    }
    fn string(&mut self, what: &str) -> Result<String, String> {
        let n = self.count(1, what)?;
        let bytes = self.take(n, what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| format!("corrupt: {what} is not UTF-8"))
    }
    fn value(&mut self, ty: u32, what: &str, depth: usize) -> Result<Value, String> {
        Ok(match ty {
            0 => Value::U8(self.array::<1>(what)?[0]),
            1 => Value::I8(self.array::<1>(what)?[0] as i8),
            2 => Value::U16(u16::from_le_bytes(self.array(what)?)),
            3 => Value::I16(i16::from_le_bytes(self.array(what)?)),
            4 => Value::U32(self.u32(what)?),
            5 => Value::I32(i32::from_le_bytes(self.array(what)?)),
            6 => Value::F32(f32::from_le_bytes(self.array(what)?)),
            7 => match self.array::<1>(what)?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                b => return Err(format!("corrupt: {what} is a bool of value {b}")),
            },
            8 => Value::String(self.string(what)?),
            9 => {
                if depth >= MAX_DEPTH {
                    return Err(format!("corrupt: {what} nests arrays more than {MAX_DEPTH} deep"));
                }
                let elem = self.u32(what)?;
                let n = self.count(1, what)?;
                let mut items = Vec::with_capacity(n.min(1 << 20));
                for _ in 0..n {
                    items.push(self.value(elem, what, depth + 1)?);
                }
                Value::Array(items)
            }
            10 => Value::U64(self.u64(what)?),
            11 => Value::I64(i64::from_le_bytes(self.array(what)?)),
            12 => Value::F64(f64::from_le_bytes(self.array(what)?)),
            t => return Err(format!("corrupt: {what} has unknown value type {t}")),
        })
    }
}

type Parsed = (u32, HashMap<String, Value>, Vec<TensorInfo>);

fn parse(bytes: &[u8]) -> Result<Parsed, String> {
    let mut c = Cursor { bytes, at: 0 };
    if c.take(4, "the magic number").map_err(|_| "not a GGUF file (too short)".to_string())? != MAGIC {
        return Err("not a GGUF file (no GGUF magic number)".into());
    }
    let version = c.u32("the version")?;
    if !(2..=3).contains(&version) {
        return Err(format!("GGUF version {version} is not supported (2 and 3 are)"));
    }
    let n_tensors = c.count(24, "the tensor count")?;
    let n_kv = c.count(12, "the metadata count")?;
    let mut metadata = HashMap::with_capacity(n_kv);
    for i in 0..n_kv {
        let key = c.string(&format!("metadata key {i}"))?;
        let ty = c.u32(&format!("the type of `{key}`"))?;
        let value = c.value(ty, &format!("`{key}`"), 0)?;
        if metadata.insert(key.clone(), value).is_some() {
            return Err(format!("corrupt: metadata key `{key}` appears twice"));
        }
    }
    let alignment = match metadata.get("general.alignment") {
        None => 32,
        Some(v) => {
            v.as_u64().filter(|a| a.is_power_of_two()).ok_or("corrupt: general.alignment is not a power of two")?
                as usize
        }
    };
    let mut infos = Vec::with_capacity(n_tensors);
    for i in 0..n_tensors {
        let name = c.string(&format!("the name of tensor {i}"))?;
        let what = format!("tensor `{name}`");
        let n_dims = c.u32(&what)? as usize;
        if n_dims == 0 || n_dims > 4 {
            return Err(format!("corrupt: {what} has {n_dims} dimensions"));
        }
        let mut dims = Vec::with_capacity(n_dims);
        for _ in 0..n_dims {
            dims.push(usize::try_from(c.u64(&what)?).map_err(|_| format!("corrupt: {what} is too large"))?);
        }
        let ty = TensorType::from_id(c.u32(&what)?);
        let offset = c.u64(&what)?;
        infos.push((name, dims, ty, offset));
    }
    let data_start = c.at.next_multiple_of(alignment);
    let mut tensors = Vec::with_capacity(n_tensors);
    for (name, dims, ty, offset) in infos {
        let n_values = dims.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
        let n_values = n_values.ok_or_else(|| format!("corrupt: tensor `{name}` has dimensions {dims:?}"))?;
        let range = match ty.bytes(dims[0], n_values) {
            None if !matches!(ty, TensorType::Other(_)) => {
                return Err(format!(
                    "tensor `{name}` ({ty}): a row of {} values is not a whole number of blocks",
                    dims[0]
                ));
            }
            None => None,
            Some(len) => {
                let start = usize::try_from(offset).ok().and_then(|o| data_start.checked_add(o));
                let end = start.and_then(|s| s.checked_add(len));
                match (start, end) {
                    (Some(s), Some(e)) if e <= bytes.len() => Some((s, e)),
                    _ => {
                        return Err(format!(
                            "truncated: tensor `{name}` needs bytes up to offset {} of the data, the file has {}",
                            offset.saturating_add(len as u64),
                            bytes.len().saturating_sub(data_start)
                        ));
                    }
                }
            }
        };
        tensors.push(TensorInfo { name, dims, ty, range, part: 0 });
    }
    Ok((version, metadata, tensors))
}
