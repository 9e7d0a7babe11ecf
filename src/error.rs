//! Typed errors. Every public function that takes caller input returns
//! [`Result`]; nothing a caller can pass makes the crate panic.

use crate::tensor::GgmlType;

/// The crate's error type.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum Error {
    /// An op constructor rejected its operands. `op` is ggml's op name
    /// (`"mul_mat"`, `"rope_ext"`, …), `operand` names the offending input
    /// (`"src0"`, `"mask"`, …), `detail` gives the shapes/types involved.
    #[error("{op}: invalid {operand}: {detail}")]
    InvalidOperand {
        /// ggml op name.
        op: &'static str,
        /// Which operand is wrong.
        operand: &'static str,
        /// Shapes and types, in ggml order (`ne[0]` first).
        detail: String,
    },
    /// A tensor id that does not belong to this context (or is out of range).
    #[error("tensor id {id} does not belong to context {ctx} ({detail})")]
    ForeignTensor {
        /// The raw id.
        id: u32,
        /// The context that was asked.
        ctx: u32,
        /// What was being done.
        detail: String,
    },
    /// A shape that is not valid for a tensor (negative extents, overflow).
    #[error("invalid shape {ne:?}: {detail}")]
    InvalidShape {
        /// The rejected `ne`.
        ne: Vec<i64>,
        /// Why.
        detail: String,
    },
    /// A type id that ggml does not define, or a type an operation cannot handle.
    #[error("unsupported type {ty}: {detail}")]
    UnsupportedType {
        /// Type name.
        ty: String,
        /// Why.
        detail: String,
    },
    /// A view or byte range outside its source's storage.
    #[error("out of bounds: {detail}")]
    OutOfBounds {
        /// Offsets and sizes in bytes.
        detail: String,
    },
    /// Tensor data access on a tensor that has no storage yet.
    #[error("tensor {name:?} has no storage: {detail}")]
    NoStorage {
        /// Tensor name (may be empty).
        name: String,
        /// Why.
        detail: String,
    },
    /// Buffer data of the wrong length or type for a tensor.
    #[error("data mismatch for tensor {name:?}: {detail}")]
    DataMismatch {
        /// Tensor name (may be empty).
        name: String,
        /// Expected and given sizes.
        detail: String,
    },
    /// A backend cannot run an op (type or layout combination it lacks).
    #[error("backend {backend} does not support {op} ({detail})")]
    UnsupportedOp {
        /// Backend name.
        backend: String,
        /// Op name.
        op: &'static str,
        /// Types/shapes.
        detail: String,
    },
    /// An allocation request the backend cannot satisfy.
    #[error("allocation failed: {detail}")]
    Alloc {
        /// Sizes in bytes.
        detail: String,
    },
    /// A graph that cannot be built (a cycle, no outputs, …).
    #[error("graph: {detail}")]
    Graph {
        /// Why.
        detail: String,
    },
    /// A split state or split policy that cannot be honoured (extents that do
    /// not cover the axis, a quantized row split off block boundaries, …);
    /// the message names the tensor and the rule.
    #[error("split: {detail}")]
    Split {
        /// What and why.
        detail: String,
    },
    /// A GGUF file that cannot be read or written (bad magic or version,
    /// truncated or out-of-range data, a metadata value of another type than
    /// asked for, a tensor that is not where its info says, an I/O failure).
    /// `file` is the path (or the name given for an in-memory file);
    /// `detail` names the key or tensor and what is wrong.
    #[error("gguf {file}: {detail}")]
    Gguf {
        /// Path or name of the file.
        file: String,
        /// The key or tensor involved and why it was rejected.
        detail: String,
    },
    /// A model that cannot be built or run as asked: inconsistent
    /// hyper-parameters, a missing or mis-shaped tensor, a drafter made for
    /// another target, a cache too small (`detail` names the parameter).
    #[error("model: {detail}")]
    Model {
        /// The parameter or tensor involved and why.
        detail: String,
    },
    /// The CUDA backend: a missing library or device, a kernel that does
    /// not compile (`detail` names the kernel file, architecture and
    /// NVRTC's log), a failed launch or allocation.
    #[error("cuda: {detail}")]
    Cuda {
        /// The device, kernel or library involved and why.
        detail: String,
    },
    /// The HIP backend (AMD GPUs): a missing runtime, hipRTC or GPU, a
    /// kernel that does not compile (`detail` names the kernel file, the
    /// `gfx` architecture and hipRTC's log), a failed launch or allocation.
    #[error("hip: {detail}")]
    Hip {
        /// The device, kernel or library involved and why.
        detail: String,
    },
    /// Memory a device does not have, found before anything is allocated:
    /// `device` names it (CPU devices share the host's memory), `detail`
    /// says what needs the memory (weights, KV caches of N cells).
    #[error("{device}: {detail} need {needed} bytes, {available} bytes are available")]
    OutOfMemory {
        /// The device by its rank and name (`device 1 (CUDA0)`), or for CPU
        /// devices, which share the host's memory, all of them (`devices
        /// 0+1 (CPU0+CPU1, host memory)`).
        device: String,
        /// What needs the memory.
        detail: String,
        /// Bytes needed.
        needed: u64,
        /// Bytes available.
        available: u64,
    },
    /// A backend failure during compute (including a kernel that panicked;
    /// the panic is contained and reported here).
    #[error("compute failed: {detail}")]
    Compute {
        /// Why.
        detail: String,
    },
}

/// Result alias used across the crate.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Shorthand for [`Error::InvalidOperand`].
    pub(crate) fn operand(op: &'static str, operand: &'static str, detail: impl Into<String>) -> Self {
        Error::InvalidOperand { op, operand, detail: detail.into() }
    }

    /// Shorthand for [`Error::UnsupportedType`].
    pub(crate) fn unsupported_type(ty: GgmlType, detail: impl Into<String>) -> Self {
        Error::UnsupportedType { ty: ty.name().to_string(), detail: detail.into() }
    }
}
