//! Importance matrices as llama.cpp's `llama-imatrix` writes them: for each weight matrix (by its
//! GGUF name), the mean square of the activations each input column met over a calibration text.
//! Quantizing at load weights each column's error by it (`quantize_weighted`), as
//! `llama-quantize --imatrix` does.
//!
//! Two file formats: GGUF (llama.cpp's default since 2025: tensors `NAME.in_sum2`, the sums of
//! squares, and `NAME.counts`, how many activations each expert's sums hold) and the older
//! `.dat` (a count of entries, then per entry its name, the number of calls, and the values
//! already divided by the calls' chunks, as `i32` lengths and `f32` values, little-endian).

use std::collections::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use crate::error::LoadError;
use crate::gguf::{GgufFile, TensorType};

/// An importance matrix: per GGUF tensor name, one value per input column (per expert, one after
/// another, for a tensor of experts).
#[derive(Debug, Clone, Default)]
pub struct Imatrix {
    path: PathBuf,
    entries: HashMap<String, Vec<f32>>,
}

impl Imatrix {
    /// Reads a GGUF or `.dat` importance matrix.
    pub fn open(path: &Path) -> Result<Self, LoadError> {
        let io = |source| LoadError::Io { path: path.into(), source };
        let mut magic = Vec::with_capacity(4);
        std::fs::File::open(path).and_then(|f| f.take(4).read_to_end(&mut magic)).map_err(io)?;
        let is_gguf = magic == b"GGUF";
        // A GGUF file is memory-mapped by its reader; only a .dat file is read whole.
        let entries =
            if is_gguf { from_gguf(&GgufFile::open(path)?) } else { from_dat(&std::fs::read(path).map_err(io)?) };
        let bad = |reason: String| LoadError::Gguf { path: path.into(), reason };
        let entries = entries.map_err(bad)?;
        if entries.is_empty() {
            return Err(bad("the importance matrix has no entries".into()));
        }
        if let Some((name, _)) = entries.iter().find(|(_, v)| v.iter().any(|x| !x.is_finite() || *x < 0.0)) {
            return Err(bad(format!("the importance of `{name}` holds a negative or non-finite value")));
        }
        Ok(Self { path: path.into(), entries })
    }

    /// The file it was read from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// How many matrices it has importances for.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The importances of matrix `name` (its GGUF name: `blk.0.attn_q.weight`), if it has them.
    pub fn get(&self, name: &str) -> Option<&[f32]> {
        self.entries.get(name).map(Vec::as_slice)
    }

    /// The names of the matrices it has importances for.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries.keys().map(String::as_str)
    }

    /// The importances of one matrix of `experts` experts, one expert after another, from entries
    /// made an expert at a time (`name(e)` expert e's: llama.cpp named them so on a file with one
    /// tensor per expert, before it stacked them), ones for an expert without an entry (no
    /// calibration token reached it; llama.cpp takes an expert without counts so). `None` where
    /// it has an entry for none of them.
    pub fn per_expert(&self, name: impl Fn(usize) -> String, experts: usize) -> Option<Vec<f32>> {
        let each: Vec<Option<&[f32]>> = (0..experts).map(|e| self.get(&name(e))).collect();
        let k = each.iter().flatten().next()?.len();
        Some(each.into_iter().flat_map(|v| v.map_or_else(|| vec![1.0; k], <[f32]>::to_vec)).collect())
    }
}

/// GGUF: `NAME.in_sum2` divided by `NAME.counts`, each expert's run of sums by its count (a
/// count of 0, an expert no token reached, gives ones, as llama.cpp does).
fn from_gguf(file: &GgufFile) -> Result<HashMap<String, Vec<f32>>, String> {
    let f32s = |name: &str| -> Result<Option<Vec<f32>>, String> {
        let Some(t) = file.tensor(name) else { return Ok(None) };
        if t.ty != TensorType::F32 {
            return Err(format!("`{name}` is {}, not F32", t.ty));
        }
        let bytes = file.bytes(t).map_err(|e| e.to_string())?;
        Ok(Some(bytes.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect()))
    };
    let mut entries = HashMap::new();
    for t in file.tensors() {
        let Some(name) = t.name.strip_suffix(".in_sum2") else { continue };
        let sums = f32s(&t.name)?.unwrap_or_default();
        let counts = f32s(&format!("{name}.counts"))?.ok_or_else(|| format!("`{name}` has sums but no counts"))?;
        if counts.is_empty() || sums.is_empty() || !sums.len().is_multiple_of(counts.len()) {
            return Err(format!("`{name}`: {} sums for {} counts", sums.len(), counts.len()));
        }
        let per = sums.len() / counts.len();
        let values = sums
            .chunks_exact(per)
            .zip(&counts)
            .flat_map(|(sums, &count)| {
                let count = count.round();
                sums.iter().map(move |&s| if count > 0.0 { s / count } else { 1.0 })
            })
            .collect();
        entries.insert(name.to_string(), values);
    }
    Ok(entries)
}

/// The `.dat` format: the values divided by their number of calls.
fn from_dat(bytes: &[u8]) -> Result<HashMap<String, Vec<f32>>, String> {
    let mut r = Reader { bytes, at: 0 };
    let n = r.i32()?;
    if n < 1 {
        return Err(format!("not a GGUF file, nor an imatrix .dat file ({n} entries)"));
    }
    let mut entries = HashMap::new();
    for _ in 0..n {
        let len = usize::try_from(r.i32()?).map_err(|_| "a negative name length")?;
        let name = String::from_utf8(r.take(len)?.to_vec()).map_err(|_| "a name that is not UTF-8")?;
        let calls = r.i32()?;
        let values = usize::try_from(r.i32()?).ok().filter(|&v| v > 0).ok_or(format!("`{name}` has no values"))?;
        let raw = r.take(values.checked_mul(4).ok_or("a length overflows")?)?;
        let divide = if calls > 0 { calls as f32 } else { 1.0 };
        let values = raw.chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]) / divide).collect();
        entries.insert(name, values);
    }
    Ok(entries)
}

/// Little-endian fields read in order, each checked against the end.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8], String> {
        let end = self.at.checked_add(n).filter(|&end| end <= self.bytes.len()).ok_or_else(|| {
            format!(
                "not a GGUF file, and truncated as an imatrix .dat file at byte {} ({} bytes)",
                self.at,
                self.bytes.len()
            )
        })?;
        let piece = &self.bytes[self.at..end];
        self.at = end;
        Ok(piece)
    }

    fn i32(&mut self) -> Result<i32, String> {
        self.take(4).map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
}

#[cfg(test)]
mod tests {
    use llaisys_tests::imatrix_dat as dat;

    use super::*;

    #[test]
    fn dat_files_divide_by_their_calls_and_truncation_is_an_error() {
        let bytes = dat::<_, &[f32]>(&[("blk.0.attn_q.weight", 4, &[4.0, 8.0]), ("blk.0.ffn_down.weight", 0, &[3.0])]);
        let m = from_dat(&bytes).unwrap();
        assert_eq!(m["blk.0.attn_q.weight"], [1.0, 2.0]);
        assert_eq!(m["blk.0.ffn_down.weight"], [3.0]);
        for cut in 0..bytes.len() {
            assert!(from_dat(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        assert!(from_dat(&dat::<_, &[f32]>(&[("x", 1, &[])])).is_err());
    }

    #[test]
    fn experts_made_one_at_a_time_read_one_after_another_with_ones_for_an_expert_never_reached() {
        let bytes = dat(&[("blk.0.ffn_up.0.weight", 1, [2.0, 3.0]), ("blk.0.ffn_up.2.weight", 2, [8.0, 6.0])]);
        let m = Imatrix { path: "x.dat".into(), entries: from_dat(&bytes).unwrap() };
        let name = |e: usize| format!("blk.0.ffn_up.{e}.weight");
        assert_eq!(m.per_expert(name, 3).unwrap(), [2.0, 3.0, 1.0, 1.0, 4.0, 3.0]);
        assert_eq!(m.per_expert(|e| format!("blk.1.ffn_up.{e}.weight"), 3), None);
        let mut names: Vec<&str> = m.names().collect();
        names.sort();
        assert_eq!(names, ["blk.0.ffn_up.0.weight", "blk.0.ffn_up.2.weight"]);
    }
}
