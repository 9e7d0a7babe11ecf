//! Fuzzes whole model loading: the input is a GGUF file, loaded as the
//! examples load one (and as `tests/common/hostile.rs::load` does, minus
//! the decode step): parse, hyper-parameters, every tensor checked against
//! the file, placement on 2 CPU devices (ratios 1,1, a 256-cell F16 KV
//! cache), load. `general.architecture` picks the loader: `qwen35` (then
//! the MTP drafter when the file has its layer), `dflash` (attached to a
//! session of the generated qwen3 base), anything else the qwen3 loader.
//! An `Err` is fine; a panic (debug assertions on with `-a`: integer
//! overflow too), an abort or a hang is a crash.
//!
//! The seeds are mostly tensor data, which every loader copies without
//! looking at, so 7 mutations in 8 edit only the part before the data (the
//! header, metadata and tensor infos, up to the data offset when the input
//! parses, else its first 8 KiB); the tail is kept as it is.
//!
//! Seeds: `cargo run --manifest-path fuzz/Cargo.toml --example seeds`
//! (the three base files of `hostile::bases()`), then
//! `cargo +nightly fuzz run -a model_load fuzz/corpus/model_load -- -dict=fuzz/model_load.dict`.
#![no_main]

#[path = "../../tests/common/hostile.rs"]
mod hostile;

use libfuzzer_sys::{fuzz_mutator, fuzz_target, fuzzer_mutate};
use shardgraph::gguf::GgufFile;
use std::sync::OnceLock;

/// The three generated bases (qwen3, qwen35, dflash), generated once; the
/// qwen3 one is the target a `dflash` input is attached to.
fn bases() -> &'static [hostile::Base] {
    static B: OnceLock<Vec<hostile::Base>> = OnceLock::new();
    B.get_or_init(hostile::bases)
}

/// Loads the input as the hostile suite does, without its decode step.
fn load(bytes: &[u8]) -> shardgraph::Result<()> {
    hostile::load_with(bytes, &bases()[0].bytes, false)
}

fuzz_target!(
    init: {
        // The bases load, so a run starts from files that reach every check.
        for b in bases() {
            load(&b.bytes).unwrap_or_else(|e| panic!("base {} does not load: {e}", b.arch));
        }
    },
    |data: &[u8]| {
        let _ = std::hint::black_box(load(data));
    }
);

/// The bytes before the tensor data (all of a file that does not parse
/// past its first 8 KiB).
fn head_len(data: &[u8]) -> usize {
    GgufFile::from_bytes(data, "m").map_or(1 << 13, |f| f.data_offset()).min(data.len())
}

fuzz_mutator!(|data: &mut [u8], size: usize, max_size: usize, seed: u32| {
    if seed % 8 == 0 {
        return fuzzer_mutate(data, size, max_size);
    }
    let head = head_len(&data[..size]);
    let tail = data[head..size].to_vec();
    let room = (head + 4096).min(max_size - tail.len());
    let mut h = data[..head].to_vec();
    h.resize(room, 0);
    let n = fuzzer_mutate(&mut h, head, room);
    data[..n].copy_from_slice(&h[..n]);
    data[n..n + tail.len()].copy_from_slice(&tail);
    n + tail.len()
});
