//! GGUF metadata values: [`GgufValue`], the lazily decoded [`GgufArray`],
//! their encoding (for the writers) and the encoded sizes of the value
//! types that the container parser checks lengths against (ggml's
//! `docs/gguf.md`, `gguf_metadata_value_type`).

use crate::tensor_io::Bytes;

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
    pub(super) bytes: Bytes,
    pub(super) elem_type: u32,
    pub(super) len: usize,
    /// Byte range of the elements in the file.
    pub(super) start: usize,
    pub(super) end: usize,
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
/// validated, which [`GgufFile::parse`](super::GgufFile::parse) rules out).
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
pub(super) fn fixed_size(ty: u32) -> Option<usize> {
    Some(match ty {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        10..=12 => 8,
        _ => return None,
    })
}

/// The smallest encoded size of a value of type `ty`, or `None` if `ty` is
/// not a GGUF value type.
pub(super) fn min_value_size(ty: u32) -> Option<usize> {
    Some(match ty {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        8 | 10..=12 => 8,
        9 => 12,
        _ => return None,
    })
}
