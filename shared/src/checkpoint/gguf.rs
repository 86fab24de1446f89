//! GGUF reader (versions 2 and 3, little-endian): header, metadata
//! key/values, tensor infos and the tensor data section, with every read
//! bounds-checked; plus a [`TensorSource`] view ([`GgufModel`]) that exposes
//! llama.cpp tensors under Hugging Face names and PyTorch shapes.
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

use std::collections::HashMap;

use crate::checkpoint::quant::{self, block_layout, ggml_dtype};
use crate::checkpoint::{Bytes, DType, TensorInfo, TensorSource};
use crate::config::{ModelConfig, RopeScaling};
use crate::error::{Result, StudioError};

/// The format name used in [`StudioError::Format`].
const FORMAT: &str = "GGUF";
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

/// A GGUF metadata value (`gguf_metadata_value_type`).
#[derive(Debug, Clone, PartialEq)]
pub enum GgufValue {
    /// Type 0.
    U8(u8),
    /// Type 1.
    I8(i8),
    /// Type 2.
    U16(u16),
    /// Type 3.
    I16(i16),
    /// Type 4.
    U32(u32),
    /// Type 5.
    I32(i32),
    /// Type 6.
    F32(f32),
    /// Type 7 (one byte; any non-zero value reads as `true`).
    Bool(bool),
    /// Type 8: a UTF-8 string.
    String(String),
    /// Type 9: an array of values of one type (possibly arrays themselves),
    /// read from the file as it is iterated ([`GgufArray`]).
    Array(GgufArray),
    /// Type 10.
    U64(u64),
    /// Type 11.
    I64(i64),
    /// Type 12.
    F64(f64),
}

impl GgufValue {
    /// The value as an unsigned integer, for any integer type holding a
    /// non-negative value (`None` for other types and negative values).
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            GgufValue::U8(v) => Some(v as u64),
            GgufValue::U16(v) => Some(v as u64),
            GgufValue::U32(v) => Some(v as u64),
            GgufValue::U64(v) => Some(v),
            GgufValue::I8(v) => u64::try_from(v).ok(),
            GgufValue::I16(v) => u64::try_from(v).ok(),
            GgufValue::I32(v) => u64::try_from(v).ok(),
            GgufValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value as a signed integer, for any integer type that fits in `i64`.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            GgufValue::U64(v) => i64::try_from(v).ok(),
            GgufValue::I8(v) => Some(v as i64),
            GgufValue::I16(v) => Some(v as i64),
            GgufValue::I32(v) => Some(v as i64),
            GgufValue::I64(v) => Some(v),
            _ => self.as_u64().map(|v| v as i64),
        }
    }

    /// The value as a float, for the float types and any integer type.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            GgufValue::F32(v) => Some(v as f64),
            GgufValue::F64(v) => Some(v),
            _ => self.as_i64().map(|v| v as f64),
        }
    }

    /// The value as a bool (`Bool` only).
    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            GgufValue::Bool(b) => Some(b),
            _ => None,
        }
    }

    /// The value as a string slice (`String` only).
    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::String(s) => Some(s),
            _ => None,
        }
    }

    /// The elements of an `Array`.
    pub fn as_array(&self) -> Option<&GgufArray> {
        match self {
            GgufValue::Array(a) => Some(a),
            _ => None,
        }
    }

    /// The GGUF name of the value's type (`"uint32"`, `"string"`, ...).
    pub fn type_name(&self) -> &'static str {
        match self {
            GgufValue::U8(_) => "uint8",
            GgufValue::I8(_) => "int8",
            GgufValue::U16(_) => "uint16",
            GgufValue::I16(_) => "int16",
            GgufValue::U32(_) => "uint32",
            GgufValue::I32(_) => "int32",
            GgufValue::F32(_) => "float32",
            GgufValue::Bool(_) => "bool",
            GgufValue::String(_) => "string",
            GgufValue::Array(_) => "array",
            GgufValue::U64(_) => "uint64",
            GgufValue::I64(_) => "int64",
            GgufValue::F64(_) => "float64",
        }
    }
}

/// An array metadata value: its element type and count, and where its
/// elements are in the file. Elements are decoded as they are iterated,
/// so a metadata array costs no memory however long it is — the vocabulary
/// arrays (`tokenizer.ggml.tokens`, `scores`, `token_type`, `merges`) are
/// the only large ones in real files, and a hostile file could otherwise
/// make a 100 MB array cost gigabytes of `GgufValue`s. The elements were
/// validated when the file was parsed (bounds, UTF-8, nesting).
#[derive(Clone)]
pub struct GgufArray {
    bytes: Bytes,
    elem_type: u32,
    len: usize,
    /// Byte range of the elements in the file.
    start: usize,
    end: usize,
}

impl GgufArray {
    /// Number of elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it has no elements.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The GGUF name of the element type (`"string"`, `"float32"`, ...).
    pub fn elem_type_name(&self) -> &'static str {
        type_name_of(self.elem_type)
    }

    /// Bytes the elements take in the file.
    pub fn byte_len(&self) -> usize {
        self.end - self.start
    }

    /// The elements, decoded one at a time (strings are copied; see
    /// [`GgufArray::strs`] to borrow them).
    pub fn iter(&self) -> impl Iterator<Item = GgufValue> + '_ {
        let buf = &self.bytes.as_slice()[..self.end];
        let mut pos = self.start;
        let mut left = self.len;
        std::iter::from_fn(move || {
            if left == 0 {
                return None;
            }
            left -= 1;
            let (v, next) = decode(&self.bytes, buf, pos, self.elem_type)?;
            pos = next;
            Some(v)
        })
    }

    /// The elements of a string array, borrowed from the file (`None` for
    /// another element type).
    pub fn strs(&self) -> Option<impl Iterator<Item = &str> + '_> {
        if self.elem_type != 8 {
            return None;
        }
        let buf = &self.bytes.as_slice()[..self.end];
        let mut pos = self.start;
        let mut left = self.len;
        Some(std::iter::from_fn(move || {
            if left == 0 {
                return None;
            }
            left -= 1;
            let n = u64::from_le_bytes(buf.get(pos..pos + 8)?.try_into().ok()?) as usize;
            let s = std::str::from_utf8(buf.get(pos + 8..pos + 8 + n)?).ok()?;
            pos += 8 + n;
            Some(s)
        }))
    }
}

impl GgufArray {
    /// An array of `values` (all of one type; an empty array is typed
    /// `uint32`), encoded as GGUF stores it, for the writer
    /// (`checkpoint::gguf_write`, and the tokenizer's GGUF export).
    pub fn from_values(values: &[GgufValue]) -> GgufArray {
        let elem_type = values.first().map_or(4, GgufValue::type_id);
        let mut buf = Vec::new();
        for v in values {
            v.encode(&mut buf);
        }
        let end = buf.len();
        GgufArray { bytes: Bytes::from_vec(buf), elem_type, len: values.len(), start: 0, end }
    }

    /// GGUF encoding of the array value (element type, length, elements).
    fn encode(&self, buf: &mut Vec<u8>) {
        buf.extend_from_slice(&self.elem_type.to_le_bytes());
        buf.extend_from_slice(&(self.len as u64).to_le_bytes());
        buf.extend_from_slice(&self.bytes.as_slice()[self.start..self.end]);
    }
}

impl GgufValue {
    /// The GGUF value type id (`0` = uint8 ... `12` = float64).
    pub fn type_id(&self) -> u32 {
        match self {
            GgufValue::U8(_) => 0,
            GgufValue::I8(_) => 1,
            GgufValue::U16(_) => 2,
            GgufValue::I16(_) => 3,
            GgufValue::U32(_) => 4,
            GgufValue::I32(_) => 5,
            GgufValue::F32(_) => 6,
            GgufValue::Bool(_) => 7,
            GgufValue::String(_) => 8,
            GgufValue::Array(_) => 9,
            GgufValue::U64(_) => 10,
            GgufValue::I64(_) => 11,
            GgufValue::F64(_) => 12,
        }
    }

    /// Appends the GGUF encoding of the value (without its type id) to
    /// `buf` (ggml `docs/gguf.md`: little-endian scalars, strings as
    /// `u64` length + UTF-8 bytes, arrays as type + `u64` length + elements).
    pub fn encode(&self, buf: &mut Vec<u8>) {
        match self {
            GgufValue::U8(x) => buf.push(*x),
            GgufValue::I8(x) => buf.push(*x as u8),
            GgufValue::U16(x) => buf.extend_from_slice(&x.to_le_bytes()),
            GgufValue::I16(x) => buf.extend_from_slice(&x.to_le_bytes()),
            GgufValue::U32(x) => buf.extend_from_slice(&x.to_le_bytes()),
            GgufValue::I32(x) => buf.extend_from_slice(&x.to_le_bytes()),
            GgufValue::F32(x) => buf.extend_from_slice(&x.to_le_bytes()),
            GgufValue::Bool(x) => buf.push(u8::from(*x)),
            GgufValue::String(s) => {
                buf.extend_from_slice(&(s.len() as u64).to_le_bytes());
                buf.extend_from_slice(s.as_bytes());
            }
            GgufValue::Array(a) => a.encode(buf),
            GgufValue::U64(x) => buf.extend_from_slice(&x.to_le_bytes()),
            GgufValue::I64(x) => buf.extend_from_slice(&x.to_le_bytes()),
            GgufValue::F64(x) => buf.extend_from_slice(&x.to_le_bytes()),
        }
    }
}

impl std::fmt::Debug for GgufArray {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let first: Vec<GgufValue> = self.iter().take(4).collect();
        write!(f, "[{}; {}] {first:?}{}", self.elem_type_name(), self.len, if self.len > 4 { "..." } else { "" })
    }
}

impl PartialEq for GgufArray {
    fn eq(&self, other: &Self) -> bool {
        self.elem_type == other.elem_type && self.len == other.len && self.iter().eq(other.iter())
    }
}

/// The GGUF name of value type `ty`.
fn type_name_of(ty: u32) -> &'static str {
    match ty {
        0 => "uint8",
        1 => "int8",
        2 => "uint16",
        3 => "int16",
        4 => "uint32",
        5 => "int32",
        6 => "float32",
        7 => "bool",
        8 => "string",
        9 => "array",
        10 => "uint64",
        11 => "int64",
        12 => "float64",
        _ => "unknown",
    }
}

/// Decodes one already-validated value of type `ty` at `pos` of `buf`;
/// returns it and the position after it (`None` only if the bytes were not
/// validated, which [`GgufFile::parse`] rules out).
fn decode(bytes: &Bytes, buf: &[u8], pos: usize, ty: u32) -> Option<(GgufValue, usize)> {
    let b = |n: usize| buf.get(pos..pos + n);
    let a = |n: usize| -> Option<[u8; 8]> {
        let mut x = [0u8; 8];
        x[..n].copy_from_slice(b(n)?);
        Some(x)
    };
    Some(match ty {
        0 => (GgufValue::U8(b(1)?[0]), pos + 1),
        1 => (GgufValue::I8(b(1)?[0] as i8), pos + 1),
        2 => (GgufValue::U16(u16::from_le_bytes(b(2)?.try_into().ok()?)), pos + 2),
        3 => (GgufValue::I16(i16::from_le_bytes(b(2)?.try_into().ok()?)), pos + 2),
        4 => (GgufValue::U32(u32::from_le_bytes(b(4)?.try_into().ok()?)), pos + 4),
        5 => (GgufValue::I32(i32::from_le_bytes(b(4)?.try_into().ok()?)), pos + 4),
        6 => (GgufValue::F32(f32::from_le_bytes(b(4)?.try_into().ok()?)), pos + 4),
        7 => (GgufValue::Bool(b(1)?[0] != 0), pos + 1),
        8 => {
            let n = u64::from_le_bytes(a(8)?) as usize;
            let s = std::str::from_utf8(buf.get(pos + 8..pos + 8 + n)?).ok()?;
            (GgufValue::String(s.to_owned()), pos + 8 + n)
        }
        9 => {
            let elem_type = u32::from_le_bytes(b(4)?.try_into().ok()?);
            let len = u64::from_le_bytes(buf.get(pos + 4..pos + 12)?.try_into().ok()?) as usize;
            let start = pos + 12;
            let mut end = start;
            for _ in 0..len {
                end = skip_valid(buf, end, elem_type)?;
            }
            (GgufValue::Array(GgufArray { bytes: bytes.clone(), elem_type, len, start, end }), end)
        }
        10 => (GgufValue::U64(u64::from_le_bytes(a(8)?)), pos + 8),
        11 => (GgufValue::I64(i64::from_le_bytes(a(8)?)), pos + 8),
        12 => (GgufValue::F64(f64::from_le_bytes(a(8)?)), pos + 8),
        _ => return None,
    })
}

/// The position after one already-validated value of type `ty` at `pos`.
fn skip_valid(buf: &[u8], pos: usize, ty: u32) -> Option<usize> {
    match ty {
        8 => Some(pos + 8 + u64::from_le_bytes(buf.get(pos..pos + 8)?.try_into().ok()?) as usize),
        9 => {
            let elem_type = u32::from_le_bytes(buf.get(pos..pos + 4)?.try_into().ok()?);
            let len = u64::from_le_bytes(buf.get(pos + 4..pos + 12)?.try_into().ok()?) as usize;
            match fixed_size(elem_type) {
                Some(sz) => Some(pos + 12 + len * sz),
                None => {
                    let mut p = pos + 12;
                    for _ in 0..len {
                        p = skip_valid(buf, p, elem_type)?;
                    }
                    Some(p)
                }
            }
        }
        t => Some(pos + fixed_size(t)?),
    }
}

/// Encoded size of a fixed-size value type (`None` for strings, arrays and unknown types).
fn fixed_size(ty: u32) -> Option<usize> {
    Some(match ty {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        10..=12 => 8,
        _ => return None,
    })
}

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
    file: String,
    bytes: Bytes,
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

/// The smallest encoded size of a value of type `ty`, or `None` if `ty` is
/// not a GGUF value type.
fn min_value_size(ty: u32) -> Option<usize> {
    Some(match ty {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        8 | 10..=12 => 8,
        9 => 12,
        _ => return None,
    })
}

fn align_up(x: usize, a: usize) -> Option<usize> {
    x.checked_add(a - 1).map(|v| v / a * a)
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
        super::check::refuse_lfs_pointer(buf, file_name, FORMAT)?;
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

fn unsupported(file: &str, tensor: &str, dtype: DType) -> StudioError {
    StudioError::UnsupportedDType {
        file: file.to_string(),
        tensor: tensor.to_string(),
        dtype: dtype.to_string(),
        hint: format!("supported GGML types: {}", quant::SUPPORTED),
    }
}

/// Maps a llama.cpp tensor name to its Hugging Face name, or `None` for a
/// name outside the dense llama/qwen2 set.
///
/// `token_embd.weight` → `model.embed_tokens.weight`, `output_norm.weight` →
/// `model.norm.weight`, `output.weight` → `lm_head.weight`, and per block
/// `blk.N.{attn_norm, attn_q, attn_k, attn_v, attn_output, attn_q_norm,
/// attn_k_norm, ffn_norm, ffn_gate, ffn_up, ffn_down}.{weight,bias}` →
/// `model.layers.N.{input_layernorm, self_attn.q_proj, self_attn.k_proj,
/// self_attn.v_proj, self_attn.o_proj, self_attn.q_norm, self_attn.k_norm,
/// post_attention_layernorm, mlp.gate_proj, mlp.up_proj,
/// mlp.down_proj}.{weight,bias}`.
pub fn hf_name(gguf_name: &str) -> Option<String> {
    match gguf_name {
        "token_embd.weight" => return Some("model.embed_tokens.weight".into()),
        "output_norm.weight" => return Some("model.norm.weight".into()),
        "output.weight" => return Some("lm_head.weight".into()),
        _ => {}
    }
    let rest = gguf_name.strip_prefix("blk.")?;
    let (layer, rest) = rest.split_once('.')?;
    if layer.is_empty() || !layer.bytes().all(|b| b.is_ascii_digit()) || (layer.len() > 1 && layer.starts_with('0')) {
        return None;
    }
    let (module, suffix) = rest.rsplit_once('.')?;
    if suffix != "weight" && suffix != "bias" {
        return None;
    }
    let hf = match module {
        "attn_norm" => "input_layernorm",
        "attn_q" => "self_attn.q_proj",
        "attn_k" => "self_attn.k_proj",
        "attn_v" => "self_attn.v_proj",
        "attn_output" => "self_attn.o_proj",
        "attn_q_norm" => "self_attn.q_norm",
        "attn_k_norm" => "self_attn.k_norm",
        "ffn_norm" => "post_attention_layernorm",
        "ffn_gate" => "mlp.gate_proj",
        "ffn_up" => "mlp.up_proj",
        "ffn_down" => "mlp.down_proj",
        _ => return None,
    };
    Some(format!("model.layers.{layer}.{hf}.{suffix}"))
}

/// Which rows of a tensor need llama.cpp's q/k permutation undone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Permute {
    None,
    Q,
    K,
}

#[derive(Debug, Clone)]
struct Entry {
    /// Index into `GgufFile::tensors`.
    index: usize,
    info: TensorInfo,
    permute: Permute,
    /// `(e, E)`: expert `e` of a stacked `[E, ...]` expert tensor.
    slice: Option<(usize, usize)>,
    /// `(i, N)`: the `i`-th of `N` equal column blocks of a 2-D tensor
    /// (shared expert `i` of DeepSeek's concatenated `ffn_down_shexp`).
    cols: Option<(usize, usize)>,
    /// The file holds `1 + w` for an RMSNorm weight the family applies as
    /// `1 + w` (llama.cpp's Gemma converter); read back as `w`.
    minus_one: bool,
}

/// [`hf_name`] with a family's own block names
/// ([`crate::config::family::Family::gguf_block_names`]) taking precedence.
fn family_hf_name(family: Option<&crate::config::family::Family>, gguf_name: &str) -> Option<String> {
    let own = |f: &crate::config::family::Family| -> Option<String> {
        let (layer, rest) = gguf_name.strip_prefix("blk.")?.split_once('.')?;
        let (module, suffix) = rest.rsplit_once('.')?;
        let (_, hf) = f.gguf_block_names.iter().find(|(g, _)| *g == module)?;
        // Same layer / suffix rules as the common names.
        hf_name(&format!("blk.{layer}.attn_q.{suffix}"))?;
        Some(format!("model.layers.{layer}.{hf}.{suffix}"))
    };
    family.and_then(own).or_else(|| hf_name(gguf_name))
}

/// llama.cpp's DeepSeek-MoE v1 architecture (Llama attention; leading dense
/// layers, ungated shared experts, un-normalised top-k:
/// [`crate::layout::deepseek_moe`]).
const DEEPSEEK: &str = "deepseek";

/// The family whose blocks a GGUF architecture holds: the family registry's
/// (`llama`, `qwen2`, ...), and Llama's for `deepseek`.
fn reader_family(arch: &str) -> Option<&'static crate::config::family::Family> {
    crate::config::family::by_gguf_arch(arch)
        .or_else(|| (arch == DEEPSEEK).then(|| crate::config::family::of(crate::config::Architecture::Llama)))
}

/// The GGUF architectures the reader takes, for errors.
fn supported_archs() -> String {
    format!("{}, {DEEPSEEK}", crate::config::family::supported_gguf_archs())
}

/// `(layer, projection)` of DeepSeek's shared FFN `blk.N.ffn_{gate,up,down}_shexp.weight`.
fn shexp_name(gguf_name: &str) -> Option<(usize, crate::layout::names::Proj)> {
    use crate::layout::names::Proj;
    let (layer, rest) = gguf_name.strip_prefix("blk.")?.split_once('.')?;
    let proj = match rest {
        "ffn_gate_shexp.weight" => Proj::Gate,
        "ffn_up_shexp.weight" => Proj::Up,
        "ffn_down_shexp.weight" => Proj::Down,
        _ => return None,
    };
    Some((layer.parse().ok()?, proj))
}

/// The studio shared experts (each of the dense width) behind a `deepseek`
/// file's shared FFN of width `expert_feed_forward_length ·
/// expert_shared_count`: `moe_studio.shared_experts` when the studio wrote
/// the file (0: the FFN is a zero stand-in), else that width over
/// `feed_forward_length`.
///
/// # Errors
/// [`StudioError::Config`] naming the file when a key is missing or the
/// width is not a whole number of dense FFNs.
fn deepseek_shared_experts(file: &GgufFile) -> Result<usize> {
    if let Some(n) = file.get("moe_studio.shared_experts").and_then(GgufValue::as_u64) {
        return Ok(n as usize);
    }
    let get = |k: &str| {
        file.get(&format!("{DEEPSEEK}.{k}")).and_then(GgufValue::as_u64).map(|v| v as usize).ok_or_else(|| {
            StudioError::config(&file.file, format!("GGUF metadata `{DEEPSEEK}.{k}` is missing or not an integer"))
        })
    };
    let (w, n, f) = (get("expert_feed_forward_length")?, get("expert_shared_count")?, get("feed_forward_length")?);
    if f == 0 || (w * n) % f != 0 {
        return Err(StudioError::config(
            &file.file,
            format!(
                "the shared FFN is {w} x {n} = {} units wide, not a whole number of dense FFNs of \
                 `{DEEPSEEK}.feed_forward_length` = {f} (the studio's shared experts have the dense width)",
                w * n
            ),
        ));
    }
    Ok(w * n / f)
}

/// The canonical MoE names of a llama.cpp MoE tensor: `blk.N.ffn_gate_inp.weight`
/// is the router of layer `N`; `blk.N.ffn_{gate,up,down}_exps.weight` (ne
/// `[in, out, E]`) stack the `E` experts' projections.
fn moe_names(gguf_name: &str, ne: &[u64]) -> Option<Vec<String>> {
    use crate::layout::names::{expert_weight_name, router_weight_name, Proj};
    let rest = gguf_name.strip_prefix("blk.")?;
    let (layer, rest) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let proj = match rest {
        "ffn_gate_inp.weight" => return Some(vec![router_weight_name(layer)]),
        "ffn_gate_exps.weight" => Proj::Gate,
        "ffn_up_exps.weight" => Proj::Up,
        "ffn_down_exps.weight" => Proj::Down,
        _ => return None,
    };
    let e = *ne.get(2)? as usize;
    (ne.len() == 3).then(|| (0..e).map(|x| expert_weight_name(layer, x, proj)).collect())
}

/// A GGUF checkpoint viewed as a [`TensorSource`] with Hugging Face names
/// and PyTorch shapes.
///
/// Tensors with a known llama.cpp name are renamed by [`hf_name`]; others
/// keep their GGUF name. Shapes are `ne` reversed (`[out_features,
/// in_features]` for linear weights). [`TensorInfo::dtype`] is the GGML
/// storage type. A family's own block names come first
/// ([`crate::config::family::Family::gguf_block_names`]: Gemma's sandwich
/// norms, Phi-3's fused `attn_qkv` / `ffn_up`, split later by
/// [`crate::checkpoint::fused::FusedSource`]); for a family applying its
/// RMSNorms as `1 + w` (Gemma), every `*norm.weight` is read as the stored
/// value minus 1, since llama.cpp's converter stores `1 + w` (transformers'
/// GGUF loader subtracts 1 the same way). For architecture `llama`, the rows of q_proj and k_proj
/// (weights and biases) are un-permuted on read, undoing the interleaved-RoPE
/// permutation of llama.cpp's `convert_hf_to_gguf.py` exactly as
/// transformers' GGUF loader does (`reverse_permute_weights`): for `n` heads
/// (`attention.head_count` for q, `attention.head_count_kv` for k), view the
/// rows as `[n, head_dim / 2, 2, ...]`, swap axes 1 and 2, and flatten back,
/// i.e. HF row `h*hd + j*hd/2 + i` = GGUF row `h*hd + 2*i + j`. For `qwen2`
/// nothing is permuted. `deepseek` (DeepSeek-MoE v1) reads as Llama blocks;
/// its shared FFN `blk.N.ffn_{gate,up,down}_shexp.weight` is shown as the
/// studio's shared experts of the dense width (gate/up: row blocks; down:
/// column blocks; [`deepseek_shared_experts`]), or keeps its GGUF names when
/// it is the studio's zero stand-in.
#[derive(Debug, Clone)]
pub struct GgufModel {
    /// The parsed file.
    pub file: GgufFile,
    /// `general.architecture` (empty when absent).
    pub architecture: String,
    entries: Vec<Entry>,
    by_name: HashMap<String, usize>,
}

/// Parses a GGUF file into a [`GgufModel`].
///
/// Any architecture parses (so metadata and the tokenizer can be inspected);
/// [`GgufModel::model_config`] checks the architecture is supported.
///
/// # Errors
/// Those of [`GgufFile::parse`]; [`StudioError::Format`] when two tensors map
/// to the same Hugging Face name.
pub fn open(bytes: Bytes, file_name: &str) -> Result<GgufModel> {
    GgufModel::new(GgufFile::parse(bytes, file_name)?)
}

impl GgufModel {
    /// Builds the Hugging Face view of a parsed file.
    ///
    /// # Errors
    /// [`StudioError::Format`] when two tensors map to the same name.
    pub fn new(file: GgufFile) -> Result<GgufModel> {
        let architecture = file.get_str("general.architecture").unwrap_or("").to_string();
        let family = reader_family(&architecture);
        // (A file the studio cannot hold still parses, its shared FFN under
        // its GGUF names; `moe_config` says why.)
        let deepseek_shared = if architecture == DEEPSEEK { deepseek_shared_experts(&file).unwrap_or(0) } else { 0 };
        let permuted = family.is_some_and(|f| f.gguf_permuted_qk);
        let plus_one = family.is_some_and(|f| f.norm_plus_one);
        let mut entries = Vec::with_capacity(file.tensors.len());
        let mut by_name = HashMap::with_capacity(file.tensors.len());
        for (index, t) in file.tensors.iter().enumerate() {
            if let Some(experts) = moe_names(&t.name, &t.ne) {
                let n = experts.len();
                let shape = t.torch_shape();
                for (e, name) in experts.into_iter().enumerate() {
                    let (shape, slice) = if n == 1 && shape.len() == 2 {
                        (shape.clone(), None)
                    } else {
                        (shape[1..].to_vec(), Some((e, n)))
                    };
                    if by_name.insert(name.clone(), entries.len()).is_some() {
                        return Err(StudioError::format(
                            &file.file,
                            FORMAT,
                            format!("tensor `{}` maps to `{name}`, which another tensor already has", t.name),
                        ));
                    }
                    entries.push(Entry {
                        index,
                        info: TensorInfo { name, dtype: t.dtype, shape },
                        permute: Permute::None,
                        slice,
                        cols: None,
                        minus_one: false,
                    });
                }
                continue;
            }
            if let Some((layer, proj)) = shexp_name(&t.name).filter(|_| deepseek_shared > 0) {
                // DeepSeek's shared FFN: the studio's shared experts side by
                // side (none: a zero stand-in, checked by `moe_config`, that
                // keeps its GGUF names).
                for i in 0..deepseek_shared {
                    let name = crate::layout::names::shared_expert_weight_name(layer, i, proj);
                    let full = t.torch_shape();
                    let (shape, slice, cols) = match (proj, full.as_slice()) {
                        (crate::layout::names::Proj::Down, [d, w]) => {
                            (vec![*d, w / deepseek_shared], None, Some((i, deepseek_shared)))
                        }
                        (_, [w, d]) => (vec![w / deepseek_shared, *d], Some((i, deepseek_shared)), None),
                        _ => (full.clone(), None, None),
                    };
                    if by_name.insert(name.clone(), entries.len()).is_some() {
                        return Err(StudioError::format(
                            &file.file,
                            FORMAT,
                            format!("tensor `{}` maps to `{name}`, which another tensor already has", t.name),
                        ));
                    }
                    entries.push(Entry {
                        index,
                        info: TensorInfo { name, dtype: t.dtype, shape },
                        permute: Permute::None,
                        slice,
                        cols,
                        minus_one: false,
                    });
                }
                continue;
            }
            let name = family_hf_name(family, &t.name).unwrap_or_else(|| t.name.clone());
            let permute = if !permuted {
                Permute::None
            } else if name.contains(".self_attn.q_proj.") {
                Permute::Q
            } else if name.contains(".self_attn.k_proj.") {
                Permute::K
            } else {
                Permute::None
            };
            if by_name.insert(name.clone(), entries.len()).is_some() {
                return Err(StudioError::format(
                    &file.file,
                    FORMAT,
                    format!("tensor `{}` maps to Hugging Face name `{name}`, which another tensor already has", t.name),
                ));
            }
            let minus_one = plus_one && name.starts_with("model.") && name.ends_with("norm.weight");
            entries.push(Entry {
                index,
                info: TensorInfo { name, dtype: t.dtype, shape: t.torch_shape() },
                permute,
                slice: None,
                cols: None,
                minus_one,
            });
        }
        Ok(GgufModel { file, architecture, entries, by_name })
    }

    /// The GGUF tensor info behind a Hugging Face name.
    pub fn gguf_tensor(&self, hf_name: &str) -> Option<&GgufTensorInfo> {
        self.by_name.get(hf_name).map(|&i| &self.file.tensors[self.entries[i].index])
    }

    /// Checks that every tensor can be dequantized.
    ///
    /// # Errors
    /// [`StudioError::UnsupportedDType`] naming the file and the first
    /// tensor (Hugging Face name) of an unsupported GGML type.
    pub fn check_dtypes(&self) -> Result<()> {
        for e in &self.entries {
            if !quant::is_supported(e.info.dtype) {
                return Err(unsupported(&self.file.file, &e.info.name, e.info.dtype));
            }
        }
        Ok(())
    }

    /// `{general.architecture}.{suffix}`.
    pub(crate) fn meta_key(&self, suffix: &str) -> String {
        format!("{}.{suffix}", self.architecture)
    }

    /// The integer metadata `{arch}.{suffix}` (`None` when absent and not
    /// `required`).
    ///
    /// # Errors
    /// [`StudioError::Config`] naming the file and key when it is missing but
    /// required, or not a non-negative integer.
    pub(crate) fn meta_usize(&self, suffix: &str, required: bool) -> Result<Option<usize>> {
        let key = self.meta_key(suffix);
        match self.file.get(&key) {
            None if required => Err(StudioError::config(&self.file.file, format!("GGUF metadata `{key}` is missing"))),
            None => Ok(None),
            Some(v) => match v.as_u64().and_then(|x| usize::try_from(x).ok()) {
                Some(x) => Ok(Some(x)),
                None => Err(StudioError::config(
                    &self.file.file,
                    format!("GGUF metadata `{key}` must be a non-negative integer, found {} {v:?}", v.type_name()),
                )),
            },
        }
    }

    /// The numeric metadata `{arch}.{suffix}`, `None` when absent.
    ///
    /// # Errors
    /// [`StudioError::Config`] naming the file and key when it is not a number.
    pub(crate) fn meta_f64(&self, suffix: &str) -> Result<Option<f64>> {
        let key = self.meta_key(suffix);
        match self.file.get(&key) {
            None => Ok(None),
            Some(v) => v.as_f64().map(Some).ok_or_else(|| {
                StudioError::config(
                    &self.file.file,
                    format!("GGUF metadata `{key}` must be a number, found {} {v:?}", v.type_name()),
                )
            }),
        }
    }

    fn heads(&self) -> Result<(usize, usize)> {
        let n_head = self.meta_usize("attention.head_count", true)?.unwrap_or(0);
        let n_kv = self.meta_usize("attention.head_count_kv", false)?.unwrap_or(n_head);
        Ok((n_head, n_kv))
    }

    /// The model configuration from the `{arch}.*` and `tokenizer.ggml.*`
    /// metadata.
    ///
    /// Keys (for `arch` = `general.architecture`): `embedding_length` (d),
    /// `feed_forward_length` (f), `block_count` (L), `attention.head_count`,
    /// `attention.head_count_kv` (default: head_count),
    /// `attention.key_length` (head_dim; default d / head_count),
    /// `attention.layer_norm_rms_epsilon`, `rope.freq_base` (default 10000),
    /// `context_length` (default 2048), `rope.dimension_count` (must equal
    /// head_dim: partial rotary is not supported), `rope.scaling.type` /
    /// `rope.scaling.factor` (none or linear), the tensor `rope_freqs.weight`
    /// (llama.cpp's per-frequency divisors: read back as the Llama 3.1
    /// scaling they encode, [`crate::model::rope::llama3_from_freq_factors`]).
    /// The vocabulary size is the
    /// length of `tokenizer.ggml.tokens` (else `{arch}.vocab_size`, else the
    /// embedding rows); embeddings are tied when there is no `output.weight`;
    /// attention biases are on for qwen2 or when `blk.0.attn_q.bias` exists;
    /// bos/eos come from `tokenizer.ggml.{bos,eos}_token_id`; then the
    /// family's own keys ([`crate::config::family::Family::read_gguf`]:
    /// Gemma's soft-caps and sliding-window pattern, Phi-3's LongRoPE).
    ///
    /// # Errors
    /// [`StudioError::Config`] naming the file for an architecture outside
    /// [`crate::config::family::supported_gguf_archs`] (listed), a missing or mistyped required key, an unsupported
    /// RoPE scaling (or both a scaling type and `rope_freqs.weight`), or
    /// inconsistent sizes ([`ModelConfig::validate`]);
    /// [`StudioError::UnsupportedDType`] naming the file and tensor when a
    /// tensor's GGML type cannot be dequantized.
    pub fn model_config(&self) -> Result<ModelConfig> {
        let src = &self.file.file;
        let family = reader_family(&self.architecture);
        let architecture = match (self.architecture.as_str(), family) {
            (_, Some(f)) => f.architecture,
            ("", _) => {
                return Err(StudioError::config(
                    src,
                    format!("GGUF metadata `general.architecture` is missing (supported: {})", supported_archs()),
                ))
            }
            (other, None) => {
                return Err(StudioError::config(
                    src,
                    format!("unsupported GGUF architecture `{other}` (supported: {})", supported_archs()),
                ))
            }
        };
        self.check_dtypes()?;
        let req = |k: &str| -> Result<usize> { Ok(self.meta_usize(k, true)?.unwrap_or(0)) };
        let hidden_size = req("embedding_length")?;
        let intermediate_size = req("feed_forward_length")?;
        let num_layers = req("block_count")?;
        let (num_heads, num_kv_heads) = self.heads()?;
        if num_heads == 0 {
            return Err(StudioError::config(src, format!("`{}` must be > 0", self.meta_key("attention.head_count"))));
        }
        let head_dim = match self.meta_usize("attention.key_length", false)? {
            Some(k) => k,
            None => hidden_size / num_heads,
        };
        if let Some(rot) = self.meta_usize("rope.dimension_count", false)? {
            if rot != head_dim {
                return Err(StudioError::config(
                    src,
                    format!(
                        "`{}` = {rot} differs from head_dim {head_dim}: partial rotary embeddings are not supported",
                        self.meta_key("rope.dimension_count")
                    ),
                ));
            }
        }
        let rms_norm_eps = self.meta_f64("attention.layer_norm_rms_epsilon")?.ok_or_else(|| {
            StudioError::config(
                src,
                format!("GGUF metadata `{}` is missing", self.meta_key("attention.layer_norm_rms_epsilon")),
            )
        })?;
        let rope_theta = self.meta_f64("rope.freq_base")?.unwrap_or(10000.0);
        let max_position_embeddings = self.meta_usize("context_length", false)?.unwrap_or(2048);
        let scaling_type = self.file.get_str(&self.meta_key("rope.scaling.type"));
        let rope_scaling = match scaling_type {
            None | Some("none") => RopeScaling::Default,
            Some("linear") => {
                let factor = self.meta_f64("rope.scaling.factor")?.ok_or_else(|| {
                    StudioError::config(
                        src,
                        format!("linear RoPE scaling needs `{}`", self.meta_key("rope.scaling.factor")),
                    )
                })?;
                RopeScaling::Linear { factor }
            }
            Some(other) => {
                return Err(StudioError::config(
                    src,
                    format!(
                        "unsupported RoPE scaling `{}` = \"{other}\" (supported: none, linear)",
                        self.meta_key("rope.scaling.type")
                    ),
                ))
            }
        };
        let rope_scaling = match self.rope_freq_factors(head_dim)? {
            None => rope_scaling,
            Some(_) if rope_scaling != RopeScaling::Default => {
                return Err(StudioError::config(
                    src,
                    format!(
                        "the file has both `{}` and a `rope_freqs.weight` tensor: two RoPE scalings at once are not supported",
                        self.meta_key("rope.scaling.type")
                    ),
                ))
            }
            Some(f) => crate::model::rope::llama3_from_freq_factors(&f, head_dim, rope_theta),
        };
        let vocab_size = match self.file.get("tokenizer.ggml.tokens").and_then(GgufValue::as_array) {
            Some(a) => a.len(),
            None => match self.meta_usize("vocab_size", false)? {
                Some(v) => v,
                None => self.gguf_tensor("model.embed_tokens.weight").map(|t| t.torch_shape()[0]).unwrap_or(0),
            },
        };
        let tie_word_embeddings = self.file.tensor("output.weight").is_none();
        let attention_bias = architecture.family().qkv_bias || self.file.tensor("blk.0.attn_q.bias").is_some();
        let id = |k: &str| self.file.get(k).and_then(GgufValue::as_u64).and_then(|v| u32::try_from(v).ok());
        let cfg = ModelConfig {
            architecture,
            vocab_size,
            hidden_size,
            intermediate_size,
            num_layers,
            num_heads,
            num_kv_heads,
            head_dim,
            rms_norm_eps,
            rope_theta,
            rope_scaling,
            max_position_embeddings,
            tie_word_embeddings,
            attention_bias,
            bos_token_id: id("tokenizer.ggml.bos_token_id"),
            eos_token_id: id("tokenizer.ggml.eos_token_id"),
            family_params: Default::default(),
        };
        let mut cfg = cfg;
        (architecture.family().read_gguf)(self, &mut cfg)?;
        cfg.validate(src)?;
        Ok(cfg)
    }
}

impl GgufModel {
    /// llama.cpp's per-frequency RoPE divisors, the tensor
    /// `rope_freqs.weight` (`[head_dim / 2]`, F32; written by
    /// `convert_hf_to_gguf.py` for a Llama 3.1 `rope_scaling`), or `None`
    /// when the file has none.
    ///
    /// # Errors
    /// As [`GgufModel::positive_factors`].
    fn rope_freq_factors(&self, head_dim: usize) -> Result<Option<Vec<f64>>> {
        self.positive_factors("rope_freqs.weight", head_dim / 2)
    }

    /// A vector of `len` RoPE frequency factors stored as the tensor `name`
    /// (GGUF name; `rope_freqs.weight`, Phi-3's `rope_factors_{short,long}.weight`),
    /// or `None` when the file has no such tensor.
    ///
    /// # Errors
    /// [`StudioError::Tensor`] naming the file and tensor when its length is
    /// not `len` or a value is not a positive finite number;
    /// [`StudioError::UnsupportedDType`] for a type that cannot be decoded.
    pub(crate) fn positive_factors(&self, name: &str, len: usize) -> Result<Option<Vec<f64>>> {
        let Some(t) = self.file.tensor(name) else { return Ok(None) };
        if !quant::is_supported(t.dtype) {
            return Err(unsupported(&self.file.file, name, t.dtype));
        }
        if t.n_elements != len {
            return Err(StudioError::tensor(
                &self.file.file,
                name,
                format!("{} values, expected head_dim / 2 = {len} (one RoPE frequency factor each)", t.n_elements),
            ));
        }
        let v = quant::dequantize(t.dtype, self.file.tensor_bytes(t), t.n_elements)
            .map_err(|m| StudioError::tensor(&self.file.file, name, m))?;
        if let Some((i, x)) = v.iter().enumerate().find(|(_, x)| !(x.is_finite() && **x > 0.0)) {
            return Err(StudioError::tensor(
                &self.file.file,
                name,
                format!("value {i} is {x}: RoPE frequency factors must be positive and finite"),
            ));
        }
        Ok(Some(v.into_iter().map(f64::from).collect()))
    }

    /// The MoE structure of a llama.cpp MoE (`{arch}.expert_count` > 0):
    /// every layer with `expert_count` experts and `expert_used_count` per
    /// token, no router bias, temperature 1, frozen experts from
    /// `moe_studio.frozen_experts` (JSON) when the studio wrote the file; `None`
    /// for a dense model. `llama`: every layer MoE, top-k renormalised.
    /// `deepseek`: the first `leading_dense_block_count` layers dense, the
    /// experts `expert_feed_forward_length` wide, top-k not renormalised
    /// (`norm_topk_prob: false`; for `k = E` the two are the same function),
    /// ungated shared experts as [`deepseek_shared_experts`] says
    /// (`moe_studio.shared_frozen` when recorded).
    ///
    /// # Errors
    /// [`StudioError::Config`] for a mistyped key, a malformed `moe_studio.*`
    /// record or a `deepseek` file the studio cannot hold
    /// ([`GgufModel::deepseek_moe`]); [`StudioError::Tensor`] when the zero
    /// shared expert stand-in is not zero.
    pub fn moe_config(&self, num_layers: usize) -> Result<Option<crate::config::MoeConfig>> {
        let Some(e) = self.meta_usize("expert_count", false)?.filter(|&e| e > 0) else { return Ok(None) };
        let k = self.meta_usize("expert_used_count", true)?.unwrap_or(0);
        let json_meta = |key: &str| -> Result<Option<serde_json::Value>> {
            match self.file.get_str(key) {
                Some(json) => serde_json::from_str(json)
                    .map(Some)
                    .map_err(|e| StudioError::config(&self.file.file, format!("GGUF metadata `{key}`: {e}"))),
                None => Ok(None),
            }
        };
        let frozen: Vec<Vec<usize>> = match json_meta("moe_studio.frozen_experts")? {
            Some(v) => serde_json::from_value(v).map_err(|e| {
                StudioError::config(&self.file.file, format!("GGUF metadata `moe_studio.frozen_experts`: {e}"))
            })?,
            None => Vec::new(),
        };
        let shared_frozen: Vec<bool> = match json_meta("moe_studio.shared_frozen")? {
            Some(v) => serde_json::from_value(v).map_err(|e| {
                StudioError::config(&self.file.file, format!("GGUF metadata `moe_studio.shared_frozen`: {e}"))
            })?,
            None => Vec::new(),
        };
        let coef = self.file.get("moe_studio.router_aux_loss_coef").and_then(GgufValue::as_f64).unwrap_or(0.01);
        let deepseek = self.architecture == DEEPSEEK;
        let (lead, width, shared) = if deepseek { self.deepseek_moe(num_layers)? } else { (0, None, 0) };
        let layers = (0..num_layers)
            .map(|l| {
                (l >= lead).then(|| crate::config::MoeLayerSpec {
                    num_experts: e,
                    top_k: k,
                    frozen: frozen.get(l).cloned().unwrap_or_default(),
                    expert_intermediate_size: width,
                    shared_experts: shared,
                    shared_frozen: shared > 0 && shared_frozen.get(l).copied().unwrap_or(false),
                    norm_topk_prob: !deepseek,
                    ..Default::default()
                })
            })
            .collect();
        Ok(Some(crate::config::MoeConfig { layers, router_aux_loss_coef: coef }))
    }

    /// A `deepseek` file's leading dense layers, expert width (`None`: the
    /// dense width) and shared experts ([`deepseek_shared_experts`]).
    ///
    /// # Errors
    /// [`StudioError::Config`] for an `expert_weights_scale` other than 0 or
    /// 1 (the studio has no such scale); [`StudioError::Tensor`] when the
    /// studio's zero shared expert stand-in is not zero.
    fn deepseek_moe(&self, num_layers: usize) -> Result<(usize, Option<usize>, usize)> {
        let lead = self.meta_usize("leading_dense_block_count", false)?.unwrap_or(0);
        let w = self.meta_usize("expert_feed_forward_length", true)?.unwrap_or(0);
        let f = self.meta_usize("feed_forward_length", true)?.unwrap_or(0);
        match self.meta_f64("expert_weights_scale")? {
            None => {}
            Some(x) if x == 0.0 || x == 1.0 => {}
            Some(x) => {
                return Err(StudioError::config(
                    &self.file.file,
                    format!(
                        "`{DEEPSEEK}.expert_weights_scale` = {x}: the studio has no factor on the routed experts' \
                         weights (0 or 1 expected)"
                    ),
                ))
            }
        }
        let shared = deepseek_shared_experts(&self.file)?;
        if shared == 0 {
            for l in lead..num_layers {
                let name = format!("blk.{l}.ffn_down_shexp.weight");
                let t =
                    self.file.tensor(&name).ok_or_else(|| StudioError::tensor(&self.file.file, &name, "missing"))?;
                if !quant::is_supported(t.dtype) {
                    return Err(unsupported(&self.file.file, &name, t.dtype));
                }
                let v = quant::dequantize(t.dtype, self.file.tensor_bytes(t), t.n_elements)
                    .map_err(|m| StudioError::tensor(&self.file.file, &name, m))?;
                if let Some(x) = v.iter().find(|x| **x != 0.0) {
                    return Err(StudioError::tensor(
                        &self.file.file,
                        &name,
                        format!(
                            "holds {x}, not zero, and `moe_studio.shared_experts` is 0 (the shared FFN was the \
                             studio's zero stand-in): the file was changed after it was written"
                        ),
                    ));
                }
            }
        }
        Ok((lead, (w != f).then_some(w), shared))
    }
}

/// Undoes llama.cpp's q/k row permutation in place: `data` is `rows × cols`
/// row-major with `rows = n_head * head_dim`; HF row `h*hd + j*hd/2 + i`
/// takes GGUF row `h*hd + 2*i + j`.
fn unpermute_rows(data: &[f32], rows: usize, cols: usize, n_head: usize) -> Vec<f32> {
    let hd = rows / n_head;
    let half = hd / 2;
    let mut out = vec![0f32; data.len()];
    for h in 0..n_head {
        for j in 0..2 {
            for i in 0..half {
                let dst = h * hd + j * half + i;
                let src = h * hd + 2 * i + j;
                out[dst * cols..(dst + 1) * cols].copy_from_slice(&data[src * cols..(src + 1) * cols]);
            }
        }
    }
    out
}

impl TensorSource for GgufModel {
    fn source_name(&self) -> &str {
        &self.file.file
    }

    fn tensors(&self) -> Vec<TensorInfo> {
        self.entries.iter().map(|e| e.info.clone()).collect()
    }

    fn info(&self, name: &str) -> Option<TensorInfo> {
        self.by_name.get(name).map(|&i| self.entries[i].info.clone())
    }

    /// Dequantizes one tensor (Hugging Face name) to f32, row-major in the
    /// PyTorch shape, un-permuting llama q/k rows.
    ///
    /// # Errors
    /// [`StudioError::Tensor`] when the tensor is missing or its rows do not
    /// split into the metadata's heads; [`StudioError::UnsupportedDType`] for
    /// a GGML type that cannot be dequantized; [`StudioError::Config`] when
    /// a llama q/k tensor is read but the head counts are missing.
    fn read_f32(&self, name: &str) -> Result<Vec<f32>> {
        let Some(&i) = self.by_name.get(name) else {
            return Err(StudioError::tensor(&self.file.file, name, "not found in the GGUF file"));
        };
        let e = &self.entries[i];
        let t = &self.file.tensors[e.index];
        if !quant::is_supported(t.dtype) {
            return Err(unsupported(&self.file.file, name, t.dtype));
        }
        let data = match e.slice {
            None => quant::dequantize(t.dtype, self.file.tensor_bytes(t), t.n_elements),
            Some((x, n)) => {
                let bytes = self.file.tensor_bytes(t);
                let (per_bytes, per) = (bytes.len() / n, t.n_elements / n);
                if per_bytes * n != bytes.len() || quant::byte_size(t.dtype, per) != Some(per_bytes) {
                    return Err(StudioError::tensor(
                        &self.file.file,
                        name,
                        format!("the {n} experts of `{}` do not split into whole {} blocks", t.name, t.dtype),
                    ));
                }
                quant::dequantize(t.dtype, &bytes[x * per_bytes..(x + 1) * per_bytes], per)
            }
        }
        .map_err(|m| StudioError::tensor(&self.file.file, name, m))?;
        let data = match e.cols {
            None => data,
            Some((i, n)) => {
                let rows = e.info.shape[0];
                let w = data.len() / rows.max(1);
                let part = w / n;
                (0..rows).flat_map(|r| data[r * w + i * part..r * w + (i + 1) * part].iter().copied()).collect()
            }
        };
        if e.minus_one {
            return Ok(data.into_iter().map(|x| x - 1.0).collect());
        }
        if e.permute == Permute::None {
            return Ok(data);
        }
        let (n_head, n_kv) = self.heads()?;
        let n = if e.permute == Permute::Q { n_head } else { n_kv };
        let rows = e.info.shape.first().copied().unwrap_or(0);
        let cols = if e.info.shape.len() > 1 { e.info.shape[1..].iter().product() } else { 1 };
        if n == 0 || rows % n != 0 || (rows / n) % 2 != 0 {
            return Err(StudioError::tensor(
                &self.file.file,
                name,
                format!(
                    "{rows} rows do not split into {n} heads of even size (needed to undo llama.cpp's q/k permutation)"
                ),
            ));
        }
        Ok(unpermute_rows(&data, rows, cols, n))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map() {
        assert_eq!(hf_name("blk.12.attn_q.bias").as_deref(), Some("model.layers.12.self_attn.q_proj.bias"));
        assert_eq!(hf_name("blk.0.ffn_down.weight").as_deref(), Some("model.layers.0.mlp.down_proj.weight"));
        assert_eq!(hf_name("output.weight").as_deref(), Some("lm_head.weight"));
        assert_eq!(hf_name("blk.x.attn_q.weight"), None);
        assert_eq!(hf_name("blk.01.attn_q.weight"), None);
        assert_eq!(hf_name("rope_freqs.weight"), None);
    }

    #[test]
    fn unpermute_matches_definition() {
        // 2 heads of head_dim 4, 1 column: GGUF rows r -> value r.
        let data: Vec<f32> = (0..8).map(|r| r as f32).collect();
        let out = unpermute_rows(&data, 8, 1, 2);
        assert_eq!(out, vec![0., 2., 1., 3., 4., 6., 5., 7.]);
    }
}
