//! Fuzzes the GGUF reader: arbitrary bytes must parse or fail with an
//! error, never panic, hang or allocate beyond what the input justifies;
//! whatever parses must answer every accessor without panicking.
//!
//! Run with `cargo +nightly fuzz run gguf_read` from the repository root
//! (seed the corpus with any `.gguf` files, e.g. from `tests/gguf.rs`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use shardgraph::gguf::{GgufFile, Value};

fn walk(v: Value<'_>) -> usize {
    match v {
        Value::Array(a) => {
            let _ = a.to_owned_array();
            1 + a.iter().map(walk).sum::<usize>()
        }
        Value::String(s) => s.len(),
        _ => 1,
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(f) = GgufFile::from_bytes(data, "fuzz") else { return };
    let mut n = 0usize;
    for (k, v) in f.kvs() {
        n += walk(v);
        let _ = v.to_owned_value();
        let _ = (f.get_u32(k), f.get_str(k), f.get_uint(k), f.get_arr_str(k), f.get_arr_f32(k));
    }
    for t in f.iter_tensors() {
        assert_eq!(t.data.len(), t.info.nbytes);
        assert!(t.file_offset + t.data.len() <= f.len());
        n += t.data.first().copied().unwrap_or(0) as usize;
        let _ = f.tensor(&t.info.name).expect("tensor by name");
    }
    std::hint::black_box(n);
});
