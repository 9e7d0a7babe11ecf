//! GGUF metadata values: the value type ids of the spec, borrowed values read
//! from a file ([`Value`], [`ArrayRef`]) and owned values for writing
//! ([`MetaValue`], [`MetaArray`]).

/// A metadata value type, with the spec's numeric id
/// (`gguf_metadata_value_type`). Multi-byte values are little-endian.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u32)]
pub enum ValueType {
    /// Unsigned 8-bit integer.
    U8 = 0,
    /// Signed 8-bit integer.
    I8 = 1,
    /// Unsigned 16-bit integer.
    U16 = 2,
    /// Signed 16-bit integer.
    I16 = 3,
    /// Unsigned 32-bit integer.
    U32 = 4,
    /// Signed 32-bit integer.
    I32 = 5,
    /// IEEE binary32.
    F32 = 6,
    /// One byte, 0 (false) or 1 (true); other bytes are invalid.
    Bool = 7,
    /// UTF-8 bytes after a `u64` byte count, no terminator.
    String = 8,
    /// Element type (`u32`), element count (`u64`), then the elements.
    Array = 9,
    /// Unsigned 64-bit integer.
    U64 = 10,
    /// Signed 64-bit integer.
    I64 = 11,
    /// IEEE binary64.
    F64 = 12,
}

/// Every value type, in id order.
pub const ALL_VALUE_TYPES: [ValueType; 13] = [
    ValueType::U8,
    ValueType::I8,
    ValueType::U16,
    ValueType::I16,
    ValueType::U32,
    ValueType::I32,
    ValueType::F32,
    ValueType::Bool,
    ValueType::String,
    ValueType::Array,
    ValueType::U64,
    ValueType::I64,
    ValueType::F64,
];

impl ValueType {
    /// The spec's numeric id.
    pub fn id(self) -> u32 {
        self as u32
    }

    /// The type with id `id`, or `None` for an id the spec does not define.
    pub fn from_id(id: u32) -> Option<Self> {
        ALL_VALUE_TYPES.get(id as usize).copied()
    }

    /// Short name used in messages: `u8`, `i8`, …, `f32`, `bool`, `str`,
    /// `arr`, `u64`, `i64`, `f64` (ggml's `gguf_type_name`).
    pub fn name(self) -> &'static str {
        match self {
            ValueType::U8 => "u8",
            ValueType::I8 => "i8",
            ValueType::U16 => "u16",
            ValueType::I16 => "i16",
            ValueType::U32 => "u32",
            ValueType::I32 => "i32",
            ValueType::F32 => "f32",
            ValueType::Bool => "bool",
            ValueType::String => "str",
            ValueType::Array => "arr",
            ValueType::U64 => "u64",
            ValueType::I64 => "i64",
            ValueType::F64 => "f64",
        }
    }

    /// Encoded size in bytes of a fixed-size value; `None` for strings and
    /// arrays.
    pub fn fixed_size(self) -> Option<usize> {
        match self {
            ValueType::U8 | ValueType::I8 | ValueType::Bool => Some(1),
            ValueType::U16 | ValueType::I16 => Some(2),
            ValueType::U32 | ValueType::I32 | ValueType::F32 => Some(4),
            ValueType::U64 | ValueType::I64 | ValueType::F64 => Some(8),
            ValueType::String | ValueType::Array => None,
        }
    }
}

impl std::fmt::Display for ValueType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A metadata value borrowed from a [`super::GgufFile`]: scalars decoded,
/// strings as slices of the file (validated UTF-8), arrays as
/// [`ArrayRef`]s decoded element by element on access.
#[derive(Clone, Copy, Debug)]
pub enum Value<'a> {
    /// `u8`.
    U8(u8),
    /// `i8`.
    I8(i8),
    /// `u16`.
    U16(u16),
    /// `i16`.
    I16(i16),
    /// `u32`.
    U32(u32),
    /// `i32`.
    I32(i32),
    /// `f32`.
    F32(f32),
    /// `bool`.
    Bool(bool),
    /// `str`, a slice of the file.
    String(&'a str),
    /// `arr`.
    Array(ArrayRef<'a>),
    /// `u64`.
    U64(u64),
    /// `i64`.
    I64(i64),
    /// `f64`.
    F64(f64),
}

impl<'a> Value<'a> {
    /// The value's type.
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(_) => ValueType::Array,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
        }
    }

    /// The string, if this is a `str`.
    pub fn as_str(&self) -> Option<&'a str> {
        match *self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// The array, if this is an `arr`.
    pub fn as_array(&self) -> Option<ArrayRef<'a>> {
        match *self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }

    /// Any integer type (`u8`…`i64`) as `u64`, if it is non-negative.
    pub fn as_uint(&self) -> Option<u64> {
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

    /// An owned copy (for writing it elsewhere or comparing).
    pub fn to_owned_value(&self) -> MetaValue {
        match *self {
            Value::U8(v) => MetaValue::U8(v),
            Value::I8(v) => MetaValue::I8(v),
            Value::U16(v) => MetaValue::U16(v),
            Value::I16(v) => MetaValue::I16(v),
            Value::U32(v) => MetaValue::U32(v),
            Value::I32(v) => MetaValue::I32(v),
            Value::F32(v) => MetaValue::F32(v),
            Value::Bool(v) => MetaValue::Bool(v),
            Value::String(s) => MetaValue::String(s.to_string()),
            Value::Array(a) => MetaValue::Array(a.to_owned_array()),
            Value::U64(v) => MetaValue::U64(v),
            Value::I64(v) => MetaValue::I64(v),
            Value::F64(v) => MetaValue::F64(v),
        }
    }
}

/// An array value in a [`super::GgufFile`]. Elements are decoded from the
/// file on access; the element type is the same for all elements (for an
/// array of arrays each inner array has its own element type).
#[derive(Clone, Copy)]
pub struct ArrayRef<'a> {
    pub(crate) data: &'a [u8],
    pub(crate) node: &'a ArrNode,
}

impl std::fmt::Debug for ArrayRef<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ArrayRef").field("elem", &self.elem_type()).field("len", &self.len()).finish()
    }
}

impl<'a> ArrayRef<'a> {
    /// The element type.
    pub fn elem_type(&self) -> ValueType {
        self.node.elem
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.node.len()
    }

    /// True for an empty array.
    pub fn is_empty(&self) -> bool {
        self.node.len() == 0
    }

    /// Element `i`, or `None` past the end.
    pub fn get(&self, i: usize) -> Option<Value<'a>> {
        if i >= self.node.len() {
            return None;
        }
        match &self.node.items {
            Items::Fixed(_) => {
                let size = self.node.elem.fixed_size()?;
                let at = self.node.pos.checked_add(i.checked_mul(size)?)?;
                decode_fixed(self.data, self.node.elem, at)
            }
            Items::Strings(starts) => str_at(self.data, *starts.get(i)?).map(Value::String),
            Items::Arrays(nodes) => nodes.get(i).map(|node| Value::Array(ArrayRef { data: self.data, node })),
        }
    }

    /// The elements in order.
    pub fn iter(&self) -> impl Iterator<Item = Value<'a>> + 'a {
        let a = *self;
        (0..a.len()).filter_map(move |i| a.get(i))
    }

    /// The elements as `T` (e.g. `Vec<u32>`, `Vec<&str>`), or `None` if the
    /// element type is not `T`'s.
    pub fn to_vec<T: ArrayElem<'a>>(&self) -> Option<Vec<T>> {
        if self.elem_type() != T::TYPE {
            return None;
        }
        let mut out = Vec::with_capacity(self.len());
        for v in self.iter() {
            out.push(T::from_value(v)?);
        }
        Some(out)
    }

    /// An owned copy.
    pub fn to_owned_array(&self) -> MetaArray {
        fn all<'b, T: ArrayElem<'b>>(a: &ArrayRef<'b>) -> Vec<T> {
            a.iter().filter_map(T::from_value).collect()
        }
        match self.elem_type() {
            ValueType::U8 => MetaArray::U8(all(self)),
            ValueType::I8 => MetaArray::I8(all(self)),
            ValueType::U16 => MetaArray::U16(all(self)),
            ValueType::I16 => MetaArray::I16(all(self)),
            ValueType::U32 => MetaArray::U32(all(self)),
            ValueType::I32 => MetaArray::I32(all(self)),
            ValueType::F32 => MetaArray::F32(all(self)),
            ValueType::Bool => MetaArray::Bool(all(self)),
            ValueType::String => {
                MetaArray::String(self.iter().filter_map(|v| v.as_str().map(str::to_string)).collect())
            }
            ValueType::Array => {
                MetaArray::Array(self.iter().filter_map(|v| v.as_array().map(|a| a.to_owned_array())).collect())
            }
            ValueType::U64 => MetaArray::U64(all(self)),
            ValueType::I64 => MetaArray::I64(all(self)),
            ValueType::F64 => MetaArray::F64(all(self)),
        }
    }
}

/// Reads `N` bytes at `at`, if they are inside `data`.
pub(crate) fn bytes_at<const N: usize>(data: &[u8], at: usize) -> Option<[u8; N]> {
    data.get(at..at.checked_add(N)?)?.try_into().ok()
}

/// Decodes a fixed-size value of type `ty` at byte `at`.
pub(crate) fn decode_fixed(data: &[u8], ty: ValueType, at: usize) -> Option<Value<'_>> {
    Some(match ty {
        ValueType::U8 => Value::U8(bytes_at::<1>(data, at)?[0]),
        ValueType::I8 => Value::I8(i8::from_le_bytes(bytes_at(data, at)?)),
        ValueType::U16 => Value::U16(u16::from_le_bytes(bytes_at(data, at)?)),
        ValueType::I16 => Value::I16(i16::from_le_bytes(bytes_at(data, at)?)),
        ValueType::U32 => Value::U32(u32::from_le_bytes(bytes_at(data, at)?)),
        ValueType::I32 => Value::I32(i32::from_le_bytes(bytes_at(data, at)?)),
        ValueType::F32 => Value::F32(f32::from_le_bytes(bytes_at(data, at)?)),
        ValueType::Bool => Value::Bool(bytes_at::<1>(data, at)?[0] != 0),
        ValueType::U64 => Value::U64(u64::from_le_bytes(bytes_at(data, at)?)),
        ValueType::I64 => Value::I64(i64::from_le_bytes(bytes_at(data, at)?)),
        ValueType::F64 => Value::F64(f64::from_le_bytes(bytes_at(data, at)?)),
        ValueType::String | ValueType::Array => return None,
    })
}

/// The string whose `u64` length prefix starts at byte `at` (validated when
/// the file was parsed).
pub(crate) fn str_at(data: &[u8], at: usize) -> Option<&str> {
    let len = usize::try_from(u64::from_le_bytes(bytes_at(data, at)?)).ok()?;
    let start = at.checked_add(8)?;
    std::str::from_utf8(data.get(start..start.checked_add(len)?)?).ok()
}

/// Element types of typed array access ([`ArrayRef::to_vec`],
/// [`super::GgufFile::get_arr_of`]): the fixed-size types, `bool` and `&str`.
pub trait ArrayElem<'a>: Sized {
    /// The GGUF element type.
    const TYPE: ValueType;
    /// The element, if `v` is of type [`ArrayElem::TYPE`].
    fn from_value(v: Value<'a>) -> Option<Self>;
}

macro_rules! array_elem {
    ($($t:ty => $var:ident),* $(,)?) => {$(
        impl<'a> ArrayElem<'a> for $t {
            const TYPE: ValueType = ValueType::$var;
            fn from_value(v: Value<'a>) -> Option<Self> {
                match v {
                    Value::$var(x) => Some(x),
                    _ => None,
                }
            }
        }
    )*};
}

array_elem!(u8 => U8, i8 => I8, u16 => U16, i16 => I16, u32 => U32, i32 => I32, f32 => F32, bool => Bool,
    u64 => U64, i64 => I64, f64 => F64, &'a str => String);

/// An owned metadata value, for [`super::GgufWriter`] and for comparing what
/// was read with what was written. Equality compares floats by their bits
/// (so NaN equals the same NaN and `0.0 != -0.0`): "the same bytes in the file".
#[derive(Clone, Debug)]
pub enum MetaValue {
    /// `u8`.
    U8(u8),
    /// `i8`.
    I8(i8),
    /// `u16`.
    U16(u16),
    /// `i16`.
    I16(i16),
    /// `u32`.
    U32(u32),
    /// `i32`.
    I32(i32),
    /// `f32`.
    F32(f32),
    /// `bool`.
    Bool(bool),
    /// `str` (UTF-8).
    String(String),
    /// `arr`.
    Array(MetaArray),
    /// `u64`.
    U64(u64),
    /// `i64`.
    I64(i64),
    /// `f64`.
    F64(f64),
}

/// An owned array value: one element type for all elements. An array of
/// arrays (`Array`) may hold inner arrays of different element types, as the
/// spec allows.
#[derive(Clone, Debug)]
pub enum MetaArray {
    /// `u8` elements.
    U8(Vec<u8>),
    /// `i8` elements.
    I8(Vec<i8>),
    /// `u16` elements.
    U16(Vec<u16>),
    /// `i16` elements.
    I16(Vec<i16>),
    /// `u32` elements.
    U32(Vec<u32>),
    /// `i32` elements.
    I32(Vec<i32>),
    /// `f32` elements.
    F32(Vec<f32>),
    /// `bool` elements.
    Bool(Vec<bool>),
    /// `str` elements.
    String(Vec<String>),
    /// `arr` elements (nested arrays).
    Array(Vec<MetaArray>),
    /// `u64` elements.
    U64(Vec<u64>),
    /// `i64` elements.
    I64(Vec<i64>),
    /// `f64` elements.
    F64(Vec<f64>),
}

impl MetaValue {
    /// The value's type.
    pub fn value_type(&self) -> ValueType {
        match self {
            MetaValue::U8(_) => ValueType::U8,
            MetaValue::I8(_) => ValueType::I8,
            MetaValue::U16(_) => ValueType::U16,
            MetaValue::I16(_) => ValueType::I16,
            MetaValue::U32(_) => ValueType::U32,
            MetaValue::I32(_) => ValueType::I32,
            MetaValue::F32(_) => ValueType::F32,
            MetaValue::Bool(_) => ValueType::Bool,
            MetaValue::String(_) => ValueType::String,
            MetaValue::Array(_) => ValueType::Array,
            MetaValue::U64(_) => ValueType::U64,
            MetaValue::I64(_) => ValueType::I64,
            MetaValue::F64(_) => ValueType::F64,
        }
    }

    /// Appends the value's encoding (without the type id) to `out`.
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        match self {
            MetaValue::U8(v) => out.push(*v),
            MetaValue::I8(v) => out.extend_from_slice(&v.to_le_bytes()),
            MetaValue::U16(v) => out.extend_from_slice(&v.to_le_bytes()),
            MetaValue::I16(v) => out.extend_from_slice(&v.to_le_bytes()),
            MetaValue::U32(v) => out.extend_from_slice(&v.to_le_bytes()),
            MetaValue::I32(v) => out.extend_from_slice(&v.to_le_bytes()),
            MetaValue::F32(v) => out.extend_from_slice(&v.to_le_bytes()),
            MetaValue::Bool(v) => out.push(u8::from(*v)),
            MetaValue::String(s) => encode_str(s, out),
            MetaValue::Array(a) => a.encode(out),
            MetaValue::U64(v) => out.extend_from_slice(&v.to_le_bytes()),
            MetaValue::I64(v) => out.extend_from_slice(&v.to_le_bytes()),
            MetaValue::F64(v) => out.extend_from_slice(&v.to_le_bytes()),
        }
    }
}

/// Appends a GGUF string (`u64` byte count, then the bytes).
pub(crate) fn encode_str(s: &str, out: &mut Vec<u8>) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

impl MetaArray {
    /// The element type.
    pub fn elem_type(&self) -> ValueType {
        match self {
            MetaArray::U8(_) => ValueType::U8,
            MetaArray::I8(_) => ValueType::I8,
            MetaArray::U16(_) => ValueType::U16,
            MetaArray::I16(_) => ValueType::I16,
            MetaArray::U32(_) => ValueType::U32,
            MetaArray::I32(_) => ValueType::I32,
            MetaArray::F32(_) => ValueType::F32,
            MetaArray::Bool(_) => ValueType::Bool,
            MetaArray::String(_) => ValueType::String,
            MetaArray::Array(_) => ValueType::Array,
            MetaArray::U64(_) => ValueType::U64,
            MetaArray::I64(_) => ValueType::I64,
            MetaArray::F64(_) => ValueType::F64,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            MetaArray::U8(v) => v.len(),
            MetaArray::I8(v) => v.len(),
            MetaArray::U16(v) => v.len(),
            MetaArray::I16(v) => v.len(),
            MetaArray::U32(v) => v.len(),
            MetaArray::I32(v) => v.len(),
            MetaArray::F32(v) => v.len(),
            MetaArray::Bool(v) => v.len(),
            MetaArray::String(v) => v.len(),
            MetaArray::Array(v) => v.len(),
            MetaArray::U64(v) => v.len(),
            MetaArray::I64(v) => v.len(),
            MetaArray::F64(v) => v.len(),
        }
    }

    /// True for an empty array.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Nesting depth: 1 for an array of non-arrays, 1 + the deepest inner
    /// array otherwise.
    pub fn depth(&self) -> usize {
        match self {
            MetaArray::Array(v) => 1 + v.iter().map(MetaArray::depth).max().unwrap_or(0),
            _ => 1,
        }
    }

    /// Appends element type id, count and elements.
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.elem_type().id().to_le_bytes());
        out.extend_from_slice(&(self.len() as u64).to_le_bytes());
        macro_rules! le {
            ($v:expr) => {
                for x in $v {
                    out.extend_from_slice(&x.to_le_bytes());
                }
            };
        }
        match self {
            MetaArray::U8(v) => out.extend_from_slice(v),
            MetaArray::I8(v) => le!(v),
            MetaArray::U16(v) => le!(v),
            MetaArray::I16(v) => le!(v),
            MetaArray::U32(v) => le!(v),
            MetaArray::I32(v) => le!(v),
            MetaArray::F32(v) => le!(v),
            MetaArray::Bool(v) => out.extend(v.iter().map(|&b| u8::from(b))),
            MetaArray::String(v) => v.iter().for_each(|s| encode_str(s, out)),
            MetaArray::Array(v) => v.iter().for_each(|a| a.encode(out)),
            MetaArray::U64(v) => le!(v),
            MetaArray::I64(v) => le!(v),
            MetaArray::F64(v) => le!(v),
        }
    }
}

fn same_bits<T: Copy, const N: usize>(a: &[T], b: &[T], bits: impl Fn(T) -> [u8; N]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(&x, &y)| bits(x) == bits(y))
}

impl PartialEq for MetaArray {
    fn eq(&self, other: &Self) -> bool {
        use MetaArray::*;
        match (self, other) {
            (U8(a), U8(b)) => a == b,
            (I8(a), I8(b)) => a == b,
            (U16(a), U16(b)) => a == b,
            (I16(a), I16(b)) => a == b,
            (U32(a), U32(b)) => a == b,
            (I32(a), I32(b)) => a == b,
            (F32(a), F32(b)) => same_bits(a, b, f32::to_le_bytes),
            (Bool(a), Bool(b)) => a == b,
            (String(a), String(b)) => a == b,
            (Array(a), Array(b)) => a == b,
            (U64(a), U64(b)) => a == b,
            (I64(a), I64(b)) => a == b,
            (F64(a), F64(b)) => same_bits(a, b, f64::to_le_bytes),
            _ => false,
        }
    }
}

impl PartialEq for MetaValue {
    fn eq(&self, other: &Self) -> bool {
        use MetaValue::*;
        match (self, other) {
            (U8(a), U8(b)) => a == b,
            (I8(a), I8(b)) => a == b,
            (U16(a), U16(b)) => a == b,
            (I16(a), I16(b)) => a == b,
            (U32(a), U32(b)) => a == b,
            (I32(a), I32(b)) => a == b,
            (F32(a), F32(b)) => a.to_bits() == b.to_bits(),
            (Bool(a), Bool(b)) => a == b,
            (String(a), String(b)) => a == b,
            (Array(a), Array(b)) => a == b,
            (U64(a), U64(b)) => a == b,
            (I64(a), I64(b)) => a == b,
            (F64(a), F64(b)) => a.to_bits() == b.to_bits(),
            _ => false,
        }
    }
}

macro_rules! from_scalar {
    ($($t:ty => $var:ident),* $(,)?) => {$(
        impl From<$t> for MetaValue {
            fn from(v: $t) -> Self {
                MetaValue::$var(v)
            }
        }
        impl From<Vec<$t>> for MetaArray {
            fn from(v: Vec<$t>) -> Self {
                MetaArray::$var(v)
            }
        }
        impl From<Vec<$t>> for MetaValue {
            fn from(v: Vec<$t>) -> Self {
                MetaValue::Array(MetaArray::$var(v))
            }
        }
    )*};
}

from_scalar!(u8 => U8, i8 => I8, u16 => U16, i16 => I16, u32 => U32, i32 => I32, f32 => F32, bool => Bool,
    String => String, u64 => U64, i64 => I64, f64 => F64);

impl From<&str> for MetaValue {
    fn from(v: &str) -> Self {
        MetaValue::String(v.to_string())
    }
}

impl From<Vec<&str>> for MetaValue {
    fn from(v: Vec<&str>) -> Self {
        MetaValue::Array(MetaArray::String(v.into_iter().map(str::to_string).collect()))
    }
}

impl From<MetaArray> for MetaValue {
    fn from(v: MetaArray) -> Self {
        MetaValue::Array(v)
    }
}

impl From<Vec<MetaArray>> for MetaValue {
    fn from(v: Vec<MetaArray>) -> Self {
        MetaValue::Array(MetaArray::Array(v))
    }
}

/// An array: element type, first element's byte and the elements' count
/// or positions (kept small: a nested array takes 12 bytes of file).
#[derive(Debug)]
pub(crate) struct ArrNode {
    pub elem: ValueType,
    pub pos: usize,
    pub items: Items,
}

impl ArrNode {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match &self.items {
            Items::Fixed(n) => *n,
            Items::Strings(s) => s.len(),
            Items::Arrays(a) => a.len(),
        }
    }
}

/// Element positions of an array.
#[derive(Debug)]
pub(crate) enum Items {
    /// This many fixed-size elements, at `pos + i · size`.
    Fixed(usize),
    /// Byte of each string's length prefix.
    Strings(Box<[usize]>),
    /// Each inner array.
    Arrays(Box<[ArrNode]>),
}
