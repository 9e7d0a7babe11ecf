//! The graph allocator (ggml's `gallocr`): see the module's constructors.
