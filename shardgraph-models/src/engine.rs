//! The main job in one call: a target and its drafter loaded from GGUF onto
//! [`shardgraph::split::Devices`], caches sized from one context size, and
//! generation with a sampler.
