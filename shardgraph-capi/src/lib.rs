//! The C ABI of shardgraph (`include/shardgraph.h`).
#![deny(missing_docs)]
