//! Where the set-up puts llama.cpp's source and tools (for the tests).
#![cfg(test)]

use std::path::PathBuf;

/// The cache folder of `scripts/setup.sh` (`$SHARDGRAPH_CACHE`, default
/// `~/.cache/shardgraph`).
pub(crate) fn cache() -> Option<PathBuf> {
    std::env::var_os("SHARDGRAPH_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/shardgraph")))
}

/// The llama.cpp tree of the llama-cpp-python 0.3.36 source distribution.
pub(crate) fn llama_src() -> Option<PathBuf> {
    let d = cache()?.join("llama_cpp_python-0.3.36/vendor/llama.cpp");
    d.join("ggml/src/ggml-backend-impl.h").is_file().then_some(d)
}
