//! Model graphs built from the crate's ops, with llama.cpp's tensor names,
//! GGUF keys and `--split-mode tensor` policy (MODELS.md), and a runner that
//! decodes them on N devices.
//!
//! * [`qwen3`]: the `qwen3` dense target.
//! * [`qwen35`]: the `qwen35` hybrid target (gated attention + Gated DeltaNet).
//! * [`dflash`]: the DFlash block-diffusion drafter's graphs.
//! * [`mtp`]: the `qwen35` target's native MTP (NextN) drafter.
//! * [`generate`]: GGUF files with seeded weights for the tests and examples.
//! * [`policy`]: llama.cpp's split states for these tensors.
//! * [`runner`]: per-step graphs over long-lived weights and caches, planned
//!   (cached) and executed on N CPU devices.
//! * [`speculative`]: draft, verify in one target batch, accept, roll back.

pub mod dflash;
pub mod generate;
pub mod mtp;
pub mod policy;
pub mod qwen3;
pub mod qwen35;
pub mod runner;
pub mod speculative;

/// Checks a GGUF's `general.architecture` and returns a reader of its
/// unsigned `{arch}.{key}` values (llama.cpp's per-architecture keys).
///
/// # Errors
/// [`crate::Error::Model`] for another architecture; [`crate::Error::Gguf`]
/// if the key is missing.
pub(crate) fn arch_keys<'a>(
    f: &'a crate::gguf::GgufFile,
    arch: &'a str,
) -> crate::Result<impl Fn(&str) -> crate::Result<u64> + 'a> {
    let found = f.get_str("general.architecture")?;
    if found != arch {
        return Err(crate::Error::Model { detail: format!("general.architecture is {found:?}, not {arch:?}") });
    }
    Ok(move |k: &str| f.get_uint(&format!("{arch}.{k}")))
}
