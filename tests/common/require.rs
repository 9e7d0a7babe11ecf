//! The tools a test may find missing, one environment variable each: with
//! the variable set (to any value; `.ci/run` and `scripts/gpu-check.sh run`
//! set them to 1) a test that cannot run for want of the tool fails, naming
//! the tool, the variable and why; without it the test prints
//! `<test>: SKIPPED: <why>` and passes.
//!
//! | tool | variable | what needs it |
//! |---|---|---|
//! | the ggml oracle (`.venv`: ggml 0.15.3, llama-cpp-python's 0.25.3, gguf) | `SHARDGRAPH_REQUIRE_GGML` | ggml_diff, props, alloc, quant_bytes, gguf, llama_cpp |
//! | NVRTC (the `nvidia-cuda-nvrtc` wheel or a CUDA toolkit) | `SHARDGRAPH_REQUIRE_NVRTC` | cuda_kernels |
//! | `hipcc` on `PATH` | `SHARDGRAPH_REQUIRE_HIPCC` | hip_kernels (hipcc) |
//! | hipRTC (ROCm's run-time compiler) | `SHARDGRAPH_REQUIRE_HIPRTC` | hip_kernels (hipRTC) |
//! | a C++ compiler (`c++`) and binutils' `nm` | `SHARDGRAPH_REQUIRE_CXX` | shardgraph-capi's c_api |
//! | llama.cpp's source and tools (`scripts/setup.sh` builds them from the llama-cpp-python 0.3.36 source, cached in `~/.cache/shardgraph`) | `SHARDGRAPH_REQUIRE_LLAMA_TOOLS` | shardgraph-ggml's layout and ggml_backend tests |
//! | a GPU | `SHARDGRAPH_REQUIRE_GPU` | cuda_backend, cuda_kernels, hip_backend, the split tests on GPU devices, the cuda bench |
#![allow(dead_code)]

/// A tool some test needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tool {
    /// The ggml libraries and Python packages in `.venv`.
    Ggml,
    /// NVRTC, the CUDA run-time compiler.
    Nvrtc,
    /// ROCm's `hipcc`.
    Hipcc,
    /// hipRTC, ROCm's run-time compiler.
    Hiprtc,
    /// A C++ compiler (`c++`) and `nm`.
    Cxx,
    /// llama.cpp's source tree and its built tools (`test-backend-ops`, …).
    LlamaTools,
    /// A GPU the backend opens.
    Gpu,
}

impl Tool {
    /// The environment variable that makes the tool required.
    pub fn var(self) -> &'static str {
        match self {
            Tool::Ggml => "SHARDGRAPH_REQUIRE_GGML",
            Tool::Nvrtc => "SHARDGRAPH_REQUIRE_NVRTC",
            Tool::Hipcc => "SHARDGRAPH_REQUIRE_HIPCC",
            Tool::Hiprtc => "SHARDGRAPH_REQUIRE_HIPRTC",
            Tool::Cxx => "SHARDGRAPH_REQUIRE_CXX",
            Tool::LlamaTools => "SHARDGRAPH_REQUIRE_LLAMA_TOOLS",
            Tool::Gpu => "SHARDGRAPH_REQUIRE_GPU",
        }
    }

    /// The tool's name in messages.
    pub fn name(self) -> &'static str {
        match self {
            Tool::Ggml => "the ggml oracle",
            Tool::Nvrtc => "NVRTC",
            Tool::Hipcc => "hipcc",
            Tool::Hiprtc => "hipRTC",
            Tool::Cxx => "a C++ compiler (`c++`) or binutils' `nm`",
            Tool::LlamaTools => "llama.cpp's source and tools (scripts/setup.sh)",
            Tool::Gpu => "a GPU",
        }
    }

    /// True when the tool's variable is set: a missing tool is a failure.
    pub fn required(self) -> bool {
        std::env::var_os(self.var()).is_some()
    }
}

/// Called where `test` cannot run (or cannot run part `what` of itself)
/// because `tool` is missing, for the reason `why`.
///
/// # Panics
/// When the tool's variable is set: a failure naming the test, the tool,
/// the variable and `why`.
pub fn missing(tool: Tool, test: &str, why: &dyn std::fmt::Display) {
    assert!(!tool.required(), "{test}: {} is set but {} is missing: {why}", tool.var(), tool.name());
    println!("{test}: SKIPPED: {} is missing: {why} (set {} to make this a failure)", tool.name(), tool.var());
}

/// `r`'s value, or `None` after [`missing`] (which fails when the tool is
/// required).
pub fn or_skip<T, E: std::fmt::Display>(tool: Tool, test: &str, r: Result<T, E>) -> Option<T> {
    match r {
        Ok(v) => Some(v),
        Err(e) => {
            missing(tool, test, &e);
            None
        }
    }
}
