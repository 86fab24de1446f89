//! Hugging Face safetensors input: one file, or a sharded checkpoint with
//! `model.safetensors.index.json`.
//!
//! Format: <https://github.com/huggingface/safetensors> (8-byte little-endian
//! header length, JSON header with `dtype`, `shape`, `data_offsets`, then the
//! data). Parsing and validation are done by the `safetensors` crate; on
//! failure we re-read the header ourselves to name the offending tensor.

use std::collections::HashMap;
use std::ops::Range;

use super::dtype::floats_to_f32;
use super::{Bytes, DType, TensorInfo, TensorSource};
use crate::error::{Result, StudioError};

/// One parsed safetensors file: tensor infos and their absolute byte
/// ranges in `bytes`.
#[derive(Debug, Clone)]
pub struct SafetensorsFile {
    name: String,
    bytes: Bytes,
    tensors: Vec<(TensorInfo, Range<usize>)>,
    index: HashMap<String, usize>,
    metadata: HashMap<String, String>,
}

fn map_dtype(d: safetensors::Dtype) -> DType {
    use safetensors::Dtype as S;
    match d {
        S::F32 => DType::F32,
        S::F16 => DType::F16,
        S::BF16 => DType::BF16,
        S::F64 => DType::Other("F64"),
        S::I64 => DType::Other("I64"),
        S::I32 => DType::Other("I32"),
        S::I16 => DType::Other("I16"),
        S::I8 => DType::Other("I8"),
        S::U8 => DType::Other("U8"),
        S::BOOL => DType::Other("BOOL"),
        _ => DType::Other("other"),
    }
}

/// Explains why `buf` is not a valid safetensors file, naming the tensor
/// where possible (used to improve the `safetensors` crate's messages).
fn diagnose(buf: &[u8], err: &safetensors::SafeTensorError) -> String {
    let generic = format!("{err}");
    if buf.len() < 8 {
        return format!("file is {} bytes, shorter than the 8-byte header length", buf.len());
    }
    let n = u64::from_le_bytes(buf[..8].try_into().expect("8 bytes"));
    if n > (buf.len() as u64).saturating_sub(8) {
        return format!("header length {n} runs past the end of the file ({} bytes): truncated?", buf.len());
    }
    let n = n as usize;
    let Ok(header) = serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(&buf[8..8 + n]) else {
        return format!("header is not valid JSON ({generic})");
    };
    let data_len = buf.len() - 8 - n;
    let mut spans: Vec<(String, u64, u64, u64)> = Vec::new();
    for (name, v) in &header {
        if name == "__metadata__" {
            continue;
        }
        let offs = v.get("data_offsets").and_then(|o| o.as_array());
        let (Some(s), Some(e)) = (
            offs.and_then(|o| o.first()).and_then(|x| x.as_u64()),
            offs.and_then(|o| o.get(1)).and_then(|x| x.as_u64()),
        ) else {
            return format!("tensor `{name}`: missing or invalid `data_offsets`");
        };
        let elems: Option<u64> = v
            .get("shape")
            .and_then(|s| s.as_array())
            .and_then(|a| a.iter().try_fold(1u64, |acc, x| x.as_u64().and_then(|x| acc.checked_mul(x))));
        let size = match v.get("dtype").and_then(|d| d.as_str()) {
            Some("F64" | "I64" | "U64") => 8,
            Some("F32" | "I32" | "U32") => 4,
            Some("F16" | "BF16" | "I16" | "U16") => 2,
            Some(_) => 1,
            None => return format!("tensor `{name}`: missing `dtype`"),
        };
        if e < s {
            return format!("tensor `{name}`: data_offsets [{s}, {e}] end before they start");
        }
        if let Some(elems) = elems {
            if elems.saturating_mul(size) != e - s {
                return format!(
                    "tensor `{name}`: data_offsets [{s}, {e}] hold {} bytes but its dtype and shape need {}",
                    e - s,
                    elems.saturating_mul(size)
                );
            }
        }
        if e > data_len as u64 {
            return format!(
                "tensor `{name}`: data_offsets [{s}, {e}] run past the end of the data section ({data_len} bytes): file truncated?"
            );
        }
        spans.push((name.clone(), s, e, size));
    }
    spans.sort_by_key(|x| (x.1, x.2));
    let mut end = 0u64;
    for (name, s, e, _) in &spans {
        if *s < end {
            return format!(
                "tensor `{name}`: data_offsets [{s}, {e}] overlap the previous tensor (which ends at {end})"
            );
        }
        if *s > end {
            return format!("tensor `{name}`: gap before data_offsets [{s}, {e}] (previous tensor ends at {end})");
        }
        end = *e;
    }
    if end != data_len as u64 {
        return format!(
            "data section is {data_len} bytes but the tensors cover {end}: file truncated or has trailing bytes"
        );
    }
    generic
}

/// Largest safetensors JSON header accepted, bytes. Real headers are tens
/// to hundreds of kilobytes (a few hundred bytes per tensor); the
/// `safetensors` crate's own limit is 100 MB, which a hostile header could
/// fill with tensors that cost several times that in memory.
pub const MAX_HEADER: u64 = 16 << 20;

/// Checks the header before it is parsed: its length is at most
/// [`MAX_HEADER`] and within the file, and no tensor is listed twice (JSON
/// allows repeated keys; a map would silently keep the last).
fn check_header(buf: &[u8], file_name: &str) -> Result<()> {
    let fmt = |what: String| StudioError::format(file_name, "safetensors", what);
    let Some(len) = buf.get(..8).map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes"))) else {
        return Err(fmt(format!("file is {} bytes, shorter than the 8-byte header length", buf.len())));
    };
    if len > MAX_HEADER {
        return Err(fmt(format!(
            "header length {len} is over the {MAX_HEADER}-byte limit (real headers are well under 1 MB)"
        )));
    }
    if len > (buf.len() as u64).saturating_sub(8) {
        return Err(fmt(format!(
            "header length {len} runs past the end of the file ({} bytes): truncated?",
            buf.len()
        )));
    }
    /// Walks the header's keys; a repeated one is recorded in `.0` (a typed
    /// result, not the text of serde's error).
    struct Keys<'a>(&'a mut Option<String>);
    impl<'de> serde::de::Visitor<'de> for Keys<'_> {
        type Value = ();
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a JSON object of tensors")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, mut m: A) -> std::result::Result<(), A::Error> {
            let mut seen = std::collections::HashSet::new();
            while let Some(k) = m.next_key::<std::borrow::Cow<'de, str>>()? {
                m.next_value::<serde::de::IgnoredAny>()?;
                if !seen.insert(k.clone().into_owned()) {
                    *self.0 = Some(k.into_owned());
                    return Err(serde::de::Error::custom("a tensor is listed twice"));
                }
            }
            Ok(())
        }
    }
    let header = &buf[8..8 + len as usize];
    let mut de = serde_json::Deserializer::from_slice(header);
    let mut twice = None;
    // Only the duplicate is reported here; other JSON errors get the
    // fuller diagnosis after the crate's parse.
    let _ = serde::Deserializer::deserialize_map(&mut de, Keys(&mut twice));
    match twice {
        Some(k) => Err(fmt(format!("tensor `{k}` is listed twice in the header"))),
        None => Ok(()),
    }
}

impl SafetensorsFile {
    /// Parses and validates a safetensors buffer.
    ///
    /// # Errors
    /// [`StudioError::Format`] naming `file_name` and, where it applies, the
    /// tensor whose offsets overlap, leave gaps or run past the file.
    pub fn parse(bytes: Bytes, file_name: &str) -> Result<Self> {
        let buf = bytes.as_slice();
        crate::tensor_io::bytes::refuse_lfs_pointer(buf, file_name, "safetensors")?;
        check_header(buf, file_name)?;
        let (n, meta) = safetensors::SafeTensors::read_metadata(buf)
            .map_err(|e| StudioError::format(file_name, "safetensors", diagnose(buf, &e)))?;
        let data_start = 8 + n;
        let mut tensors: Vec<(TensorInfo, Range<usize>)> = meta
            .tensors()
            .into_iter()
            .map(|(name, info)| {
                let (s, e) = info.data_offsets;
                (
                    TensorInfo { name, dtype: map_dtype(info.dtype), shape: info.shape.clone() },
                    data_start + s..data_start + e,
                )
            })
            .collect();
        tensors.sort_by_key(|(_, r)| r.start);
        let index = tensors.iter().enumerate().map(|(i, (t, _))| (t.name.clone(), i)).collect();
        let metadata = meta.metadata().clone().unwrap_or_default();
        Ok(SafetensorsFile { name: file_name.to_string(), bytes, tensors, index, metadata })
    }

    /// Opens (memory-maps) and parses a file (native only).
    ///
    /// # Errors
    /// I/O errors and those of [`SafetensorsFile::parse`].
    #[cfg(not(target_arch = "wasm32"))]
    pub fn open(path: &std::path::Path) -> Result<Self> {
        Self::parse(Bytes::map_file(path)?, &path.display().to_string())
    }

    /// The `__metadata__` map.
    pub fn metadata(&self) -> &HashMap<String, String> {
        &self.metadata
    }

    /// Raw little-endian bytes of one tensor.
    pub fn raw(&self, name: &str) -> Option<(&TensorInfo, &[u8])> {
        self.index.get(name).map(|&i| {
            let (info, r) = &self.tensors[i];
            (info, &self.bytes.as_slice()[r.clone()])
        })
    }

    /// Total file size in bytes.
    pub fn file_len(&self) -> usize {
        self.bytes.len()
    }
}

impl TensorSource for SafetensorsFile {
    fn source_name(&self) -> &str {
        &self.name
    }
    fn tensors(&self) -> Vec<TensorInfo> {
        self.tensors.iter().map(|(t, _)| t.clone()).collect()
    }
    fn info(&self, name: &str) -> Option<TensorInfo> {
        self.index.get(name).map(|&i| self.tensors[i].0.clone())
    }
    fn read_f32(&self, name: &str) -> Result<Vec<f32>> {
        let (info, raw) =
            self.raw(name).ok_or_else(|| StudioError::tensor(&self.name, name, "not present in this file"))?;
        let v = floats_to_f32(info.dtype, raw).ok_or_else(|| StudioError::UnsupportedDType {
            file: self.name.clone(),
            tensor: name.to_string(),
            dtype: info.dtype.to_string(),
            hint: "model weights must be F32, F16 or BF16".into(),
        })?;
        // The decoded copy is what the caller keeps: the file's pages leave
        // the resident set (`Bytes::release`).
        if let Some(&i) = self.index.get(name) {
            self.bytes.release(self.tensors[i].1.clone());
        }
        Ok(v)
    }
    fn read_f32_range(&self, name: &str, range: std::ops::Range<usize>) -> Result<Vec<f32>> {
        let (info, raw) =
            self.raw(name).ok_or_else(|| StudioError::tensor(&self.name, name, "not present in this file"))?;
        let unsupported = || StudioError::UnsupportedDType {
            file: self.name.clone(),
            tensor: name.to_string(),
            dtype: info.dtype.to_string(),
            hint: "model weights must be F32, F16 or BF16".into(),
        };
        let size = info.dtype.float_size().ok_or_else(unsupported)?;
        super::check_range(&self.name, name, raw.len() / size, &range)?;
        let bytes = &raw[range.start * size..range.end * size];
        floats_to_f32(info.dtype, bytes).ok_or_else(unsupported)
    }
}

/// A checkpoint made of one or more safetensors files (a Hugging Face
/// model directory), seen as one [`TensorSource`].
#[derive(Debug, Clone)]
pub struct SafetensorsModel {
    name: String,
    files: Vec<SafetensorsFile>,
    owner: HashMap<String, usize>,
}

impl SafetensorsModel {
    /// Combines parsed shard files. When `weight_map` (from
    /// `model.safetensors.index.json`) is given, every tensor it lists must
    /// be in the file it names.
    ///
    /// # Errors
    /// [`StudioError::Tensor`] for a tensor in two shards or missing from the
    /// shard the index names.
    pub fn from_files(
        name: &str,
        files: Vec<SafetensorsFile>,
        weight_map: Option<&HashMap<String, String>>,
    ) -> Result<Self> {
        let mut owner = HashMap::new();
        for (i, f) in files.iter().enumerate() {
            for (t, _) in &f.tensors {
                if let Some(prev) = owner.insert(t.name.clone(), i) {
                    return Err(StudioError::tensor(
                        &f.name,
                        &t.name,
                        format!("also present in {} (a tensor must live in one shard)", files[prev].name),
                    ));
                }
            }
        }
        if let Some(map) = weight_map {
            for (tensor, file) in map {
                let ok = owner.get(tensor).map(|&i| files[i].name.ends_with(file.as_str())).unwrap_or(false);
                if !ok {
                    return Err(StudioError::tensor(
                        format!("{name}/model.safetensors.index.json"),
                        tensor,
                        format!("the index says it is in `{file}` but that shard does not contain it"),
                    ));
                }
            }
        }
        Ok(SafetensorsModel { name: name.to_string(), files, owner })
    }

    /// Opens a Hugging Face model directory: `model.safetensors`, or the
    /// shards listed in `model.safetensors.index.json` (native only).
    ///
    /// # Errors
    /// [`StudioError::Io`] when neither exists; parse errors of each shard.
    #[cfg(not(target_arch = "wasm32"))]
    pub fn open_dir(dir: &std::path::Path) -> Result<Self> {
        let index_path = dir.join("model.safetensors.index.json");
        let name = dir.display().to_string();
        if index_path.exists() {
            let raw = std::fs::read(&index_path).map_err(|e| StudioError::io(index_path.display(), e))?;
            let map = parse_index(&raw, &index_path.display().to_string())?;
            let mut shard_names: Vec<&String> = map.values().collect();
            shard_names.sort();
            shard_names.dedup();
            let files = shard_names
                .iter()
                .map(|s| {
                    if s.contains('/') || s.contains('\\') || s.contains("..") {
                        return Err(StudioError::format(
                            index_path.display(),
                            "safetensors index",
                            format!("shard name `{s}` must be a plain file name"),
                        ));
                    }
                    SafetensorsFile::open(&dir.join(s))
                })
                .collect::<Result<Vec<_>>>()?;
            return Self::from_files(&name, files, Some(&map));
        }
        let single = dir.join("model.safetensors");
        if single.exists() {
            return Self::from_files(&name, vec![SafetensorsFile::open(&single)?], None);
        }
        Err(StudioError::io(
            dir.display(),
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "no model.safetensors or model.safetensors.index.json in this directory",
            ),
        ))
    }

    /// The shard files.
    pub fn files(&self) -> &[SafetensorsFile] {
        &self.files
    }

    /// Raw bytes and info of one tensor.
    pub fn raw(&self, name: &str) -> Option<(&TensorInfo, &[u8])> {
        self.owner.get(name).and_then(|&i| self.files[i].raw(name))
    }
}

/// Parses `model.safetensors.index.json` into its `weight_map`.
///
/// # Errors
/// [`StudioError::Format`] when the JSON or its `weight_map` is invalid.
pub fn parse_index(raw: &[u8], file_name: &str) -> Result<HashMap<String, String>> {
    #[derive(serde::Deserialize)]
    struct Index {
        weight_map: HashMap<String, String>,
    }
    let idx: Index =
        serde_json::from_slice(raw).map_err(|e| StudioError::format(file_name, "safetensors index", e.to_string()))?;
    Ok(idx.weight_map)
}

impl TensorSource for SafetensorsModel {
    fn source_name(&self) -> &str {
        &self.name
    }
    fn tensors(&self) -> Vec<TensorInfo> {
        self.files.iter().flat_map(|f| f.tensors.iter().map(|(t, _)| t.clone())).collect()
    }
    fn info(&self, name: &str) -> Option<TensorInfo> {
        self.owner.get(name).and_then(|&i| self.files[i].info(name))
    }
    fn read_f32(&self, name: &str) -> Result<Vec<f32>> {
        match self.owner.get(name) {
            Some(&i) => self.files[i].read_f32(name),
            None => Err(StudioError::tensor(&self.name, name, "not present in any shard")),
        }
    }
    fn read_f32_range(&self, name: &str, range: std::ops::Range<usize>) -> Result<Vec<f32>> {
        match self.owner.get(name) {
            Some(&i) => self.files[i].read_f32_range(name, range),
            None => Err(StudioError::tensor(&self.name, name, "not present in any shard")),
        }
    }
}
