//! GGUF container reader (versions 2 and 3, little-endian): header,
//! metadata key/values, tensor infos and the tensor data section, with every
//! read bounds-checked. What the tensors and keys mean for a model (Hugging
//! Face names, the configuration) is [`crate::checkpoint::gguf`]'s.
//!
//! Format: ggml's `docs/gguf.md`. A file is
//!
//! ```text
//! magic "GGUF" | version: u32 | tensor_count: u64 | kv_count: u64
//! kv_count × { key: string, value_type: u32, value }
//! tensor_count × { name: string, n_dims: u32, ne: [u64; n_dims], type: u32, offset: u64 }
//! padding to `general.alignment` (default 32)
//! data section: tensor `i` at data_start + offset_i (offsets are multiples
//! of the alignment)
//! ```
//!
//! where `string` is `len: u64` followed by `len` UTF-8 bytes (no NUL) and an
//! array value is `elem_type: u32, len: u64, elements`. `ne[0]` is the
//! innermost (fastest-varying) dimension, so the PyTorch shape is `ne`
//! reversed. Tensor data layouts are ggml's (see [`super::quant`]).
//!
//! Malformed input — a truncated file, an absurd count or length, an unknown
//! value type, a non-UTF-8 string, a tensor running past the end of the file
//! or overlapping another — is reported as [`StudioError::Format`] naming the
//! file, the key or tensor and the byte offset. Lengths are checked against
//! the bytes that remain before anything is allocated, so a hostile header
//! cannot make the reader allocate more than a small multiple of the file
//! size.
//!
//! The value types and their decoding are in `gguf/value.rs`; this file is the
//! container parser and the tensor infos.

use std::collections::HashMap;

use super::quant::{self, block_layout, ggml_dtype};
use super::{Bytes, DType};
use crate::error::{Result, StudioError};

mod value;
use value::{fixed_size, min_value_size};
pub use value::{GgufArray, GgufValue};

/// The format name used in [`StudioError::Format`].
/// The format name errors give.
pub(crate) const FORMAT: &str = "GGUF";
/// Default `general.alignment`.
pub const DEFAULT_ALIGNMENT: usize = 32;
/// ggml's `GGML_MAX_DIMS`.
pub const MAX_DIMS: usize = 4;
/// Deepest nesting of array values accepted (arrays of arrays of ...).
const MAX_ARRAY_DEPTH: usize = 8;
/// Longest metadata string accepted, bytes (a whole `tokenizer.json`
/// stored as `tokenizer.huggingface.json` is a few megabytes).
pub const MAX_STRING: usize = 64 << 20;
/// Most metadata key/values accepted (real files have tens).
pub const MAX_KV: u64 = 1 << 16;
/// Most tensors accepted (real files have at most a few thousand).
pub const MAX_TENSORS: u64 = 1 << 20;

/// One tensor info of a GGUF file, as stored (GGUF name, `ne` order).
#[derive(Debug, Clone, PartialEq)]
pub struct GgufTensorInfo {
    /// The tensor name in the file (llama.cpp naming, e.g. `blk.0.attn_q.weight`).
    pub name: String,
    /// Dimensions, innermost first (`ne[0]` varies fastest).
    pub ne: Vec<u64>,
    /// The raw `ggml_type` id.
    pub type_id: u32,
    /// The storage type ([`ggml_dtype`] of `type_id`).
    pub dtype: DType,
    /// Offset of the data relative to the data section start.
    pub offset: u64,
    /// Absolute byte offset of the data in the file.
    pub data_start: usize,
    /// Size of the data in bytes.
    pub n_bytes: usize,
    /// Number of elements (product of `ne`).
    pub n_elements: usize,
}

impl GgufTensorInfo {
    /// The PyTorch shape (outermost first): `ne` reversed.
    pub fn torch_shape(&self) -> Vec<usize> {
        self.ne.iter().rev().map(|&d| d as usize).collect()
    }
}

/// A parsed GGUF file: header, metadata and tensor infos over the file bytes.
#[derive(Debug, Clone)]
pub struct GgufFile {
    /// The file name errors give.
    pub(crate) file: String,
    /// The whole file.
    pub(crate) bytes: Bytes,
    /// GGUF version (2 or 3).
    pub version: u32,
    metadata: Vec<(String, GgufValue)>,
    meta_index: HashMap<String, usize>,
    /// Tensor infos in file order.
    pub tensors: Vec<GgufTensorInfo>,
    /// The data alignment (`general.alignment`, default 32).
    pub alignment: usize,
    /// Absolute byte offset of the data section.
    pub data_offset: usize,
}

/// Bounds-checked little-endian cursor over the file bytes.
struct Reader<'a> {
    buf: &'a [u8],
    bytes: &'a Bytes,
    pos: usize,
    file: &'a str,
}

impl<'a> Reader<'a> {
    fn err(&self, what: String) -> StudioError {
        StudioError::format(self.file, FORMAT, what)
    }

    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn take(&mut self, n: usize, what: &dyn Fn() -> String) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(self.err(format!(
                "{} at byte {}: needs {n} bytes but the file ends at byte {} (truncated file?)",
                what(),
                self.pos,
                self.buf.len()
            )));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N]> {
        let s = self.take(N, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// A length-prefixed UTF-8 string.
    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String> {
        Ok(self.str_ref(what)?.to_owned())
    }

    /// A length-prefixed UTF-8 string, borrowed from the file; at most
    /// [`MAX_STRING`] bytes.
    fn str_ref(&mut self, what: &dyn Fn() -> String) -> Result<&'a str> {
        let start = self.pos;
        let len = self.u64(&|| format!("length of {}", what()))?;
        if len > MAX_STRING as u64 {
            return Err(self.err(format!(
                "{} at byte {start}: string length {len} is over the {MAX_STRING}-byte limit of a metadata string",
                what()
            )));
        }
        if len > self.remaining() as u64 {
            return Err(self.err(format!(
                "{} at byte {start}: string length {len} exceeds the {} bytes left in the file",
                what(),
                self.remaining()
            )));
        }
        let raw = self.take(len as usize, what)?;
        match std::str::from_utf8(raw) {
            Ok(s) => Ok(s),
            Err(e) => Err(self.err(format!(
                "{} at byte {start}: string is not valid UTF-8 (invalid byte at string offset {})",
                what(),
                e.valid_up_to()
            ))),
        }
    }

    /// Checks that `count` items of at least `min_size` bytes each can fit
    /// in what remains, before allocating for them.
    fn check_count(&self, count: u64, min_size: usize, what: &dyn Fn() -> String, at: usize) -> Result<usize> {
        let need = (count as u128) * (min_size as u128);
        if need > self.remaining() as u128 {
            return Err(self.err(format!(
                "{} at byte {at}: count {count} needs at least {need} bytes but only {} remain",
                what(),
                self.remaining()
            )));
        }
        Ok(count as usize)
    }

    /// One value of type `ty` (for `key`, used in messages).
    fn value(&mut self, ty: u32, key: &str, depth: usize) -> Result<GgufValue> {
        let w = || format!("value of `{key}`");
        Ok(match ty {
            0 => GgufValue::U8(self.array::<1>(&w)?[0]),
            1 => GgufValue::I8(self.array::<1>(&w)?[0] as i8),
            2 => GgufValue::U16(u16::from_le_bytes(self.array(&w)?)),
            3 => GgufValue::I16(i16::from_le_bytes(self.array(&w)?)),
            4 => GgufValue::U32(u32::from_le_bytes(self.array(&w)?)),
            5 => GgufValue::I32(i32::from_le_bytes(self.array(&w)?)),
            6 => GgufValue::F32(f32::from_le_bytes(self.array(&w)?)),
            7 => GgufValue::Bool(self.array::<1>(&w)?[0] != 0),
            8 => GgufValue::String(self.string(&w)?),
            9 => {
                let at = self.pos;
                if depth >= MAX_ARRAY_DEPTH {
                    return Err(self.err(format!(
                        "value of `{key}` at byte {at}: arrays nested deeper than {MAX_ARRAY_DEPTH} levels"
                    )));
                }
                let elem_ty = self.u32(&|| format!("array element type of `{key}`"))?;
                let min = min_value_size(elem_ty).ok_or_else(|| {
                    self.err(format!(
                        "array `{key}` at byte {at}: unknown element value type {elem_ty} (valid: 0..=12)"
                    ))
                })?;
                let len = self.u64(&|| format!("array length of `{key}`"))?;
                let n = self.check_count(len, min, &|| format!("array `{key}`"), at)?;
                let start = self.pos;
                match fixed_size(elem_ty) {
                    Some(sz) => {
                        self.take(n * sz, &|| format!("elements of array `{key}`"))?;
                    }
                    None => {
                        // Strings and arrays: walked and validated, not kept.
                        for _ in 0..n {
                            self.skip_value(elem_ty, key, depth + 1)?;
                        }
                    }
                }
                GgufValue::Array(GgufArray {
                    bytes: self.bytes.clone(),
                    elem_type: elem_ty,
                    len: n,
                    start,
                    end: self.pos,
                })
            }
            10 => GgufValue::U64(u64::from_le_bytes(self.array(&w)?)),
            11 => GgufValue::I64(i64::from_le_bytes(self.array(&w)?)),
            12 => GgufValue::F64(f64::from_le_bytes(self.array(&w)?)),
            other => {
                return Err(self.err(format!(
                    "value of `{key}` at byte {}: unknown value type {other} (valid: 0..=12)",
                    self.pos.saturating_sub(4)
                )))
            }
        })
    }
}

impl Reader<'_> {
    /// Validates one value of type `ty` (an array element) without
    /// keeping it: bounds, UTF-8 of strings, nesting of arrays.
    fn skip_value(&mut self, ty: u32, key: &str, depth: usize) -> Result<()> {
        match ty {
            8 => {
                self.str_ref(&|| format!("element of array `{key}`"))?;
            }
            9 => {
                self.value(9, key, depth)?;
            }
            t => {
                let sz = fixed_size(t).ok_or_else(|| {
                    self.err(format!(
                        "array `{key}` at byte {}: unknown element value type {t} (valid: 0..=12)",
                        self.pos
                    ))
                })?;
                self.take(sz, &|| format!("element of array `{key}`"))?;
            }
        }
        Ok(())
    }
}

fn align_up(x: usize, a: usize) -> Option<usize> {
    x.checked_add(a - 1).map(|v| v / a * a)
}

impl AsRef<GgufFile> for GgufFile {
    fn as_ref(&self) -> &GgufFile {
        self
    }
}

impl GgufFile {
    /// Parses the header, metadata and tensor infos of a GGUF v2/v3 file and
    /// validates the tensor data layout (every tensor inside the file,
    /// aligned, no two overlapping).
    ///
    /// Tensor data is not read or converted here.
    ///
    /// # Errors
    /// [`StudioError::Format`] (format `"GGUF"`) naming `file_name`, the
    /// key or tensor, and the byte offset, for: a wrong magic, an unsupported
    /// version (1, big-endian files, > 3), a truncated file, counts or
    /// lengths larger than the file, an unknown value type, non-UTF-8
    /// strings, duplicate keys or tensor names, more than 4 dims, a bad
    /// `general.alignment`, a row size that is not a whole number of blocks,
    /// misaligned, out-of-file or overlapping tensor data.
    /// [`StudioError::UnsupportedDType`] for a tensor whose `ggml_type` id is
    /// unknown (its size cannot be computed).
    pub fn parse(bytes: Bytes, file_name: &str) -> Result<GgufFile> {
        let buf = bytes.as_slice();
        crate::tensor_io::bytes::refuse_lfs_pointer(buf, file_name, FORMAT)?;
        let mut r = Reader { buf, bytes: &bytes, pos: 0, file: file_name };
        let magic = r.array::<4>(&|| "magic".to_string())?;
        if &magic != b"GGUF" {
            return Err(r.err(format!("bad magic {:?} at byte 0 (expected \"GGUF\")", String::from_utf8_lossy(&magic))));
        }
        let version = r.u32(&|| "version".to_string())?;
        match version {
            2 | 3 => {}
            1 => return Err(r.err("version 1 at byte 4 is not supported (GGUF v2 and v3 are)".into())),
            v if v.swap_bytes() == 2 || v.swap_bytes() == 3 => {
                return Err(
                    r.err(format!("version field at byte 4 reads {v}: a big-endian GGUF file, which is not supported"))
                )
            }
            v => return Err(r.err(format!("unsupported version {v} at byte 4 (GGUF v2 and v3 are supported)"))),
        }
        let tensor_count = r.u64(&|| "tensor_count".to_string())?;
        let kv_count = r.u64(&|| "metadata_kv_count".to_string())?;
        // Minimal sizes: a kv is key (8) + type (4) + value (>= 1); a tensor
        // info is name (8) + n_dims (4) + type (4) + offset (8).
        if kv_count > MAX_KV {
            return Err(r.err(format!("metadata_kv_count {kv_count} at byte 16 is over the limit of {MAX_KV}")));
        }
        if tensor_count > MAX_TENSORS {
            return Err(r.err(format!("tensor_count {tensor_count} at byte 8 is over the limit of {MAX_TENSORS}")));
        }
        let kv_n = r.check_count(kv_count, 13, &|| "metadata_kv_count".to_string(), 16)?;
        let mut metadata = Vec::with_capacity(kv_n);
        let mut meta_index = HashMap::with_capacity(kv_n);
        for i in 0..kv_n {
            let at = r.pos;
            let key = r.string(&|| format!("key of metadata entry {i}"))?;
            let ty = r.u32(&|| format!("value type of `{key}`"))?;
            let value = r.value(ty, &key, 0)?;
            if meta_index.insert(key.clone(), metadata.len()).is_some() {
                return Err(r.err(format!("duplicate metadata key `{key}` at byte {at}")));
            }
            metadata.push((key, value));
        }

        let t_n = r.check_count(tensor_count, 24, &|| "tensor_count".to_string(), 8)?;
        let alignment = match meta_index.get("general.alignment").map(|&i| &metadata[i].1) {
            None => DEFAULT_ALIGNMENT,
            Some(GgufValue::U32(a)) if *a > 0 && a.is_power_of_two() => *a as usize,
            Some(v) => {
                return Err(
                    r.err(format!("`general.alignment` must be a uint32 power of two, found {} {v:?}", v.type_name()))
                )
            }
        };
        let mut tensors: Vec<GgufTensorInfo> = Vec::with_capacity(t_n);
        let mut names: HashMap<String, usize> = HashMap::with_capacity(t_n);
        for i in 0..t_n {
            let at = r.pos;
            let name = r.string(&|| format!("name of tensor {i}"))?;
            let n_dims = r.u32(&|| format!("n_dims of tensor `{name}`"))?;
            if n_dims as usize > MAX_DIMS {
                return Err(r.err(format!(
                    "tensor `{name}` (info at byte {at}): n_dims {n_dims} exceeds ggml's maximum of {MAX_DIMS}"
                )));
            }
            let mut ne = Vec::with_capacity(n_dims as usize);
            for k in 0..n_dims {
                ne.push(r.u64(&|| format!("ne[{k}] of tensor `{name}`"))?);
            }
            let type_id = r.u32(&|| format!("type of tensor `{name}`"))?;
            let offset = r.u64(&|| format!("offset of tensor `{name}`"))?;
            let dtype = ggml_dtype(type_id);
            let Some((be, bb)) = block_layout(dtype) else {
                return Err(StudioError::UnsupportedDType {
                    file: file_name.to_string(),
                    tensor: name,
                    dtype: format!("ggml type id {type_id}"),
                    hint: format!("unknown ggml type; dequantizable types: {}", quant::SUPPORTED),
                });
            };
            let mut n_elements: u64 = 1;
            for &d in &ne {
                n_elements = n_elements.checked_mul(d).filter(|&n| n <= i64::MAX as u64).ok_or_else(|| {
                    r.err(format!("tensor `{name}` (info at byte {at}): dims {ne:?} overflow the element count"))
                })?;
            }
            let ne0 = ne.first().copied().unwrap_or(1);
            if ne0 % be as u64 != 0 {
                return Err(r.err(format!(
                    "tensor `{name}` (info at byte {at}): row length ne[0] = {ne0} is not a multiple of the {dtype} block size {be}"
                )));
            }
            let n_bytes = (n_elements / be as u64) as u128 * bb as u128;
            if n_bytes > buf.len() as u128 {
                return Err(r.err(format!(
                    "tensor `{name}` (info at byte {at}): {n_elements} {dtype} elements need {n_bytes} bytes, more than the whole file ({} bytes)",
                    buf.len()
                )));
            }
            if offset % alignment as u64 != 0 {
                return Err(r.err(format!(
                    "tensor `{name}` (info at byte {at}): data offset {offset} is not a multiple of the alignment {alignment}"
                )));
            }
            if names.insert(name.clone(), i).is_some() {
                return Err(r.err(format!("duplicate tensor name `{name}` (info at byte {at})")));
            }
            tensors.push(GgufTensorInfo {
                name,
                ne,
                type_id,
                dtype,
                offset,
                data_start: 0,
                n_bytes: n_bytes as usize,
                n_elements: n_elements as usize,
            });
        }
        let infos_end = r.pos;
        let data_offset = align_up(infos_end, alignment).unwrap_or(usize::MAX);
        if !tensors.is_empty() && data_offset > buf.len() {
            return Err(r.err(format!(
                "data section would start at byte {data_offset} (tensor infos end at byte {infos_end}, alignment {alignment}) but the file has {} bytes (truncated file?)",
                buf.len()
            )));
        }
        for t in &mut tensors {
            let start = (data_offset as u128) + t.offset as u128;
            let end = start + t.n_bytes as u128;
            if end > buf.len() as u128 {
                return Err(StudioError::format(
                    file_name,
                    FORMAT,
                    format!(
                        "tensor `{}`: data at bytes {start}..{end} (offset {} in the data section at byte {data_offset}) runs past the end of the file ({} bytes)",
                        t.name, t.offset, buf.len()
                    ),
                ));
            }
            t.data_start = start as usize;
        }
        let mut order: Vec<usize> = (0..tensors.len()).collect();
        order.sort_by_key(|&i| (tensors[i].data_start, tensors[i].n_bytes));
        for w in order.windows(2) {
            let (a, b) = (&tensors[w[0]], &tensors[w[1]]);
            if a.data_start + a.n_bytes > b.data_start && a.n_bytes > 0 && b.n_bytes > 0 {
                return Err(StudioError::format(
                    file_name,
                    FORMAT,
                    format!(
                        "tensors `{}` (bytes {}..{}) and `{}` (bytes {}..{}) overlap",
                        a.name,
                        a.data_start,
                        a.data_start + a.n_bytes,
                        b.name,
                        b.data_start,
                        b.data_start + b.n_bytes
                    ),
                ));
            }
        }
        Ok(GgufFile {
            file: file_name.to_string(),
            bytes,
            version,
            metadata,
            meta_index,
            tensors,
            alignment,
            data_offset,
        })
    }

    /// The file name given to [`GgufFile::parse`].
    pub fn file_name(&self) -> &str {
        &self.file
    }

    /// All metadata key/values in file order.
    pub fn metadata(&self) -> &[(String, GgufValue)] {
        &self.metadata
    }

    /// One metadata value by key.
    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.meta_index.get(key).map(|&i| &self.metadata[i].1)
    }

    /// A string metadata value (`None` when absent or not a string).
    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(GgufValue::as_str)
    }

    /// A tensor info by GGUF name.
    pub fn tensor(&self, name: &str) -> Option<&GgufTensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The raw data bytes of a tensor (exactly `n_bytes`, bounds checked at
    /// parse time).
    pub fn tensor_bytes(&self, t: &GgufTensorInfo) -> &[u8] {
        &self.bytes.as_slice()[t.data_start..t.data_start + t.n_bytes]
    }

    /// Dequantizes a tensor (by its info) to f32 in storage order.
    ///
    /// # Errors
    /// [`StudioError::UnsupportedDType`] naming the file and tensor when the
    /// type cannot be dequantized.
    pub fn dequantize(&self, t: &GgufTensorInfo) -> Result<Vec<f32>> {
        if !quant::is_supported(t.dtype) {
            return Err(unsupported(&self.file, &t.name, t.dtype));
        }
        quant::dequantize(t.dtype, self.tensor_bytes(t), t.n_elements)
            .map_err(|e| StudioError::tensor(&self.file, &t.name, e))
    }
}

/// The error for a tensor of a GGML type the studio cannot dequantize.
pub(crate) fn unsupported(file: &str, tensor: &str, dtype: DType) -> StudioError {
    StudioError::UnsupportedDType {
        file: file.to_string(),
        tensor: tensor.to_string(),
        dtype: dtype.to_string(),
        hint: format!("supported GGML types: {}", quant::SUPPORTED),
    }
}
