//! Graph arena, `build_forward` and the graph allocator.

pub mod alloc;
mod context;
mod forward;

pub use alloc::{AllocStats, GraphAllocator, Placement};
pub use context::{Context, MAX_ELEMENTS};
pub use forward::Graph;
